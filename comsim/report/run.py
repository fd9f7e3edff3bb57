"""The report of a run folder: ``comsim report RUN_DIR`` and the end of ``comsim demo``.

Builds ``RUN_DIR/report.html`` (clips under ``RUN_DIR/report_media/``) from whatever the
folder holds, in the layout ``comsim demo`` writes (``comsim.run_layout.RunLayout``, which
lists the folders and files).

Each stage's section shows its evidence (``twin.py``, ``translator.py``, ``policy.py``;
convert and the metrics here); a part with nothing to show says why ("not run: ...",
"not written: ..."); an input that cannot be read is shown with its error. The page opens
from disk (relative links into ``report_media/``, no server).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from comsim.convert import HEADER_FILE, REPORT_FILE
from comsim.io.keys import seen_cameras, sim_key
from comsim.io.lerobot import dataset_complete
from comsim.report.html import Report, fmt_seconds, read_json
from comsim.report.plots import bar_chart_svg
from comsim.report.policy import policy_section
from comsim.report.translator import SUMMARY as TRAIN_SUMMARY, translator_section
from comsim.report.twin import twin_section
from comsim.run_layout import CONVERT, POLICY, STAGES, TRANSLATOR, RunLayout



def build_report(run_dir: str | Path, title: str | None = None, max_episodes: int = 3) -> Path:
    """Write ``run_dir/report.html`` and return its path; raises FileNotFoundError if no run_dir."""
    run = Path(run_dir)
    layout = RunLayout(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: run folder not found (give the --out folder of `comsim demo`, or an "
                                "experiment's output folder)")
    rep = Report(run, title=title or f"ComSim report: {run.resolve().name}", page=layout.report.name,
                 media=layout.report_media.name)
    rep.text(f"Run folder {run.resolve()}; report built {time.strftime('%Y-%m-%d %H:%M:%S')}. "
             "Built by `comsim report`; parts the run did not produce say why.")
    try:
        stages = read_json(layout.stages) or {}
        if not isinstance(stages, dict):
            raise ValueError(f"{layout.stages}: expected a JSON object")
    except ValueError as e:
        rep.warn(f"stage log unreadable: {e}")
        stages = {}
    timings, failures = stages.get("timings") or {}, stages.get("failures") or {}
    if not (isinstance(timings, dict) and isinstance(failures, dict)):
        rep.warn(f"stage log unreadable: {layout.stages}: 'timings' and 'failures' must be objects")
        timings, failures = {}, {}

    rep.heading("Stages")
    left_out = stages.get("left_out") if isinstance(stages.get("left_out"), dict) else {}
    rep.table(_stage_rows(run, timings, failures, left_out), cls="stages")
    problems = [{"stage": k, "reason": v} for k, v in failures.items()]
    if problems:
        rep.heading("Failed or skipped stages")
        rep.table(problems, cls="failures")

    rep.heading("Videos: sim | pseudo-real | real")
    if not _section(rep, _videos, run, max_episodes):
        rep.absent("not run: no held-out, factory, paired or lab episodes in this run folder.")
    for heading, fn, args in (("Twin alignment", twin_section, ()), ("Translator training", translator_section, ()),
                              ("Convert", _convert, (timings, left_out.get(CONVERT))), ("Video metrics", _metrics, ()),
                              ("Policy experiment", policy_section, ())):
        rep.heading(heading)
        _section(rep, fn, run, *args)

    other = {k: fmt_seconds(v) for k, v in timings.items() if k not in {s.name for s in STAGES}}
    if other:
        rep.heading("Other timings")
        rep.table([other], caption="wall time of the steps not in the stage table (stages.json)")
    return rep.write()


def _section(rep: Report, fn, *args):
    # One unreadable input must not cost the whole report: say what broke and go on.
    try:
        return fn(rep, *args)
    except (ValueError, OSError, KeyError, TypeError, AttributeError, IndexError) as e:
        rep.warn(f"error while reading this part: {type(e).__name__}: {e}")
        return 1


# -- stages -------------------------------------------------------------------------------------
def _stage_rows(run: Path, timings: dict, failures: dict, left_out: dict | None = None) -> list[dict]:
    """One row per pipeline stage; ``left_out``: stages the run's profile does not run, with why."""
    rows, layout, left_out = [], RunLayout(run), left_out or {}
    for stage in STAGES:
        name, rel, kind, path = stage.name, stage.output, stage.kind, layout.output(stage.name)
        if name in failures:
            why = str(failures[name])
            status = why if why.startswith("skipped") else f"failed: {why}"
        elif kind == "dataset" and dataset_complete(path):
            n = _dataset_len(path)
            status = f"done ({n} episode{'' if n == 1 else 's'})" if isinstance(n, int) else f"error: {n}"
        elif name == TRANSLATOR and (layout.translator / TRAIN_SUMMARY).is_file():
            status = _training_status(layout.translator / TRAIN_SUMMARY, path.is_file())
        elif kind == "file" and path.is_file():
            status = "done"
        elif name == POLICY and (run / "results.json").is_file():
            status, rel = "done", "results.json"
        elif name in left_out:
            status = f"not in this profile: {left_out[name]}"
        else:
            status = "not run"
        rows.append({"stage": name, "output": rel, "status": status, "time": fmt_seconds(timings.get(name))})
    return rows


def _training_status(summary: Path, final: bool) -> str:
    try:
        doc = read_json(summary)
    except ValueError as e:
        return f"error: {e}"
    if not isinstance(doc, dict):
        return f"error: {summary}: expected a JSON object"
    done, planned = doc.get("steps_done"), doc.get("steps_planned")
    if doc.get("stopped_early"):
        return f"stopped early at step {done} of {planned}: {doc.get('stop_reason') or 'reason not recorded'}"
    return f"done ({done} of {planned} steps)" if final else f"running or killed at step {done} of {planned}"


def _dataset_len(path: Path):
    from comsim.io.lerobot import LeRobotDataset

    try:
        return len(LeRobotDataset(path))
    except (ValueError, OSError) as e:
        return str(e)


def _open(path: Path):
    """The dataset at ``path``, or None when absent / unreadable (the stage table says which)."""
    if not dataset_complete(path):
        return None
    from comsim.io.lerobot import LeRobotDataset

    try:
        return LeRobotDataset(path)
    except (ValueError, OSError):
        return None


def _main_camera(ds) -> str | None:
    cams = seen_cameras(ds.camera_keys)
    return cams[0] if cams else (ds.camera_keys[0] if ds.camera_keys else None)


def _frames(ds, i: int, cam: str | None):
    if ds is None or cam is None or cam not in ds.camera_keys or i >= len(ds):
        return None
    return ds.read_episode(i, cameras=[cam]).frames[cam]


# -- videos -------------------------------------------------------------------------------------
def _videos(rep: Report, run: Path, k: int) -> int:
    rows, layout = 0, RunLayout(run)
    pseudo, sim, real, comp = (_open(layout.heldout_part(k)) for k in ("pseudo", "sim_only", "real", "compositor"))
    if pseudo is not None or real is not None:
        ref = pseudo or real
        cam = _main_camera(ref)
        rep.text("Held-out paired episodes (the translator never trained on them): twin render | "
                 "no-network compositor | translated | lab frames of the same episode.")
        for i in range(min(k, len(ref))):
            rep.video_row([("sim (twin render)", _frames(sim, i, cam)), ("compositor", _frames(comp, i, cam)),
                           ("pseudo-real", _frames(pseudo, i, cam)), ("real (lab)", _frames(real, i, cam))],
                          fps=ref.fps, caption=f"held-out episode {i}")
            rows += 1
    conv = _open(layout.pseudo_real)
    if conv is not None:
        cam = _main_camera(conv)
        rep.text("Factory episodes translated by `comsim convert` (no real counterpart exists).")
        for i in range(min(k, len(conv))):
            ep = conv.read_episode(i)
            rep.video_row([("sim", ep.frames.get(sim_key(cam))), ("pseudo-real", ep.frames.get(cam)),
                           ("real", None)], fps=conv.fps, caption=f"factory episode {i}: success={ep.success}")
            rows += 1
    elif rows == 0:
        paired, factory = _open(layout.paired), _open(layout.sim)
        if paired is not None:
            cam = _main_camera(paired)
            rep.text("Twin replay of the lab episodes (no translator output in this run).")
            for i in range(min(k, len(paired))):
                ep = paired.read_episode(i)
                rep.video_row([("sim (twin render)", ep.frames.get(sim_key(cam))), ("pseudo-real", None),
                               ("real (lab)", ep.frames.get(cam))], fps=paired.fps, caption=f"paired episode {i}")
                rows += 1
        elif factory is not None:
            cam = _main_camera(factory)
            rep.text("Factory episodes (no translator output in this run).")
            for i in range(min(k, len(factory))):
                rep.video_row([("sim", _frames(factory, i, cam)), ("pseudo-real", None), ("real", None)],
                              fps=factory.fps, caption=f"factory episode {i}")
                rows += 1
    lab = _open(layout.lab)
    if lab is not None and rows == 0:
        cam = _main_camera(lab)
        rep.text("Lab teleoperation (the real stand-in).")
        for i in range(min(k, len(lab))):
            rep.video_row([("sim", None), ("pseudo-real", None), ("real (lab)", _frames(lab, i, cam))],
                          fps=lab.fps, caption=f"lab episode {i}")
            rows += 1
    return rows


# -- metrics ------------------------------------------------------------------------------------
def _metrics(rep: Report, run: Path) -> None:
    doc = read_json(RunLayout(run).metrics)
    if not isinstance(doc, dict) or not doc:
        rep.absent("not run: no metrics.json (written by eval/eval_video.py or `comsim demo`)")
        return
    reports = {"pred vs ref": doc} if "metrics" in doc and "pred" in doc else doc
    rows, values = [], {}
    for name, r in reports.items():
        if not isinstance(r, dict) or "metrics" not in r:  # object fidelity, crops, the baselines' fit: below
            continue
        m = r.get("metrics", r)
        scalars = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        rows.append({"comparison": name, "episodes": r.get("episodes", "-"), **scalars})
        for k, v in scalars.items():
            if not k.endswith("_samples"):
                values.setdefault(k, {})[name] = float(v)
        for k, why in (r.get("unavailable") or {}).items():
            rows[-1].setdefault(k, f"n/a: {why}")
    rep.table(rows, caption="against the lab (real) frames, the same held-out frames for every row: the translator "
                            "(pseudo_real), the raw twin render, one global affine colour map (global_color) and the "
                            "no-network compositor (real background plate + per-label colour maps), both fit on the "
                            "training pairs; PSNR (per frame, then the mean), SSIM higher is better; FID, LPIPS lower")
    margin = (doc.get("baselines") or {}).get("translator_margin_db_over_compositor")
    if isinstance(margin, (int, float)):
        rep.text(f"The translator's margin over the no-network compositor: {margin:+.2f} dB PSNR.")
    _object_crops(rep, doc.get("object_crops"))
    _robot_region(rep, doc.get("robot_region"))
    charts = [bar_chart_svg({k: v}, title=k.upper(), vmax=1.0 if k == "ssim" else None)
              for k, v in values.items() if any(math.isfinite(x) for x in v.values())]
    if charts:
        rep.raw("<div class='row'>" + "".join(charts) + "</div>")
    _object_fidelity(rep, doc.get("object_fidelity"), _object_names(run))


def _object_crops(rep: Report, doc) -> None:
    """comsim.metrics.crops per prediction: how the objects look, not only where they are."""
    if not isinstance(doc, dict) or not doc:
        return
    rows = [{"prediction": name, "crops": r.get("crops", "-"), "PSNR": r.get("psnr", "-"),
             "LPIPS": r.get("lpips", "n/a")} for name, r in doc.items() if isinstance(r, dict)]
    note = f" LPIPS unavailable: {doc['lpips_unavailable']}" if doc.get("lpips_unavailable") else ""
    rep.table(rows, caption="object appearance: 16x16 crops around each twin object's label centroid on the held-out "
                            "frames, against the real crops (PSNR higher, LPIPS lower is better)." + note)


def _robot_region(rep: Report, doc) -> None:
    """comsim.metrics.robot_region per prediction: does it draw the robot, or hedge it? (docs/metrics.md)"""
    if not isinstance(doc, dict) or not doc:
        rep.absent("robot region not computed: metrics.json has no robot_region (comsim.metrics.robot_region)")
        return
    def cell(v):  # the real frames against themselves: infinite PSNR ("inf" in metrics.json), said so
        return "inf (identical)" if v == "inf" or (isinstance(v, float) and v == math.inf) else v

    rows = []
    for name, r in doc.items():
        if not isinstance(r, dict) or "psnr" not in r:
            continue
        rows.append({"prediction": name, "frames still / moving": f"{r.get('frames_still')} / {r.get('frames_moving')}",
                     **{f"{m} {split}": cell(r.get(f"{key}_{split}")) for m, key in (("PSNR", "psnr"), ("SSIM", "ssim"))
                        for split in ("still", "moving")},
                     "sharpness": r.get("sharpness"), "seam": r.get("seam"), "seam near robot": r.get("seam_near_robot")})
    proto = next((r.get("protocol") for r in doc.values() if isinstance(r, dict) and r.get("protocol")), {}) or {}
    rep.table(rows, caption="the robot region on the held-out frames: PSNR (dB) and SSIM inside the real robot mask "
                            f"({doc.get('mask_source', 'mask source not recorded')}), still and moving frames (the "
                            f"mask's outline moves less / more than {proto.get('still_below_px_at_128', '?')} px per "
                            "frame at 128 px); sharpness: the peak luma gradient within "
                            f"+-{proto.get('edge_band_px', '?')} px of the real robot's outline over the real "
                            "frames' (1 = as sharp; a blurred, doubled or see-through arm scores lower); seam: mean "
                            f"|luma step| across the {proto.get('token_px', '?')}-px token grid's lines over the same "
                            "half a token further on (the real row: the real frames' own). PSNR rewards a soft, "
                            "doubled arm: read it beside the sharpness.")


def _object_names(run: Path) -> dict[int, str]:
    """Object label (2 + i, CONTRACTS.md) -> name, from the run's aligned twin; {} when it has none."""
    from comsim.config import ConfigError, load_yaml

    path = RunLayout(run).paired / "twin_aligned.yaml"
    try:
        objects = load_yaml(path).get("objects") or [] if path.is_file() else []
        return {2 + i: str(o["name"]) for i, o in enumerate(objects)}
    except (ConfigError, KeyError, TypeError):  # a report shows what it can: unnamed columns, not no page
        return {}


def _object_fidelity(rep: Report, doc, names: dict[int, str]) -> None:
    """comsim.metrics.fidelity per dataset: where the objects and the robot are drawn against the twin."""
    if not isinstance(doc, dict) or not doc:
        rep.absent("object fidelity not computed: metrics.json has no object_fidelity (comsim.metrics.fidelity)")
        return
    rows = []
    for name, r in doc.items():
        if not isinstance(r, dict):
            continue
        within = r.get("object_within")
        rows.append({"frames scored": name, "episodes": r.get("episodes", "-"),
                     "object frames": r.get("object_frames", "-"),
                     "objects within 2 px": f"{100 * within:.0f}%" if isinstance(within, (int, float)) else "-",
                     "median error (px)": r.get("object_error_px_median_of_episodes", "-"),
                     "robot IoU": r.get("robot_iou", "-")})
        for lab, o in (r.get("objects") or {}).items():
            if isinstance(o, dict) and isinstance(o.get("within"), (int, float)):
                rows[-1][f"{names.get(int(lab), f'object {lab}')} within 2 px"] = f"{100 * o['within']:.0f}%"
    rep.table(rows, caption="object fidelity: each object located near where the twin put it by a per-pixel classifier "
                            "fit on real lab frames, and the robot's IoU with the twin's mask; the real lab frames "
                            "are the locator's ceiling")


# -- convert ------------------------------------------------------------------------------------
def _convert(rep: Report, run: Path, timings: dict, left_out: str | None = None) -> None:
    """Episodes, frames, frames/s and the guidance of ``comsim convert`` (pseudo_real/conversion.json)."""
    out = RunLayout(run).pseudo_real
    header = read_json(out / HEADER_FILE)
    ds = _open(out)
    if header is None and ds is None:
        rep.absent(f"not in this profile: {left_out}" if left_out else
                   "not run: no pseudo_real/ (written by `comsim convert`) in this run folder")
        return
    if header is None:
        rep.absent(f"guidance not recorded: {out / HEADER_FILE} is missing (not written by `comsim convert`?)")
        header = {}
    frames = ds.num_frames if ds is not None else None
    row = {"episodes": len(ds) if ds is not None else f"not closed ({header.get('input_episodes', '?')} asked)",
           "frames": frames if frames is not None else "-"}
    timing = read_json(out / REPORT_FILE) or {}
    fps, note = timing.get("frames_per_second"), ""
    seconds = timing.get("elapsed_s")
    if fps is None and frames and isinstance(timings.get(CONVERT), (int, float)) and timings[CONVERT] > 0:
        seconds = timings[CONVERT]
        fps = frames / seconds
        note = ("frames/s: the dataset's frames over the convert stage's wall time in stages.json (convert records "
                "no timing of its own; the stage time includes loading the translator and starting workers, so "
                "the translation alone is faster)")
    row["frames/s (stage wall time)" if note else "frames/s"] = (f"{fps:.2f}" if isinstance(fps, (int, float))
                                                                 else "not recorded")
    row["time"] = fmt_seconds(seconds)
    for k in ("w_action", "w_sim", "num_steps", "strength", "overlap", "seed", "threads"):
        row[{"num_steps": "sampling steps", "overlap": "window overlap"}.get(k, k)] = header.get(k, "-")
    row["translator"] = header.get("translator_hash", "-")
    rep.table([row], caption="batch sim -> pseudo-real conversion (guidance: v = v_none + w_action (v_action - "
                             "v_none) + w_sim (v_sim - v_none))")
    if fps is None:
        rep.absent("frames/s not recorded: conversion.json has no timing and stages.json no convert time")
    elif note:
        rep.text(note)

