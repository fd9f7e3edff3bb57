"""The twin's alignment report of a paired dataset: its robot silhouettes against masks derived from the real frames,
and the twin's self-check (``selfcheck.py``: calibration IoU per frame, each object's silhouette residual).

Computed from the recording alone, as on a real cell. Scoring against a lab recording's hidden truth
is the lab's business (``comsim.lab.twin_truth`` adds it to the same file). The HTML report of a
whole run (``comsim.report``) reads the alignment_report.json written here.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from comsim.io.keys import seg_key
from comsim.io.labels import rgb_to_seg
from comsim.io.lerobot import LeRobotDataset
from comsim.sim.camera import shifted_camera
from comsim.sim.spec import scene_spec_from_dict
from comsim.twin.frames import undistort, undistort_maps
from comsim.twin.masks import derive_masks
from comsim.twin.pose_fit import iou
from comsim.io.files import write_json
from comsim.twin.overlay import write_overlay
from comsim.twin.silhouette import RobotSilhouette


def alignment_report(paired, real=None, out=None, frames_per_episode: int = 4, overlays: int = 4,
                     log=print) -> dict:
    """Per-dataset alignment report of a paired dataset written by ``replay_dataset``.

    Per-episode robot-mask IoU between the twin's silhouette and masks derived from the real
    frames (``masks.py``). Writes ``OUT/alignment_report.json`` and overlays ``OUT/report/*.png``
    (OUT: the paired dataset by default).
    """
    paired = Path(paired)
    out = Path(out) if out is not None else paired
    rep = score(paired, real, frames_per_episode, overlays, out / "report", log)
    write_json(rep, out / "alignment_report.json")
    return rep


def frame_camera(T, K, motion: dict | None, k: int) -> np.ndarray:
    """``T_cam_from_base`` of frame ``k`` of an episode whose camera motion since the stills is ``motion``
    (``camera_motion.summary``): the calibrated camera, moved when the episode's camera moved."""
    if not motion or not motion["moved"]:
        return np.asarray(T, np.float64)
    return shifted_camera(T, K, motion["track_px"][k])


def sampled_frames(ds: LeRobotDataset, cam: str, per_episode: int) -> list[tuple]:
    """Frames the report scores: ``per_episode`` evenly spaced frames of every episode, as (episode, frame
    index, real frame, state, the twin's robot mask from its label video, the episode's provenance extras)."""
    seg = seg_key(cam)
    samples = []
    for e in range(len(ds)):
        ep = ds.read_episode(e, cameras=[cam, seg])
        for k in np.unique(np.linspace(0, len(ep) - 1, per_episode).astype(int)):
            samples.append((e, int(k), ep.frames[cam][k], ep.state[k], rgb_to_seg(ep.frames[seg][k]) == 1,
                            ep.provenance.extra))
    return samples


def score(paired: Path, real, per_ep: int, n_overlays: int, overlay_dir: Path, log) -> dict:
    ds = LeRobotDataset(paired)
    al = json.loads((paired / "twin_alignment.json").read_text())
    real = Path(real if real is not None else al["real"])
    cam, W, H = al["camera"], al["width"], al["height"]
    K, T = np.asarray(al["K"]), np.asarray(al["T_cam_from_base"])
    dist = None if al["dist"] is None else np.asarray(al["dist"])
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    spec = scene_spec_from_dict(al["spec"], where="twin_alignment.json")
    if seg_key(cam) not in ds.camera_keys:
        raise ValueError(f"{paired}: no {seg_key(cam)!r} video; replay with the 'seg' channel to score robot masks")
    samples = sampled_frames(ds, cam, per_ep)
    # Derived masks live in the pinhole geometry: compare with pinhole silhouettes there.
    imgs = np.stack([undistort(s[2], maps) if maps is not None else s[2] for s in samples])
    joints = np.stack([s[3][:7] for s in samples]).astype(np.float64)
    fingers = np.stack([[s[3][7] / 2] * 2 for s in samples]).astype(np.float64)
    motion = al.get("camera_motion") or {}
    with RobotSilhouette(spec, K, W, H, visual=spec.robot.visual) as sil:
        d = derive_masks(imgs, joints, fingers, sil, T, margin_px=max(1, round(2 * W / 128)))
        pin = []
        for (e, k, *_), q, f in zip(samples, joints, fingers):
            sil.set_camera(frame_camera(T, K, motion.get(str(e)), k))
            sil.set_joints(q, f)
            pin.append(sil.mask())
    valid = d["valid"] & d["known"][None]
    per_episode: dict[int, dict] = {}
    written = 0
    for j, (e, k, frame, state, twin_mask, extra) in enumerate(samples):
        r = per_episode.setdefault(e, {"real_episode": extra.get("real_episode", e), "iou_vs_derived": []})
        obs = d["masks"][j] > 0.5
        r["iou_vs_derived"].append(iou(pin[j] & valid[j], obs & valid[j]))
        if written < n_overlays and k == 0 or (written < n_overlays and j == len(samples) - 1):
            write_overlay(overlay_dir / f"episode{e:04d}_frame{k:04d}.png", frame, twin_mask, None, f"ep {e} frame {k}")
            written += 1
    check = al.get("self_check") or {}
    report = {"paired": str(paired), "real": str(real), "camera": cam, "calibration": al["calibration"],
              "episodes": [{"episode": e, "real_episode": r["real_episode"],
                            "robot_iou_vs_derived_masks": float(np.mean(r["iou_vs_derived"])),
                            **_episode_self_check(check, r["real_episode"])}
                           for e, r in sorted(per_episode.items())]}
    if check:
        report["self_check"] = check
    report["summary"] = {"mean_robot_iou_vs_derived_masks":
                         float(np.mean([x["robot_iou_vs_derived_masks"] for x in report["episodes"]]))}
    prints = [x["object_print_coverage"] for x in report["episodes"] if "object_print_coverage" in x]
    if prints:  # per object: the mean print coverage over the episodes, and the colour fit's (episode 0)
        report["summary"]["object_print_coverage_mean"] = {
            n: float(np.mean([p[n] for p in prints if n in p])) for n in sorted({n for p in prints for n in p})}
        report["prints_in_colour_fit"] = al["colors"].get("prints")
    log(f"[report] {json.dumps(report['summary'])}")
    return report


def _episode_self_check(check: dict, real_episode: int) -> dict:
    """The self-check's object silhouette IoUs of one real episode, and the objects it distrusts there."""
    per = (check.get("objects") or {}).get(str(real_episode))
    if per is None:
        return {}
    out = {"object_silhouette_iou": {n: r.get("silhouette_iou") for n, r in per.items()}}
    prints = {n: r["print_coverage"] for n, r in per.items() if "print_coverage" in r}
    if prints:  # the share of each object's face pixels that show a print (prints.py)
        out["object_print_coverage"] = prints
    bad = {n: r["why"] for n, r in per.items() if not r.get("reliable", True)}
    if bad:
        out["unreliable_objects"] = bad
    return out
