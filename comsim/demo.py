"""`comsim demo` / `make demo`: the whole loop on a lab cell, at small scale, ending in a report.

    lab record -> twin calibrate + replay (paired) -> translator training (tiny)
      -> factory generate (sim) -> convert (pseudo-real) -> video metrics
      -> policy experiment -> HTML report

    comsim demo --out runs/demo                                          # the built-in lab
    comsim demo --cell configs/lab/cool_studio.yaml --out runs/demo_cool # another cell (look, camera)
    comsim demo --profile lab_table --out runs/lab_table                 # the deciding table (lab_table.yaml)

Every step writes into the run folder ``out`` (``comsim.run_layout.RunLayout``) and is skipped
when its output is complete, so an interrupted demo resumes where it stopped. Configs are
found from the package (``comsim.config.config_file``), so the demo runs from any working
directory; every output lands under ``out``. ``--cell`` records the lab episodes in that cell
and scores the policies there; the twin starts from its nominal spec (``--twin``, default
configs/twin/panda_cell_push.yaml) and must find the cell's camera and colours itself.
``profile="full"`` runs the experiment at the sizes of the Compositional Simulation table
(hours on a GPU machine).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from comsim.config import PANDA_PUSH_CELL, ConfigError, config_file
from comsim.io.files import write_json
from comsim.io.keys import control_key, seg_key, sim_key
from comsim.io.lerobot import LeRobotDataset
from comsim.io.video import atomic_output
from comsim.report.run import build_report
from comsim.run_layout import CONVERT, FACTORY, LAB_RECORD, POLICY, TRANSLATOR, TWIN, VIDEO_METRICS, RunLayout
from comsim.workers import torch_threads


@dataclass
class DemoProfile:
    task: str = "push"  # the lab task recorded
    # the factory program of the sim episodes: the lab's push (its cubes in the aligned twin's colours,
    # its target), so the pseudo-real episodes show the task the lab's policy is scored on
    sim_task: str = "lab_push"
    real_episodes: int = 10
    sim_episodes: int = 20
    ood_sim_episodes: int = 6  # out-of-distribution layouts, converted too: object fidelity where no real cube was
    # The CPU translator for lab pairs at the camera's 128x128, trained for its own fixed number of steps
    # (train.max_steps): the demo's model is the same on a fast and on a slow machine.
    translator_config: str = "configs/translator/tiny_lab.yaml"
    translator_steps: int | None = None  # None: the config's train.max_steps
    policy_experiment: str = "configs/experiments/demo_small.yaml"
    cell: str | None = None  # the lab cell YAML (None: the built-in lab, configs/lab/default.yaml)
    # the twin's nominal spec, which the alignment starts from: the lab's cell with the push task's target
    # sticker (configs/twin/panda_cell.yaml, without it, for a task that has none)
    twin: str = str(PANDA_PUSH_CELL)
    # dotted overrides of the translator and policy experiment configs (e.g. tiny sizes for a smoke run)
    translator_overrides: tuple[str, ...] = ()
    policy_overrides: tuple[str, ...] = ()
    calibration_stills: int = 12  # recorded with the lab episodes; the twin calibrates from them


PROFILES = {
    "small": DemoProfile(),
    # The deciding table on 2 CPU cores from an empty folder: the demo's stages make the twin and the
    # translator from 10 lab demonstrations; configs/experiments/lab_table.yaml then records its own lab
    # demonstrations, generates and converts its 200 sim episodes in this run's twin, and trains and
    # scores every arm (under OUT/policy/).
    # The demo's own factory episodes and their conversion are not made here (sim_episodes 0): the experiment
    # generates and converts its 200, and the 2-hour budget has no room for both; the video-metrics stage
    # scores the held-out pairs. bench/translator_variant.py makes the demo's factory episodes when it needs them.
    "lab_table": DemoProfile(policy_experiment="configs/experiments/lab_table.yaml", sim_episodes=0,
                             ood_sim_episodes=0),
    "full": DemoProfile(real_episodes=10, sim_episodes=200, ood_sim_episodes=50,
                        translator_config="configs/translator/small.yaml", translator_steps=20000,
                        policy_experiment="configs/experiments/compsim_table.yaml"),
}


def _done(path: Path) -> bool:
    return (path / "meta" / "info.json").is_file()


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_demo(out: Path, profile: str | DemoProfile = "small", cell: str | Path | None = None,
             twin: str | Path | None = None) -> Path:
    """Run the loop into the folder ``out``; returns the report's path. ``profile``: a name of PROFILES
    or a DemoProfile; ``cell`` and ``twin`` (YAML paths) replace the profile's."""
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ConfigError(f"demo profile {profile!r}: expected one of {sorted(PROFILES)}")
        p = PROFILES[profile]
        profile_name = profile
    else:
        p, profile_name = profile, "custom"
    p = replace(p, cell=str(_existing(cell, "--cell")) if cell is not None else p.cell,
                twin=str(_existing(twin, "--twin")) if twin is not None else p.twin)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}

    def step(name, fn, needs=()):
        # A failed stage is reported, its dependants are skipped, and the report is still written.
        missing = [n for n in needs if n in failures]
        if missing:
            failures[name] = f"skipped: needs {', '.join(missing)}"
            _log(f"{name}: {failures[name]}")
            return None
        t = time.time()
        _log(f"{name} ...")
        try:
            result = fn()
        except (ValueError, RuntimeError, FileNotFoundError) as e:
            failures[name] = f"{type(e).__name__}: {e}"
            _log(f"{name} FAILED: {e}")
            return None
        timings[name] = round(time.time() - t, 1)
        _log(f"{name} done in {timings[name]} s")
        return result

    run = RunLayout(out)
    step(LAB_RECORD, lambda: _lab(run.lab, p))
    step(TWIN, lambda: _twin(run.lab, run.paired, run.twin_summary, p), needs=[LAB_RECORD])
    model_dir = step(TRANSLATOR, lambda: _translator(run.paired, run.translator, p), needs=[TWIN])
    # In the ALIGNED twin: the translator learned the calibrated camera and colours, not the nominal cell.
    if p.sim_episodes:
        step(FACTORY, lambda: _generate(run.sim, run.sim_ood, p, run.paired / "twin_aligned.yaml"), needs=[TWIN])
        step(CONVERT, lambda: _convert(model_dir, [(run.sim, run.pseudo_real), (run.sim_ood, run.pseudo_real_ood)]),
             needs=[TRANSLATOR, FACTORY])
    with torch_threads(1):  # the same numbers after the convert stage (which sets 1) as in a rerun that resumes here
        step(VIDEO_METRICS, lambda: _metrics(model_dir, run, {"id": run.pseudo_real, "ood": run.pseudo_real_ood}),
             needs=[TRANSLATOR, CONVERT] if p.sim_episodes else [TRANSLATOR])
    step(POLICY, lambda: _policy(p, run), needs=[LAB_RECORD])
    stages = {"profile": profile_name, "cell": p.cell or "built-in lab", "twin": p.twin, "timings": timings,
              "failures": failures}
    if not p.sim_episodes:
        why = "the policy experiment generates and converts its own sim episodes (under policy/data/)"
        stages["left_out"] = {FACTORY: why, CONVERT: why}
    summary_path = run.translator / "train_summary.json"
    if summary_path.is_file():  # steps done of planned: a translator that stopped early says so
        summary = json.loads(summary_path.read_text())
        stages["translator"] = {k: summary.get(k) for k in ("steps_done", "steps_planned", "stopped_early",
                                                            "stop_reason")}
    with atomic_output(run.stages) as tmp:  # the report builder reads what ran, failed, took how long
        tmp.write_text(json.dumps(stages, indent=1) + "\n")
    report = build_report(out, title="ComSim demo: the lab, end to end")
    _log(f"report: {report.resolve()}")
    if failures:
        raise RuntimeError(f"demo finished with failed stages (see the report {report.resolve()}): "
                           + "; ".join(f"{k}: {v}" for k, v in failures.items()))
    return report.resolve()


# -- steps ----------------------------------------------------------------------------------
def _existing(path: str | Path, flag: str) -> Path:
    """A config file the user named (or a built-in one), as an absolute path: the demo's stages and the
    policy experiment read it from other folders."""
    p = config_file(path)
    if not p.is_file():
        raise ConfigError(f"{path}: {flag}: file not found (nor under the built-in configs/)")
    return p.resolve()


def _lab(lab_dir: Path, p: DemoProfile) -> None:
    from comsim.lab.record import record_dataset

    if not _done(lab_dir):
        record_dataset(task=p.task, episodes=p.real_episodes, out=lab_dir, seed=0, cell=p.cell,
                       calibration_stills=p.calibration_stills)


def _twin(lab_dir: Path, paired_dir: Path, summary_path: Path, p: DemoProfile) -> dict:
    from comsim.twin.replay import replay_dataset

    if not _done(paired_dir) or not summary_path.is_file():
        replay_dataset(real=lab_dir, twin=config_file(p.twin), out=paired_dir, mode="physics", calibration=None,
                       workers=2)
        summary = {}
        report_path = paired_dir / "alignment_report.json"
        if report_path.is_file():
            summary = json.loads(report_path.read_text())
        write_json(summary, summary_path, indent=1)
    return json.loads(summary_path.read_text())


def _translator(paired_dir: Path, run_dir: Path, p: DemoProfile) -> Path:
    from comsim.translator.training import load_train_config, train

    final = run_dir / "final"
    if (final / "translator.json").is_file():
        return final
    n = len(LeRobotDataset(paired_dir))
    steps = [f"train.max_steps={p.translator_steps}"] if p.translator_steps else []
    cfg = load_train_config(config_file(p.translator_config), [
        f"data.paths=[{paired_dir}]", f"data.val_episodes={_val_episodes(n)}", f"train.output_dir={run_dir}",
        *steps, "train.checkpointing_steps=100", *p.translator_overrides])
    result = train(cfg, resume_from_checkpoint="latest" if any(run_dir.glob("checkpoint-*")) else None)
    return Path(result) if result else final


# the twin's labels (seg) ride along: object fidelity compares the converted frames with them; the surface
# normals (normal) are what the translator is conditioned on besides the render (configs/translator/tiny_lab.yaml)
SIM_CONTROLS = ("seg", "normal")


def _generate(sim_dir: Path, ood_dir: Path, p: DemoProfile, scene: Path) -> None:
    from comsim.factory.generate import generate_dataset

    if not _done(sim_dir):
        generate_dataset(p.sim_task, p.sim_episodes, sim_dir, workers=2, seed=1000, scene=scene, controls=SIM_CONTROLS)
    if p.ood_sim_episodes and not _done(ood_dir):
        generate_dataset(p.sim_task, p.ood_sim_episodes, ood_dir, workers=2, seed=2000, split="ood", scene=scene,
                         controls=SIM_CONTROLS)


def _convert(model_dir: Path, jobs: list[tuple[Path, Path]]) -> None:
    from comsim.convert import convert_dataset

    for sim_dir, pseudo_dir in jobs:
        if _done(sim_dir) and not _done(pseudo_dir):
            convert_dataset(model_dir, sim_dir, pseudo_dir, workers=2, seed=0)  # the translator's own sampling


def _val_episodes(n: int) -> int:
    return max(1, n // 5)


def _heldout_indices(paired_dir: Path) -> list[int]:
    from comsim.translator.data import split_episodes

    _, val = split_episodes([len(LeRobotDataset(paired_dir))], _val_episodes(len(LeRobotDataset(paired_dir))))
    return [e for _, e in val]  # the translator's validation episodes


def _metrics(model_dir: Path, run: RunLayout, converted: dict) -> dict:
    """Translate the held-out paired episodes and score them (and raw sim) against the lab frames; object
    fidelity of those and of the converted factory episodes (in- and out-of-distribution layouts)."""
    metrics_path, paired_dir = run.metrics, run.paired
    if metrics_path.is_file():
        return json.loads(metrics_path.read_text())
    from comsim.io.lerobot import DatasetWriter
    from comsim.metrics.evaluate import evaluate_video
    from comsim.metrics.fidelity import evaluate_object_fidelity, fit_fidelity_model
    from comsim.translator.pipeline import TranslatorPipeline

    pipe = TranslatorPipeline.from_pretrained(model_dir)
    ds = LeRobotDataset(paired_dir)
    cam = pipe.camera
    H, W = pipe.resolution
    seg = seg_key(cam)
    pseudo_dir, sim_dir, real_dir = (run.heldout_part(k) for k in ("pseudo", "sim_only", "real"))
    heldout = _heldout_indices(paired_dir)
    if not _done(pseudo_dir):
        from comsim.episode import resize_frames

        writers = {k: DatasetWriter(run.heldout_part(k), ds.fps) for k in ("pseudo", "sim_only", "real")}
        for j, i in enumerate(heldout):
            controls = [control_key(cam, c) for c in pipe.controls if control_key(cam, c) != seg]
            ep = ds.read_episode(i, cameras=[cam, sim_key(cam), seg, *controls])
            writers["pseudo"].add_episode(pipe.translate_episode(ep, seed=i), episode_index=j)
            # the raw twin render and the lab frames, at the translator's resolution, to score against
            sim = resize_frames(ep.frames[sim_key(cam)], (H, W))
            real = resize_frames(ep.frames[cam], (H, W))
            for k, frames in (("sim_only", sim), ("real", real)):
                ep_k = type(ep)(frames={cam: frames, seg: ep.frames[seg]}, action=ep.action, state=ep.state,
                                fps=ep.fps, task=ep.task, provenance=ep.provenance)
                writers[k].add_episode(ep_k, episode_index=j)
        for w in writers.values():
            w.close()
    opts = dict(camera=cam, metrics=["psnr", "ssim", "fid"])
    result = {"pseudo_real_vs_real": evaluate_video(pseudo_dir, real_dir, **opts),
              "raw_sim_vs_real": evaluate_video(sim_dir, real_dir, **opts)}
    # the locator is fit on the training pairs' real frames only (never the held-out or generated ones)
    model = fit_fidelity_model(ds, cam, [e for e in range(len(ds)) if e not in heldout], (H, W), progress=True)
    fidelity = {"heldout_real (locator ceiling)": evaluate_object_fidelity(real_dir, model, cam),
                "heldout_pseudo_real": evaluate_object_fidelity(pseudo_dir, model, cam)}
    for split, path in converted.items():
        if _done(path):
            fidelity[f"factory_pseudo_real_{split}"] = evaluate_object_fidelity(path, model, cam)
    result["object_fidelity"] = fidelity
    with atomic_output(metrics_path) as tmp:  # written whole: the file is this stage's "done" marker
        tmp.write_text(json.dumps(result, indent=1, default=str))
    return result


def _policy(p: DemoProfile, run: RunLayout) -> dict | None:
    try:
        from comsim.policy.experiment import run_experiment
    except ImportError:
        _log("policy experiment: comsim.policy is not available; skipped")
        return None
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
