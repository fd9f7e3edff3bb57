"""`comsim demo` / `make demo`: the lab's recording, then `comsim run` on it, then the policy experiment.

    lab record -> twin calibrate + replay (paired) -> translator training (tiny)
      -> factory generate (sim) -> convert (pseudo-real) -> video metrics -> mix
      -> policy experiment -> HTML report

    comsim demo --out runs/demo                                          # the built-in lab
    comsim demo --cell configs/lab/cool_studio.yaml --out runs/demo_cool # another cell (look, camera)
    comsim demo --profile lab_table --out runs/lab_table                 # the deciding table (lab_table.yaml)

Every stage writes into the run folder ``out`` (``comsim.run_layout.RunLayout``) and is skipped
when its output is complete, so an interrupted demo resumes where it stopped. Configs are
found from the package (``comsim.config.config_file``), so the demo runs from any working
directory. ``--cell`` records the lab episodes in that cell and scores the policies there; the
twin starts from its nominal spec (``--twin``, default configs/twin/panda_cell_push.yaml) and
must find the cell's camera and colours itself. ``profile="full"`` runs the experiment at the
sizes of the Compositional Simulation table (hours on a GPU machine).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from comsim.config import PANDA_PUSH_CELL, ConfigError, config_file
from comsim.errors import InputError
from comsim.io.lock import output_lock
from comsim.pipeline.run import LoopSettings, StageLog, existing_config, run_loop
from comsim.run_layout import LAB_RECORD, POLICY, RunLayout


@dataclass
class DemoProfile:
    task: str = "push"  # the lab task recorded
    real_episodes: int = 10
    calibration_stills: int = 12  # recorded with the lab episodes; the twin calibrates from them
    # the loop on the lab's recording; its factory program is the lab's push (its cubes in the aligned twin's
    # colours, its target), so the pseudo-real episodes show the task the lab's policy is scored on
    loop: LoopSettings = field(default_factory=LoopSettings)
    policy_experiment: str = "configs/experiments/demo_small.yaml"
    policy_overrides: tuple[str, ...] = ()  # dotted overrides of the policy experiment config
    cell: str | None = None  # the lab cell YAML (None: the built-in lab, configs/lab/default.yaml)
    # the twin's nominal spec, which the alignment starts from: the lab's cell with the push task's target
    # sticker (configs/twin/panda_cell.yaml, without it, for a task that has none)
    twin: str = str(PANDA_PUSH_CELL)


PROFILES = {
    "small": DemoProfile(),
    # The deciding table on 2 CPU cores from an empty folder: the demo's stages make the twin and the
    # translator from 10 lab demonstrations; configs/experiments/lab_table.yaml then records its own lab
    # demonstrations, generates and converts its 200 sim episodes in this run's twin, and trains and
    # scores every arm (under OUT/policy/). The demo's own factory episodes are not made here (the
    # experiment makes its 200, and the 2-hour budget has no room for both).
    "lab_table": DemoProfile(policy_experiment="configs/experiments/lab_table.yaml",
                             loop=LoopSettings(sim_episodes=0, ood_sim_episodes=0)),
    "full": DemoProfile(loop=LoopSettings(sim_episodes=200, ood_sim_episodes=50,
                                          translator_config="configs/translator/small.yaml", translator_steps=20000),
                        policy_experiment="configs/experiments/compsim_table.yaml"),
}


def run_demo(out: Path, profile: str | DemoProfile = "small", cell: str | Path | None = None,
             twin: str | Path | None = None, seeds: list[int] | None = None, on_unreliable: str | None = None) -> Path:
    """Run the loop into the folder ``out``; returns the report's path. ``profile``: a name of PROFILES
    or a DemoProfile; ``cell`` and ``twin`` (YAML paths) replace the profile's; ``seeds``: the policy
    experiment's training seeds (its config's ``seeds``); ``on_unreliable``: replaces the profile's
    ``loop.on_unreliable`` (a twin that fails its self-check: "refuse" stops the loop at the twin stage,
    "mark" replays and marks the episodes concerned)."""
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ConfigError(f"demo profile {profile!r}: expected one of {sorted(PROFILES)}")
        p, profile_name = PROFILES[profile], profile
    else:
        p, profile_name = profile, "custom"
    from comsim.twin.selfcheck import ON_UNRELIABLE

    if on_unreliable is not None and on_unreliable not in ON_UNRELIABLE:
        raise InputError(None, "--on-unreliable", f"one of {ON_UNRELIABLE}", on_unreliable)
    p = replace(p, cell=str(existing_config(cell, "--cell")) if cell is not None else p.cell,
                loop=p.loop if on_unreliable is None else replace(p.loop, on_unreliable=on_unreliable),
                twin=str(existing_config(twin, "--twin")) if twin is not None else p.twin,
                policy_overrides=(*p.policy_overrides, *([f"seeds=[{','.join(map(str, seeds))}]"] if seeds else [])))
    out = Path(out)
    with output_lock(out, "comsim demo"):  # one run per folder; each stage also locks its own output
        return _run_demo(out, p, profile_name)


def _run_demo(out: Path, p: DemoProfile, profile_name: str) -> Path:
    from comsim.pipeline import stages as st
    from comsim.report.run import build_report

    run = RunLayout(out)
    stages = StageLog(run, log=lambda msg: print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True))
    stages.step(LAB_RECORD, lambda: st.record_lab(run.lab, p.task, p.real_episodes, seed=0, cell=p.cell,
                                                  calibration_stills=p.calibration_stills))
    run_loop(stages, run.lab, config_file(p.twin), p.loop, after=[LAB_RECORD],
             no_sim_reason="the policy experiment generates and converts its own sim episodes (under policy/data/)")
    stages.step(POLICY, lambda: _policy(p, run), needs=[LAB_RECORD])
    stages.write(profile=profile_name, cell=p.cell or "built-in lab", twin=p.twin)
    report = build_report(out, title="ComSim demo: the lab, end to end")
    stages.log(f"report: {report.resolve()}")
    if stages.failures:
        raise RuntimeError(f"demo finished with failed stages (see the report {report.resolve()}): "
                           + "; ".join(f"{k}: {v}" for k, v in stages.failures.items()))
    return report.resolve()


def _policy(p: DemoProfile, run: RunLayout) -> dict:
    from comsim.pipeline.experiment import run_experiment

    path, datasets, overrides = experiment_inputs(p, run)
    return run_experiment(path, run.policy, datasets=datasets, overrides=overrides)


def experiment_inputs(p: DemoProfile, run: RunLayout) -> tuple[Path, dict[str, Path], list[str]]:
    """The policy experiment's config file, dataset paths and overrides for this run folder.

    Every dataset of the experiment lives in this run folder: the demo's own (lab, sim, pseudo-real),
    the others under policy/data/; those it builds use this run's aligned twin and translator."""
    from comsim.config import load_yaml

    path = config_file(p.policy_experiment)
    given = {"real": run.lab, "sim": run.sim, "pseudo_real": run.pseudo_real}
    datasets, overrides = {}, [f"cell={p.cell}"] if p.cell else []
    for name, spec in (load_yaml(path).get("datasets") or {}).items():
        datasets[name] = given.get(name, run.policy / "data" / name)
        build = spec.get("build") if isinstance(spec, dict) else None
        if build == "factory":
            overrides.append(f"datasets.{name}.scene={(run.paired / 'twin_aligned.yaml').resolve()}")
        elif build in ("demo_derived", "compose"):
            overrides.append(f"datasets.{name}.paired={run.paired.resolve()}")
        elif build == "convert":
            overrides.append(f"datasets.{name}.translator={run.translator_final.resolve()}")
    return path, datasets, [*overrides, *p.policy_overrides]


def demo_summary(out: Path, report: Path) -> dict:
    """The one-line JSON a demo ends with: the report, and the policy table's success rates and claim."""
    results = RunLayout(out).experiment.results
    summary: dict = {"report": str(report)}
    if results.is_file():
        doc = json.loads(results.read_text())
        summary["results"] = str(results.resolve())
        summary["success_rate"] = {a["name"]: {k: v["success_rate"] for k, v in a["panels"].items()}
                                   for a in doc["arms"] if a["status"] == "done"}
        summary["gap_closed"] = doc.get("gap_closed") or None
        summary["claim_holds"] = (doc.get("claim") or {}).get("holds")
    return summary
