"""`comsim run`: the loop on a recording of your own, into one run folder, ending in a report.

    comsim run --real data/my_pushes --twin configs/twin/panda_cell_push.yaml --task lab_push --out runs/mine

    twin calibrate + replay -> translator training -> factory generate (ID and OOD layouts)
      -> convert (pseudo-real) -> video metrics -> mix (real + pseudo-real) -> report

``--real`` is a LeRobotDataset from a real robot (with ``calibration/`` stills if it has them; else
the twin calibrates from the episodes' frames); ``--twin`` the twin's nominal cell that alignment
starts from; ``--task`` the factory's task program. It stops before the closed-loop policy
experiment, because there is no robot here to score a policy on, and says so in the report. Its
products: ``RUN/pseudo_real`` (the translated factory episodes) and ``RUN/mixed`` (the real episodes
plus pseudo-real ones at ``--synthetic-fraction``, which LeRobot's training scripts load as they are).
Every stage is skipped when its output is complete, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from comsim.config import ConfigError, config_file
from comsim.io.files import atomic_output
from comsim.io.lock import output_lock
from comsim.run_layout import (CONVERT, FACTORY, LAB_RECORD, MIX, POLICY, TRANSLATOR, TWIN, VIDEO_METRICS,
                               RunLayout)


@dataclass
class LoopSettings:
    """What the loop makes from a recording (``comsim run`` flags, a demo profile's part)."""
    sim_task: str = "lab_push"  # the factory's task program (its objects in the aligned twin's order and colours)
    sim_episodes: int = 20
    ood_sim_episodes: int = 6  # out-of-distribution layouts, converted too: object fidelity where no real cube was
    # the translator, trained for its config's own fixed number of steps (train.max_steps) unless
    # translator_steps: the model is the same on a fast and on a slow machine
    translator_config: str = "configs/translator/tiny_lab.yaml"
    translator_steps: int | None = None
    translator_overrides: tuple[str, ...] = ()  # dotted overrides of the translator config
    synthetic_fraction: float = 0.5  # of the mixed dataset's frames
    workers: int = 2  # processes of the twin replay, generation and conversion
    # a twin that fails its self-check: "refuse" (the twin stage fails, naming what it distrusts) or "mark"
    on_unreliable: str = "refuse"


class StageLog:
    """Runs stages in order: a failed stage is recorded and its dependants are skipped; ``write`` records
    what ran, failed, was left out and how long each took in ``stages.json`` (the report reads it)."""

    def __init__(self, run: RunLayout, log=None):
        self.run, self.timings, self.failures, self.left_out = run, {}, {}, {}
        self.log = log or (lambda msg: print(f"[comsim {time.strftime('%H:%M:%S')}] {msg}", flush=True))

    def step(self, name: str, fn, needs=()):
        missing = [n for n in needs if n in self.failures or n in self.left_out]
        if missing:
            self.failures[name] = f"skipped: needs {', '.join(missing)}"
            self.log(f"{name}: {self.failures[name]}")
            return None
        t = time.time()
        self.log(f"{name} ...")
        try:
            result = fn()
        except (ValueError, RuntimeError, FileNotFoundError) as e:
            self.failures[name] = f"{type(e).__name__}: {e}"
            self.log(f"{name} FAILED: {e}")
            return None
        self.timings[name] = round(time.time() - t, 1)
        self.log(f"{name} done in {self.timings[name]} s")
        return result

    def leave_out(self, name: str, why: str) -> None:
        self.left_out[name] = why

    def write(self, **extra) -> None:
        stages = {**extra, "timings": self.timings, "failures": self.failures}
        if self.left_out:
            stages["left_out"] = self.left_out
        summary_path = self.run.translator / "train_summary.json"
        if summary_path.is_file():  # steps done of planned: a translator that stopped early says so
            summary = json.loads(summary_path.read_text())
            stages["translator"] = {k: summary.get(k) for k in ("steps_done", "steps_planned", "stopped_early",
                                                                "stop_reason")}
        with atomic_output(self.run.stages) as tmp:
            tmp.write_text(json.dumps(stages, indent=1) + "\n")


def existing_config(path: str | Path, flag: str) -> Path:
    """A config file the user named (or a built-in one), as an absolute path."""
    p = config_file(path)
    if not p.is_file():
        raise ConfigError(f"{path}: {flag}: file not found (nor under the built-in configs/)")
    return p.resolve()


def run_loop(stages: StageLog, real: Path, twin: Path, s: LoopSettings, calibration=None, after=(),
             no_sim_reason: str = "no factory episodes asked for (sim_episodes 0)") -> None:
    """The loop's stages on the recording ``real`` into ``stages.run``: twin, translator, generate, convert,
    video metrics, mix. ``after``: stages the twin waits for (the demo's lab recording)."""
    from comsim.pipeline import stages as st

    run = stages.run
    stages.step(TWIN, lambda: st.align_twin(real, twin, run.paired, run.twin_summary, workers=s.workers,
                                            calibration=calibration, on_unreliable=s.on_unreliable), needs=after)
    model = stages.step(TRANSLATOR, lambda: st.train_translator(run.paired, run.translator,
                                                                config_file(s.translator_config),
                                                                s.translator_steps, s.translator_overrides),
                        needs=[TWIN])
    converted = {}
    if s.sim_episodes:
        # in the ALIGNED twin: the translator learned the calibrated camera and colours, not the nominal cell
        scene = run.paired / "twin_aligned.yaml"
        stages.step(FACTORY, lambda: (st.generate_sim(s.sim_task, s.sim_episodes, run.sim, scene, seed=1000,
                                                      workers=s.workers),
                                      s.ood_sim_episodes and st.generate_sim(s.sim_task, s.ood_sim_episodes,
                                                                             run.sim_ood, scene, seed=2000,
                                                                             split="ood", workers=s.workers)),
                    needs=[TWIN])
        stages.step(CONVERT, lambda: [st.convert_sim(model, sim, out, seed=0, workers=s.workers)
                                      for sim, out in ((run.sim, run.pseudo_real), (run.sim_ood, run.pseudo_real_ood))],
                    needs=[TRANSLATOR, FACTORY])
        converted = {"id": run.pseudo_real, "ood": run.pseudo_real_ood}
    else:
        for name in (FACTORY, CONVERT, MIX):
            stages.leave_out(name, no_sim_reason)
    stages.step(VIDEO_METRICS, lambda: st.video_metrics(model, run, converted),
                needs=[TRANSLATOR, CONVERT] if s.sim_episodes else [TRANSLATOR])
    if s.sim_episodes:
        stages.step(MIX, lambda: st.mix_datasets(real, run.pseudo_real, run.mixed, s.synthetic_fraction),
                    needs=[CONVERT])


def run_real(real, twin, out, settings: LoopSettings | None = None, calibration=None) -> Path:
    """``comsim run``: the loop on the real recording ``real`` (a LeRobotDataset) into ``out``; returns the
    report's path. Raises RuntimeError (after writing the report) if a stage failed."""
    from comsim.io.lerobot import LeRobotDataset

    s = settings or LoopSettings()
    real, out = Path(real).resolve(), Path(out)
    LeRobotDataset(real)  # a recording that does not read is refused before anything is written
    twin = existing_config(twin, "--twin")
    existing_config(s.translator_config, "--translator-config")
    with output_lock(out, "comsim run"):  # one run per folder; each stage also locks its own output
        return _run_real(real, twin, out, s, calibration)


def _run_real(real: Path, twin: Path, out: Path, s: LoopSettings, calibration) -> Path:
    from comsim.report.run import build_report

    stages = StageLog(RunLayout(out))
    stages.leave_out(LAB_RECORD, f"the recording was given: {real}")
    run_loop(stages, real, twin, s, calibration)
    stages.leave_out(POLICY, "no robot to score a policy on: train one on RUN/mixed with LeRobot and score it "
                             "on your robot (`comsim demo` runs the closed-loop experiment in the lab)")
    stages.write(command="comsim run", real=str(real), twin=str(twin), task=s.sim_task)
    report = build_report(out, title=f"ComSim run: {real.name}")
    stages.log(f"report: {report.resolve()}")
    if stages.failures:
        raise RuntimeError(f"run finished with failed stages (see the report {report.resolve()}): "
                           + "; ".join(f"{k}: {v}" for k, v in stages.failures.items()))
    return report.resolve()
