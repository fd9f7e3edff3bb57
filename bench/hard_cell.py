"""How far the twin's raw render is from a lab cell's frames, and where the gap comes from.

    MUJOCO_GL=egl nice python bench/hard_cell.py --cell configs/lab/workshop.yaml --episodes 10 \
        --out runs/bench_hard_cell

Records ``--episodes`` scripted episodes of ``--task`` with calibration stills in the cell
(``comsim.lab.record_dataset``), aligns the twin from the cell's own frames and replays them in
physics mode (``comsim.twin.replay.replay_dataset``, as ``comsim demo`` does: the twin starts
from ``--twin``'s nominal spec and is never given the truth), then reports:

- the raw twin render against the cell's frames: PSNR (per frame, then the mean; 128x128, data
  range 255) and SSIM, on every pair and on the held-out pairs (the demo's split: the last
  max(1, n // 5) episodes);
- the same with each realism option of the cell switched off in turn (``--features``; a dotted
  override of the cell each, the physics gap set to the twin's nominal friction and mass), each a
  recording, alignment and replay of its own, so the gap's sources are visible; ``all`` switches
  every option off at once (the cell's base look: textures, lights, sensor);
- the twin's errors against the cell's truth (the alignment report: camera pose, robot masks,
  objects' initial poses and replayed trajectories), the camera error against the camera of the
  episodes (which may have moved since the stills), and what the aligner flags: calibration stills
  it did not trust, objects it did not find, colour residuals, objects whose replay fits the video
  badly;
- the no-network baselines (``comsim.translator.compositor``) fit on the training pairs and
  scored on the held-out ones, with object-crop PSNR (``comsim.metrics.crops``);
- recording speed: frames/s of scripted episodes in this cell and in the built-in lab, side by side.

Everything is resumable (each recording and replay is). The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from comsim.config import PANDA_PUSH_CELL, config_file  # noqa: E402
from comsim.episode import resize_frames  # noqa: E402
from comsim.io.keys import seg_key, sim_key  # noqa: E402
from comsim.io.lerobot import LeRobotDataset  # noqa: E402
from comsim.lab import LabEnv, load_lab_cell, record_dataset, record_episode  # noqa: E402
from comsim.lab.truth import load_lab_truth  # noqa: E402
from comsim.metrics.crops import object_crop_scores, pool_crop_scores  # noqa: E402
from comsim.metrics.frame import psnr, ssim  # noqa: E402
from comsim.sim.spec import load_scene_spec  # noqa: E402
from comsim.io.labels import labels_from_palette  # noqa: E402
from comsim.translator.compositor import fit_baselines, training_pairs  # noqa: E402
from comsim.twin.pose_fit import pose_error  # noqa: E402
from comsim.twin.replay import replay_dataset  # noqa: E402

RES = (128, 128)
FEATURES = {  # option -> the dotted overrides that switch it off
    "prints": ["look.prints={}"],
    "clutter": ["look.clutter=[]"],
    "distractors": ["look.distractors=[]"],
    "light_drift": ["look.light_drift={}"],
    "exposure": ["look.exposure={}"],
    "camera_motion": ["look.camera_motion={}"],
    "motion_blur": ["look.motion_blur={}"],
    "physics": ["physics_drift={}"],  # + the twin's nominal friction and mass (physics_overrides)
}


def physics_overrides(cell, twin) -> list[str]:
    """The cell's objects and table with the twin's nominal friction and mass."""
    nominal = {o.name: o for o in twin.objects}
    out = [f"scene.table.friction={twin.table.friction}"]
    for i, o in enumerate(cell.scene.objects):
        if o.name in nominal:
            n = nominal[o.name]
            out += [f"scene.objects.{i}.mass={n.mass}", f"scene.objects.{i}.friction={n.friction}"]
    return out


def heldout(n: int) -> list[int]:
    """The demo's held-out episodes: the translator's validation split (the last max(1, n // 5))."""
    from comsim.translator.data import split_episodes

    return [e for _, e in split_episodes([n], max(1, n // 5))[1]]


def twin_objects(paired: Path) -> list[int]:
    """The labels of the twin's objects (2 + k for its k-th object)."""
    return list(range(2, 2 + len(json.loads((paired / "twin_alignment.json").read_text())["spec"]["objects"])))


def raw_scores(paired: Path, cam: str) -> dict:
    """Raw twin render vs the cell's frames at 128x128: PSNR per frame then the mean, SSIM, and PSNR of
    16x16 crops around the twin's objects (comsim.metrics.crops)."""
    ds = LeRobotDataset(paired)
    objects = twin_objects(paired)
    per_ep = []
    for e in range(len(ds)):
        ep = ds.read_episode(e, cameras=[cam, sim_key(cam), seg_key(cam)])
        real, sim = resize_frames(ep.frames[cam], RES), resize_frames(ep.frames[sim_key(cam)], RES)
        crops = object_crop_scores(sim, real, labels_from_palette(ep.frames[seg_key(cam)], RES), objects=objects)
        per_ep.append((psnr(sim, real), ssim(sim, real), crops))
    held = heldout(len(ds))

    def pooled(eps):
        return {"psnr": round(float(np.mean(np.concatenate([per_ep[e][0] for e in eps]))), 2),
                "ssim": round(float(np.mean(np.concatenate([per_ep[e][1] for e in eps]))), 3),
                "object_crop_psnr": pool_crop_scores([per_ep[e][2] for e in eps])["psnr"],
                "frames": int(sum(len(per_ep[e][0]) for e in eps))}

    return {"all_pairs": pooled(range(len(ds))), "heldout_pairs": {**pooled(held), "episodes": held},
            "per_episode_psnr": [round(float(p.mean()), 2) for p, _, _ in per_ep]}


def alignment_summary(lab: Path, paired: Path) -> dict:
    """The alignment report's errors against the truth, the camera error against the episodes' moving
    camera, and what the aligner flagged."""
    rep = json.loads((paired / "alignment_report.json").read_text())
    al = json.loads((paired / "twin_alignment.json").read_text())
    truth = load_lab_truth(lab)
    T = np.asarray(al["T_cam_from_base"])
    out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rep["summary"].items()}
    moved = []
    for e in range(len(truth.episodes)):
        tr = truth.trajectory(e)
        if "camera_T_cam_from_base" in tr:
            moved += [pose_error(T, Tk) for Tk in tr["camera_T_cam_from_base"]]
    if moved:
        out["camera_vs_episodes_position_error_m_mean"] = round(float(np.mean([m for m, _ in moved])), 4)
        out["camera_vs_episodes_rotation_error_deg_mean"] = round(float(np.mean([d for _, d in moved])), 3)
    cal = al["calibration"]
    flags = {"calibration": {"source": cal["source"], "converged": cal.get("converged"),
                             "mean_iou": round(cal["mean_iou"], 4) if cal.get("mean_iou") is not None else None,
                             "outlier_frames": cal.get("outlier_frames")},
             "colour_residuals": {k: round(v, 1) for k, v in al["colors"].get("residual", {}).items()},
             "objects_not_found": {}, "objects_refined": {}}
    ds = LeRobotDataset(paired)
    for e in range(len(ds)):
        prov = ds.read_episode(e, cameras=[]).provenance.extra
        lost = [n for n, r in prov.get("localized_objects", {}).items() if not r.get("found")]
        if lost:
            flags["objects_not_found"][e] = lost
        for n, r in ((prov.get("refined_objects") or {}).get("objects") or {}).items():
            flags["objects_refined"].setdefault(n, []).append(
                {"episode": e, "refined": r.get("refined"),
                 "track_residual": None if r.get("track_residual") is None else round(float(r["track_residual"]), 4)})
    # scored against the truth here, not flagged by the aligner: objects placed more than 5 cm off
    far = {e["episode"]: {n: round(v, 3) for n, v in e.get("object_initial_error_m", {}).items() if v > 0.05}
           for e in rep["episodes"]}
    out["objects_off_by_more_than_5cm"] = {e: v for e, v in far.items() if v}
    return {"errors_vs_truth": out, "flags": flags}


def baseline_scores(paired: Path, cam: str) -> dict:
    """The three no-network baselines, fit on the training pairs, on the held-out pairs (PSNR, SSIM,
    object-crop PSNR)."""
    ds = LeRobotDataset(paired)
    held = heldout(len(ds))
    train = [e for e in range(len(ds)) if e not in held]
    bases = fit_baselines(training_pairs(ds, cam, train), cam, RES)
    objects = twin_objects(paired)
    acc = {k: {"psnr": [], "ssim": [], "crops": []} for k in bases}
    for e in held:
        ep = ds.read_episode(e, cameras=[cam, sim_key(cam), seg_key(cam)])
        real = resize_frames(ep.frames[cam], RES)
        labels = labels_from_palette(ep.frames[seg_key(cam)], RES)
        for k, b in bases.items():
            pred = b.apply(ep)
            acc[k]["psnr"].append(psnr(pred, real))
            acc[k]["ssim"].append(ssim(pred, real))
            acc[k]["crops"].append(object_crop_scores(pred, real, labels, objects=objects))
    return {"episodes_fit": train, "episodes_scored": held,
            **{k: {"psnr": round(float(np.mean(np.concatenate(v["psnr"]))), 2),
                   "ssim": round(float(np.mean(np.concatenate(v["ssim"]))), 3),
                   "object_crops": pool_crop_scores(v["crops"])} for k, v in acc.items()}}


def run_variant(out: Path, cell_path: str, overrides: list[str], a, baselines: bool) -> dict:
    cell = load_lab_cell(cell_path, overrides)
    t0 = time.perf_counter()
    lab = record_dataset(a.task, a.episodes, out / "lab", seed=a.seed, cell=cell, calibration_stills=a.stills)
    t1 = time.perf_counter()
    paired = out / "paired"
    replay_dataset(lab, config_file(a.twin), paired, mode="physics", workers=a.workers, on_unreliable="mark",
                   log=lambda s: print(s, flush=True))
    t2 = time.perf_counter()
    res = {"overrides": overrides, "raw_twin": raw_scores(paired, cell.camera), **alignment_summary(lab, paired),
           "record_seconds": round(t1 - t0, 1), "align_replay_seconds": round(t2 - t1, 1)}
    if baselines:
        res["baselines"] = baseline_scores(paired, cell.camera)
    return res


def recording_speed(cells: dict[str, str], task: str, episodes: int) -> dict:
    """Frames/s of scripted episodes (closed loop, images included, nothing written), the cells taking
    turns episode by episode so that both see the same machine load."""
    envs = {k: LabEnv(load_lab_cell(c), task) for k, c in cells.items()}
    frames = {k: 0 for k in envs}
    secs = {k: 0.0 for k in envs}
    try:
        for i in range(episodes):
            for k, env in envs.items():
                t = time.perf_counter()
                ep, _ = record_episode(env, 900 + i)
                secs[k] += time.perf_counter() - t
                frames[k] += len(ep)
    finally:
        for env in envs.values():
            env.close()
    return {k: {"frames": frames[k], "seconds": round(secs[k], 1), "frames_per_s": round(frames[k] / secs[k], 1)}
            for k in envs}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", default="configs/lab/workshop.yaml")
    ap.add_argument("--twin", default=str(PANDA_PUSH_CELL), help="the twin's nominal spec the alignment starts from")
    ap.add_argument("--task", default="push")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--stills", type=int, default=12, help="calibration stills recorded with the episodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_hard_cell"))
    ap.add_argument("--features", nargs="*", default=[*FEATURES, "all"],
                    help=f"options switched off one at a time (of {list(FEATURES)} and 'all'); none: no breakdown")
    ap.add_argument("--workers", type=int, default=2, help="replay processes")
    ap.add_argument("--speed-episodes", type=int, default=2, help="episodes per cell timed for frames/s (0: skip)")
    a = ap.parse_args(argv)
    unknown = [f for f in a.features if f not in FEATURES and f != "all"]
    if unknown:
        raise SystemExit(f"--features: unknown {unknown}; expected some of {[*FEATURES, 'all']}")
    cell_path = str(config_file(a.cell))
    cell, twin = load_lab_cell(cell_path), load_scene_spec(config_file(a.twin))
    result = {"bench": "hard_cell", "cell": a.cell, "twin": a.twin, "task": a.task, "episodes": a.episodes,
              "metric": "PSNR per frame then the mean, SSIM (comsim.metrics.frame), 128x128, data range 255",
              "full": run_variant(a.out / "full", cell_path, [], a, baselines=True)}
    print(json.dumps({"full": result["full"]["raw_twin"]}), flush=True)
    full = result["full"]["raw_twin"]["all_pairs"]["psnr"]
    rows = []
    for f in a.features:
        ov = [o for k in (FEATURES if f == "all" else [f]) for o in FEATURES[k]]
        if f in ("physics", "all"):
            ov += physics_overrides(cell, twin)
        r = run_variant(a.out / f"off_{f}", cell_path, ov, a, baselines=False)
        raw = r["raw_twin"]
        rows.append({"off": f, "psnr_all": raw["all_pairs"]["psnr"], "ssim_all": raw["all_pairs"]["ssim"],
                     "object_crop_psnr_all": raw["all_pairs"]["object_crop_psnr"],
                     "psnr_heldout": raw["heldout_pairs"]["psnr"], "ssim_heldout": raw["heldout_pairs"]["ssim"],
                     "gain_db_when_off": round(raw["all_pairs"]["psnr"] - full, 2),
                     "robot_iou_vs_true_masks": r["errors_vs_truth"].get("mean_robot_iou_vs_true_masks"),
                     "object_initial_error_m_mean": r["errors_vs_truth"].get("object_initial_error_m_mean"),
                     "camera_error_m": r["errors_vs_truth"].get("camera_position_error_m"),
                     "camera_error_deg": r["errors_vs_truth"].get("camera_rotation_error_deg"),
                     "object_trajectory_error_m_mean": r["errors_vs_truth"].get("object_trajectory_error_m_mean")})
        print(json.dumps(rows[-1]), flush=True)
    result["breakdown"] = rows
    if a.speed_episodes:
        result["recording_speed"] = recording_speed({"cell": cell_path, "built_in_lab": "configs/lab/default.yaml"},
                                                    a.task, a.speed_episodes)
        s = result["recording_speed"]
        result["recording_speed"]["cost_x"] = round(s["built_in_lab"]["frames_per_s"] / s["cell"]["frames_per_s"], 2)
    result["realism_options"] = {k: v for k, v in cell.to_dict()["look"].items()
                                 if k in ("prints", "clutter", "distractors", "light_drift", "exposure",
                                          "camera_motion", "motion_blur")}
    result["realism_options"]["physics_drift"] = cell.to_dict().get("physics_drift")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
