"""The stages of a run, each a function over folders that skips what is already complete.

    record_lab        the lab's scripted teleoperation (+ calibration stills): the real stand-in
    align_twin        calibrate, localize, replay a real recording in the twin -> paired dataset
    train_translator  the translator on the paired dataset, a fixed number of steps, resumable
    generate_sim      factory episodes in the aligned twin (scripted programs)
    generate_demo_derived   episodes from the real demos' own segments, moved to new layouts (MimicGen-style)
    convert_sim       sim -> pseudo-real with a translator
    video_metrics     held-out pairs translated and scored (beside the raw twin and the baselines): frame
                      metrics, object crops, the robot region, object fidelity
    mix_datasets      real + pseudo-real at a chosen synthetic fraction, one LeRobot dataset

``comsim run`` (pipeline/run.py), ``comsim demo`` (pipeline/demo.py) and the policy experiment's
datasets (pipeline/experiment.py) are these functions called in order. Each returns its output and
does nothing when ``dataset_complete`` (or its own done-file) says the output is finished, so a run
resumes stage by stage.
"""
from __future__ import annotations

import json
from pathlib import Path

from comsim.io.files import atomic_output, write_json
from comsim.io.keys import control_key, seg_key, sim_key
from comsim.io.lerobot import DatasetWriter, LeRobotDataset, dataset_complete
from comsim.run_layout import RunLayout
from comsim.translator.sampling import SamplingParams
from comsim.workers import torch_threads

# the twin's labels (seg) ride along with every render: object fidelity compares converted frames with them;
# the surface normals (normal) condition the translator besides the render (configs/translator/tiny_lab.yaml)
SIM_CONTROLS = ("seg", "normal")


def record_lab(out, task: str, episodes: int, seed: int = 0, cell=None, calibration_stills: int = 0,
               resume: bool = True) -> Path:
    """``episodes`` scripted lab demonstrations of ``task`` in ``cell`` (a LabCell, a YAML path or None for the
    built-in lab), with ``calibration_stills`` stills for the twin's camera calibration."""
    from comsim.lab.record import record_dataset

    if not dataset_complete(out):
        record_dataset(task=task, episodes=episodes, out=Path(out), seed=seed, cell=cell, resume=resume,
                       calibration_stills=calibration_stills)
    return Path(out)


def align_twin(real, twin, paired, summary_path, workers: int = 2, calibration=None,
               on_unreliable: str = "refuse") -> dict:
    """Align the twin ``twin`` (a nominal spec) to the recording ``real`` and replay it into ``paired``
    (physics mode; a lab recording is also scored against its hidden truth). Writes the alignment report's
    content to ``summary_path`` and returns it. ``on_unreliable``: "refuse" (a twin that fails its self-check
    raises ``UnreliableTwinError`` before any episode is written) or "mark" (``replay_dataset``)."""
    from comsim.lab.twin_truth import replay_and_score

    paired, summary_path = Path(paired), Path(summary_path)
    if not dataset_complete(paired) or not summary_path.is_file():
        replay_and_score(real=real, twin=twin, out=paired, mode="physics", calibration=calibration, workers=workers,
                         on_unreliable=on_unreliable)
        report_path = paired / "alignment_report.json"
        summary = json.loads(report_path.read_text()) if report_path.is_file() else {}
        write_json(summary, summary_path, indent=1)
    return json.loads(summary_path.read_text())


def heldout_count(n_episodes: int) -> int:
    """The paired episodes the translator holds out for validation and the video metrics."""
    return max(1, n_episodes // 5)


def heldout_indices(paired) -> list[int]:
    """The paired dataset's held-out episodes (the translator's validation episodes): never trained on."""
    from comsim.translator.data import split_episodes

    n = len(LeRobotDataset(paired))
    _, val = split_episodes([n], heldout_count(n))
    return [e for _, e in val]


def train_translator(paired, out, config, steps: int | None = None, overrides=()) -> Path:
    """The translator of ``config`` (a YAML path) trained on ``paired`` into ``out`` (``out/final``), its own
    number of steps (``train.max_steps``) unless ``steps``; resumes from the latest checkpoint."""
    from comsim.translator.training import load_train_config, train

    out = Path(out)
    final = out / "final"
    if (final / "translator.json").is_file():
        return final
    n = len(LeRobotDataset(paired))
    cfg = load_train_config(config, [
        f"data.paths=[{paired}]", f"data.val_episodes={heldout_count(n)}", f"train.output_dir={out}",
        *([f"train.max_steps={steps}"] if steps else []), "train.checkpointing_steps=100", *overrides])
    result = train(cfg, resume_from_checkpoint="latest" if any(out.glob("checkpoint-*")) else None)
    return Path(result) if result else final


def generate_sim(task: str, episodes: int, out, scene=None, seed: int = 0, split: str = "id",
                 controls=SIM_CONTROLS, workers: int = 2) -> Path:
    """``episodes`` factory episodes of the task program ``task`` in the twin scene ``scene`` (the aligned
    twin: the translator learned its camera and colours), recorded with the twin's ``controls``."""
    from comsim.factory.generate import generate_dataset

    if not dataset_complete(out):
        generate_dataset(task, episodes, Path(out), workers=workers, seed=seed, split=split, scene=scene,
                         controls=tuple(controls))
    return Path(out)


def generate_demo_derived(paired, episodes: int, out, task=None, seed: int = 0, split: str = "id",
                          controls=SIM_CONTROLS, workers: int = 2) -> Path:
    """``episodes`` episodes in the demonstrator's own style: the real demos of the paired dataset ``paired``
    cut into object-centric segments, moved with their objects to new layouts of ``split`` and replayed in the
    aligned twin, kept when the task succeeds (``comsim generate --from-demos``)."""
    from comsim.factory.demo_derived import generate_from_demos

    if not dataset_complete(out):
        generate_from_demos(paired, episodes, Path(out), task=task, workers=workers, seed=seed, split=split,
                            controls=tuple(controls), progress=True)
    return Path(out)


def convert_sim(model, sim, out, sampling: SamplingParams | None = None, seed: int = 0, workers: int = 2,
                precision: str = "fp32") -> Path:
    """The sim dataset ``sim`` translated into pseudo-real episodes by the translator ``model``."""
    from comsim.convert import convert_dataset

    if dataset_complete(sim) and not dataset_complete(out):
        convert_dataset(model, sim, out, sampling=sampling, seed=seed, workers=workers, precision=precision)
    return Path(out)


def compose_sim(paired, sim, out, kind: str = "compositor", camera: str | None = None) -> Path:
    """The sim dataset ``sim`` made "pseudo-real" by a no-network baseline (comsim.translator.compositor: ``kind``)
    fit on every pair of ``paired``: the data a policy arm gets from the twin's labels and the real plate alone, the
    translator's trivial rival. Out: ``<cam>`` the baseline's frames, ``<cam>_sim`` kept; provenance source
    pseudo_real with ``extra["baseline"]`` (kind, what it was fit on). Resumes episode by episode."""
    import dataclasses

    from comsim.io.lock import output_lock
    from comsim.translator.compositor import KINDS, fit_baselines, training_pairs

    if kind not in KINDS:
        raise ValueError(f"baseline kind {kind!r}: expected one of {KINDS}")
    out = Path(out)
    if dataset_complete(out):
        return out
    ds, src = LeRobotDataset(paired), LeRobotDataset(sim)
    cam = camera or next(k for k in ds.camera_keys if sim_key(k) in ds.camera_keys)
    keys = [sim_key(cam), seg_key(cam)]
    missing = [k for k in keys if k not in src.camera_keys]
    if missing:
        raise ValueError(f"{sim}: composing needs the videos {keys} (generate with --controls seg); missing {missing}")
    with output_lock(out, "comsim compose"):
        base = fit_baselines(training_pairs(ds, cam, range(len(ds))), cam)[kind]
        w = DatasetWriter(out, src.fps, resume=True)
        for i in range(len(src)):
            if i in w.finished_episodes:
                continue
            ep = src.read_episode(i, cameras=keys)
            extra = {**ep.provenance.extra, "baseline": {"kind": kind, "fit_on": str(Path(paired).resolve()),
                                                         "episodes": len(ds)}}
            prov = dataclasses.replace(ep.provenance, source="pseudo_real", extra=extra)
            w.add_episode(type(ep)(frames={cam: base.apply(ep), sim_key(cam): ep.frames[sim_key(cam)]},
                                   action=ep.action, state=ep.state, fps=ep.fps, task=ep.task, provenance=prov),
                          episode_index=i)
        w.close()
    return out


def video_metrics(model_dir, run: RunLayout, converted: dict[str, Path]) -> dict:
    """Translate the held-out paired episodes and score them (and the raw twin render) against the real frames;
    object fidelity of those and of the converted factory datasets ``converted`` ({split: path}). Written to
    ``run.metrics``, which is this stage's done-file."""
    if run.metrics.is_file():
        return json.loads(run.metrics.read_text())
    from comsim.episode import resize_frames
    from comsim.metrics.evaluate import evaluate_video
    from comsim.metrics.fidelity import evaluate_object_fidelity, fit_fidelity_model
    from comsim.translator.data import camera_shifts
    from comsim.translator.pipeline import TranslatorPipeline

    with torch_threads(1):  # the same numbers whether or not an earlier stage changed the thread count
        pipe = TranslatorPipeline.from_pretrained(model_dir)
        ds = LeRobotDataset(run.paired)
        cam = pipe.camera
        H, W = pipe.resolution
        seg = seg_key(cam)
        parts = ("pseudo", "sim_only", "real")
        pseudo_dir, sim_dir, real_dir = (run.heldout_part(k) for k in parts)
        heldout = heldout_indices(run.paired)
        shifts = camera_shifts(run.paired)  # each replayed episode's camera as the twin rendered it
        if not dataset_complete(pseudo_dir):
            writers = {k: DatasetWriter(run.heldout_part(k), ds.fps) for k in parts}
            for j, i in enumerate(heldout):
                controls = [control_key(cam, c) for c in pipe.controls if control_key(cam, c) != seg]
                ep = ds.read_episode(i, cameras=[cam, sim_key(cam), seg, *controls])
                writers["pseudo"].add_episode(pipe.translate_episode(ep, seed=i, camera_shift=shifts.get(i)),
                                              episode_index=j)
                # the raw twin render and the real frames, at the translator's resolution, to score against
                for k, frames in (("sim_only", resize_frames(ep.frames[sim_key(cam)], (H, W))),
                                  ("real", resize_frames(ep.frames[cam], (H, W)))):
                    ep_k = type(ep)(frames={cam: frames, seg: ep.frames[seg]}, action=ep.action, state=ep.state,
                                    fps=ep.fps, task=ep.task, provenance=ep.provenance)
                    writers[k].add_episode(ep_k, episode_index=j)
            for w in writers.values():
                w.close()
        train_eps = [e for e in range(len(ds)) if e not in heldout]
        bases = heldout_baselines(run, ds, cam, (H, W), heldout, train_eps)
        opts = dict(camera=cam, metrics=["psnr", "ssim", "fid", "lpips"])
        result = {"pseudo_real_vs_real": evaluate_video(pseudo_dir, real_dir, **opts),
                  "raw_sim_vs_real": evaluate_video(sim_dir, real_dir, **opts)}
        for kind in ("global_color", "compositor"):
            result[f"{kind}_vs_real"] = evaluate_video(run.heldout_part(kind), real_dir, **opts)
        result["object_crops"] = heldout_crop_scores(run, ds, cam, (H, W), heldout,
                                                     bases["compositor"].fit_info["object_labels"])
        result["robot_region"] = heldout_robot_region(run, cam, (H, W), heldout, token_px(pipe))
        result["baselines"] = {"fit": bases["compositor"].fit_info, "saved": str(run.baselines),
                               "translator_margin_db_over_compositor": round(
                                   result["pseudo_real_vs_real"]["metrics"]["psnr"]
                                   - result["compositor_vs_real"]["metrics"]["psnr"], 2)}
        # the locator is fit on the training pairs' real frames only (never the held-out or generated ones)
        model = fit_fidelity_model(ds, cam, [e for e in range(len(ds)) if e not in heldout], (H, W), progress=True)
        fidelity = {"heldout_real (locator ceiling)": evaluate_object_fidelity(real_dir, model, cam),
                    "heldout_pseudo_real": evaluate_object_fidelity(pseudo_dir, model, cam)}
        for split, path in converted.items():
            if dataset_complete(path):
                fidelity[f"factory_pseudo_real_{split}"] = evaluate_object_fidelity(path, model, cam)
        result["object_fidelity"] = fidelity
    with atomic_output(run.metrics) as tmp:  # written whole: the file is this stage's "done" marker
        tmp.write_text(json.dumps(result, indent=1, default=str))
    return result


def heldout_baselines(run: RunLayout, ds, cam: str, res: tuple[int, int], heldout: list[int],
                      train_eps: list[int]) -> dict:
    """The no-network baselines (comsim.translator.compositor) fit on the TRAINING pairs, saved under
    ``run.baselines``, and their guesses of the held-out episodes written beside the translator's
    (``run.heldout_part(kind)``), so every one is scored on the same frames by the same code."""
    from comsim.translator.compositor import fit_baselines, load_baseline, training_pairs
    from comsim.translator.data import camera_shifts

    kinds = ("raw", "global_color", "compositor")
    if all((run.baselines / k / "baseline.json").is_file() for k in kinds):
        bases = {k: load_baseline(run.baselines / k) for k in kinds}
    else:
        bases = fit_baselines(training_pairs(ds, cam, train_eps), cam, res)
        for k, b in bases.items():
            b.save(run.baselines / k)
    for part in ("global_color", "compositor"):
        out = run.heldout_part(part)
        if dataset_complete(out):
            continue
        w = DatasetWriter(out, ds.fps)
        seg = seg_key(cam)
        shifts = camera_shifts(ds.root)
        for j, i in enumerate(heldout):
            ep = ds.read_episode(i, cameras=[sim_key(cam), seg])
            guess = type(ep)(frames={cam: bases[part].apply(ep, shifts.get(i)), seg: ep.frames[seg]}, action=ep.action,
                             state=ep.state, fps=ep.fps, task=ep.task, provenance=ep.provenance)
            w.add_episode(guess, episode_index=j)
        w.close()
    return bases


def heldout_crop_scores(run: RunLayout, ds, cam: str, res: tuple[int, int], heldout: list[int],
                        objects: list[int]) -> dict:
    """Object appearance on the held-out episodes (comsim.metrics.crops: 16x16 crops around each twin object's
    label centroid, PSNR and, where its weights are on disk, LPIPS), for the translator and each baseline."""
    from comsim.io.labels import labels_from_palette
    from comsim.metrics.crops import object_crop_scores, pool_crop_scores
    from comsim.metrics.frechet import MetricUnavailable
    from comsim.metrics.frame import load_lpips

    try:
        lpips_model, note = load_lpips(), None
    except MetricUnavailable as e:
        lpips_model, note = None, str(e)
    real = LeRobotDataset(run.heldout_part("real"))
    parts = {"translator": "pseudo", **{k: k for k in ("sim_only", "global_color", "compositor")}}
    preds = {name: LeRobotDataset(run.heldout_part(part)) for name, part in parts.items()}
    scores = {name: [] for name in parts}
    for j, i in enumerate(heldout):
        labels = labels_from_palette(ds.read_episode(i, cameras=[seg_key(cam)]).frames[seg_key(cam)], res)
        ref = real.read_episode(j, cameras=[cam]).frames[cam]
        for name, p in preds.items():
            scores[name].append(object_crop_scores(p.read_episode(j, cameras=[cam]).frames[cam], ref, labels,
                                                   lpips_model=lpips_model, objects=objects))
    out = {("raw_sim" if k == "sim_only" else k): pool_crop_scores(v) for k, v in scores.items()}
    out["objects"] = list(objects)
    if note:
        out["lpips_unavailable"] = note
    return out


def token_px(pipe) -> int:
    """The translator's token in pixels: its patch (height, width) times its codec's spatial factor."""
    return int(pipe.transformer.config["patch_size"][-1]) * int(pipe.codec.spatial_factor)


def heldout_robot_region(run: RunLayout, cam: str, res: tuple[int, int], heldout: list[int],
                         token: int = 16) -> dict:
    """The robot-region scores (comsim.metrics.robot_region: PSNR/SSIM inside the real robot mask, still and
    moving frames; edge sharpness against the real frames; the seam score on the ``token``-px grid) of the
    translator and each baseline on the held-out episodes, and of the real frames themselves (the ceiling row:
    infinite PSNR, sharpness 1 by construction, their own seam score). Masks: comsim.pipeline.robot_masks."""
    from comsim.metrics.evaluate import to_json_safe
    from comsim.metrics.robot_region import pool_robot_region, robot_region_scores
    from comsim.pipeline.robot_masks import RobotMasks

    real = LeRobotDataset(run.heldout_part("real"))
    parts = {"translator": "pseudo", "raw_sim": "sim_only", "global_color": "global_color",
             "compositor": "compositor"}
    preds = {name: LeRobotDataset(run.heldout_part(part)) for name, part in parts.items()}
    scores = {name: [] for name in (*parts, "real")}
    with RobotMasks(run.paired, cam) as masks:
        for j, i in enumerate(heldout):
            ref = real.read_episode(j, cameras=[cam]).frames[cam]
            region, robot = masks(i, res, len(ref))
            for name, p in preds.items():
                scores[name].append(robot_region_scores(p.read_episode(j, cameras=[cam]).frames[cam], ref, region,
                                                        robot, token))
            scores["real"].append(robot_region_scores(ref, ref, region, robot, token))
        source = masks.source
    out = {name: to_json_safe(pool_robot_region(v)) for name, v in scores.items()}  # the real row's PSNR: "inf"
    out["mask_source"] = source
    return out


def mix_datasets(real, synthetic, out, synthetic_fraction: float, camera: str | None = None) -> dict:
    """One LeRobot dataset of every episode of ``real`` and as many episodes of ``synthetic`` (in order) as
    bring the synthetic share of frames closest to ``synthetic_fraction``; the camera ``camera`` only (the
    renders and control videos are left out), so LeRobot's own training scripts load it. Each episode keeps
    its provenance; ``out/mixture.json`` records the sources, the fraction asked for and the one reached."""
    from comsim.pipeline.mix import mix

    return mix(real, synthetic, out, synthetic_fraction, camera)
