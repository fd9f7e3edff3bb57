"""The twin's alignment report of a paired dataset: IoU against derived masks and, in the lab, the truth.

Kept apart from the aligning code on purpose: this is the only twin module that opens a
lab recording's hidden truth (``lab_truth.json``), and only to score. (The HTML report of a
whole run is ``comsim.report``; its twin section reads the alignment_report.json written here.)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from comsim.io.keys import seg_key
from comsim.io.lerobot import LeRobotDataset
from comsim.sim.spec import scene_spec_from_dict
from comsim.twin.camera_model import rgb_to_seg
from comsim.twin.frames import undistort, undistort_maps
from comsim.twin.localize import symmetry, yaw_error
from comsim.twin.masks import derive_masks
from comsim.twin.pose_fit import iou, pose_error
from comsim.io.files import write_json
from comsim.twin.overlay import write_overlay
from comsim.twin.silhouette import RobotSilhouette


def alignment_report(paired, real=None, out=None, frames_per_episode: int = 4, overlays: int = 4,
                     log=print) -> dict:
    """Per-dataset alignment report of a paired dataset written by ``replay_dataset``.

    Always: per-episode robot-mask IoU between the twin's silhouette and masks derived from
    the real frames (``masks.py``). Where ground truth exists (a lab recording: the real
    dataset has ``lab_truth.json``), also IoU against the TRUE robot masks, the camera
    pose error, each object's initial position / yaw error and its trajectory error in
    the replay. Hidden truth is read HERE ONLY, for scoring, never for aligning.
    Writes ``OUT/alignment_report.json`` and overlays ``OUT/report/*.png`` (OUT: the
    paired dataset by default).
    """
    paired = Path(paired)
    out = Path(out) if out is not None else paired
    rep = score(paired, real, frames_per_episode, overlays, out / "report", log)
    write_json(rep, out / "alignment_report.json")
    return rep


def _lab_truth(real: Path):
    if real is None or not (real / "lab_truth.json").is_file():
        return None
    from comsim.lab.truth import load_lab_truth
    return load_lab_truth(real)


class _TrueMasks:
    """True robot masks of a lab recording: the lab's own segmentation at the recorded state."""

    def __init__(self, truth):
        from comsim.config import from_dict
        from comsim.lab.cell import LabCell
        from comsim.lab.env import LabEnv
        cell = from_dict(LabCell, truth.info["cell"])
        self.env = LabEnv(cell, task=truth.info["task"]["name"])
        self.truth = truth

    def mask(self, episode: int, k: int, state: np.ndarray) -> np.ndarray:
        tr = self.truth.trajectory(episode)
        sc = self.env.scene
        for i, n in enumerate(str(x) for x in tr["object_names"]):
            sc.set_object_pose(n, tr["object_pos"][k][i], tr["object_quat"][k][i])
        sc.set_robot_qpos(state[:7], float(state[7]))
        if "camera_T_cam_from_base" in tr:  # the lab's camera moved after calibration (comsim.lab.realism)
            self.env.place_camera(tr["camera_T_cam_from_base"][k])
        return self.env.segmentation() == 1

    def close(self):
        self.env.close()


def score(paired: Path, real, per_ep: int, n_overlays: int, overlay_dir: Path, log) -> dict:
    ds = LeRobotDataset(paired)
    al = json.loads((paired / "twin_alignment.json").read_text())
    real = Path(real if real is not None else al["real"])
    cam, W, H = al["camera"], al["width"], al["height"]
    K, T = np.asarray(al["K"]), np.asarray(al["T_cam_from_base"])
    dist = None if al["dist"] is None else np.asarray(al["dist"])
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    spec = scene_spec_from_dict(al["spec"], where="twin_alignment.json")
    seg = seg_key(cam)
    if seg not in ds.camera_keys:
        raise ValueError(f"{paired}: no {seg!r} video; replay with the 'seg' channel to score robot masks")
    truth = _lab_truth(real)
    true_masks = _TrueMasks(truth) if truth is not None else None

    # Sample frames, with the twin's own silhouettes (the replay's segmentation video).
    samples = []  # (episode, k, real frame, state, twin robot mask in the real geometry)
    for e in range(len(ds)):
        ep = ds.read_episode(e, cameras=[cam, seg])
        for k in np.unique(np.linspace(0, len(ep) - 1, per_ep).astype(int)):
            samples.append((e, int(k), ep.frames[cam][k], ep.state[k], rgb_to_seg(ep.frames[seg][k]) == 1,
                            ep.provenance.extra))
    # Derived masks live in the pinhole geometry: compare with pinhole silhouettes there.
    imgs = np.stack([undistort(s[2], maps) if maps is not None else s[2] for s in samples])
    joints = np.stack([s[3][:7] for s in samples]).astype(np.float64)
    fingers = np.stack([[s[3][7] / 2] * 2 for s in samples]).astype(np.float64)
    with RobotSilhouette(spec, K, W, H, visual=spec.robot.visual) as sil:
        d = derive_masks(imgs, joints, fingers, sil, T, margin_px=max(1, round(2 * W / 128)))
        sil.set_camera(T)
        pin = []
        for q, f in zip(joints, fingers):
            sil.set_joints(q, f)
            pin.append(sil.mask())
    valid = d["valid"] & d["known"][None]
    per_episode: dict[int, dict] = {}
    written = 0
    for j, (e, k, frame, state, twin_mask, extra) in enumerate(samples):
        r = per_episode.setdefault(e, {"real_episode": extra.get("real_episode", e), "iou_vs_derived": [],
                                       "iou_vs_truth": []})
        obs = d["masks"][j] > 0.5
        r["iou_vs_derived"].append(iou(pin[j] & valid[j], obs & valid[j]))
        true_m = None
        if true_masks is not None:
            true_m = true_masks.mask(r["real_episode"], k, state)
            r["iou_vs_truth"].append(iou(twin_mask, true_m))
        if written < n_overlays and k == 0 or (written < n_overlays and j == len(samples) - 1):
            label = f"ep {e} frame {k}" + (f" IoU(truth) {r['iou_vs_truth'][-1]:.3f}" if true_m is not None else "")
            write_overlay(overlay_dir / f"episode{e:04d}_frame{k:04d}.png", frame, twin_mask, true_m, label)
            written += 1
    report = {"paired": str(paired), "real": str(real), "camera": cam, "calibration": al["calibration"],
              "episodes": []}
    for e, r in sorted(per_episode.items()):
        row = {"episode": e, "real_episode": r["real_episode"],
               "robot_iou_vs_derived_masks": float(np.mean(r["iou_vs_derived"]))}
        if r["iou_vs_truth"]:
            row["robot_iou_vs_true_masks"] = float(np.mean(r["iou_vs_truth"]))
        if truth is not None:
            row.update(_object_errors(ds, e, r["real_episode"], truth, spec))
        report["episodes"].append(row)
    eps = report["episodes"]
    summary = {"mean_robot_iou_vs_derived_masks": float(np.mean([x["robot_iou_vs_derived_masks"] for x in eps]))}
    if truth is not None:
        d_m, d_deg = pose_error(T, truth.T_cam_from_base)
        summary.update({
            "camera_position_error_m": d_m, "camera_rotation_error_deg": d_deg,
            "mean_robot_iou_vs_true_masks": float(np.mean([x["robot_iou_vs_true_masks"] for x in eps])),
            "object_initial_error_m_mean": float(np.mean(_all(eps, "object_initial_error_m"))),
            "object_initial_error_m_max": float(np.max(_all(eps, "object_initial_error_m"))),
            "object_trajectory_error_m_mean": float(np.mean(_all(eps, "object_trajectory_error_m_mean"))),
            "object_trajectory_error_m_max": float(np.max(_all(eps, "object_trajectory_error_m_max"))),
            "episodes_within_2cm": int(sum(max(x["object_trajectory_error_m_max"].values(), default=np.inf) < 0.02
                                           for x in eps)),
        })
        if any(x.get("object_initial_error_m_refined") for x in eps):  # after the whole-video refinement
            summary.update({
                "object_initial_error_m_mean_refined": float(np.mean(_all(eps, "object_initial_error_m_refined"))),
                "object_initial_error_m_max_refined": float(np.max(_all(eps, "object_initial_error_m_refined"))),
                "object_yaw_error_deg_mean_first_frame": float(np.mean(_all(eps, "object_yaw_error_deg"))),
                "object_yaw_error_deg_mean_refined": float(np.mean(_all(eps, "object_yaw_error_deg_refined"))),
            })
    report["summary"] = summary
    if true_masks is not None:
        true_masks.close()
    log(f"[report] {json.dumps(summary)}")
    return report


def _all(episodes: list[dict], key: str) -> list[float]:
    """Every object's value of ``key`` over all episodes (NaN if none, e.g. nothing found)."""
    vals = [v for x in episodes for v in x.get(key, {}).values()]
    return vals or [float("nan")]


def _yaw(quat) -> float:
    return float(Rotation.from_quat([quat[1], quat[2], quat[3], quat[0]]).as_euler("zyx")[0])


def _object_errors(ds: LeRobotDataset, e: int, real_e: int, truth, spec) -> dict:
    ep = ds.read_episode(e, cameras=[])
    tr = truth.trajectory(real_e)
    names = [str(n) for n in tr["object_names"]]
    found = ep.provenance.extra.get("localized_objects", {})
    refinement = ep.provenance.extra.get("refined_objects") or {}
    refined = refinement.get("objects", {})
    init, yaw_err, mean_err, max_err, init_r, yaw_r = {}, {}, {}, {}, {}, {}
    for o in spec.objects:
        if o.name not in names:
            continue
        i = names.index(o.name)
        f = found.get(o.name) or {}
        if f.get("found"):
            init[o.name] = float(np.linalg.norm(np.asarray(f["pos"][:2]) - tr["object_pos"][0][i][:2]))
            yaw_err[o.name] = float(np.degrees(yaw_error(f["yaw"], _yaw(tr["object_quat"][0][i]), symmetry(o))))
        if o.name in refined:
            g = refined[o.name]
            init_r[o.name] = float(np.linalg.norm(np.asarray(g["pos"][:2]) - tr["object_pos"][0][i][:2]))
            yaw_r[o.name] = float(np.degrees(yaw_error(g["yaw"], _yaw(tr["object_quat"][0][i]), symmetry(o))))
        if "twin_object_pos" in ep.extra:
            err = np.linalg.norm(ep.extra["twin_object_pos"][:, i] - tr["object_pos"][:, i], axis=-1)
            mean_err[o.name], max_err[o.name] = float(err.mean()), float(err.max())
    out = {"object_initial_error_m": init, "object_yaw_error_deg": yaw_err,
           "object_trajectory_error_m_mean": mean_err, "object_trajectory_error_m_max": max_err}
    if refined:  # first-frame numbers above, whole-video (refined) ones here
        out.update({"object_initial_error_m_refined": init_r, "object_yaw_error_deg_refined": yaw_r,
                    "object_refinement": {n: {k: g.get(k) for k in ("refined", "track_residual",
                                                                    "first_frame_track_residual", "candidates")}
                                          for n, g in refined.items()},
                    "object_refinement_simulations": refinement.get("simulations")})
    return out
