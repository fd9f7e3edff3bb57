"""A twin replay of a lab recording scored against the lab's hidden truth.

The twin aligns and replays from the recording alone (it never imports the lab); the lab knows
where its camera and objects really were (``lab_truth.json``) and scores what the twin found:

    add_truth_to_alignment_report(paired, real)   # paired/alignment_report.json gains the truth columns

Per episode: robot IoU of the twin's silhouette against the TRUE robot masks (the lab's own
segmentation at the recorded state, on the same frames the twin's report samples), each
object's initial position / yaw error (first frame, and after the whole-video refinement) and
its trajectory error in the replay; overall: the camera's pose error. Overlays
``paired/report/*.png`` then show the twin's outline (green) against the true mask (magenta).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from comsim.config import from_dict
from comsim.io.files import write_json
from comsim.io.lerobot import LeRobotDataset
from comsim.lab.cell import LabCell
from comsim.lab.env import LabEnv
from comsim.lab.truth import TRUTH_FILE, LabTruth, load_lab_truth
from comsim.sim.camera import as_K
from comsim.sim.spec import scene_spec_from_dict
from comsim.twin.align import aligned_spec, camera_key, dataset_intrinsics, stills_background
from comsim.twin.alignment_report import sampled_frames
from comsim.twin.camera_motion import shifted_image
from comsim.twin.frames import undistort_maps
from comsim.twin.localize import symmetry, yaw_error
from comsim.twin.overlay import write_overlay
from comsim.twin.pose_fit import iou, pose_error
from comsim.twin.replay import FIRST_FRAMES, first_image, robot_exclusion

REPORT_FILE = "alignment_report.json"


def has_truth(real) -> bool:
    """True for a lab recording (it carries the lab's hidden truth)."""
    return real is not None and (Path(real) / TRUTH_FILE).is_file()


class TrueMasks:
    """True robot masks of a lab recording: the lab's own segmentation at the recorded state."""

    def __init__(self, truth: LabTruth):
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


def add_truth_to_alignment_report(paired, real=None, frames_per_episode: int = 4, overlays: int = 4,
                                  log=print) -> dict | None:
    """Add the truth columns to ``paired/alignment_report.json`` (written by the twin's replay); None, and
    nothing written, when ``real`` (default: the recording the replay names) is not a lab recording."""
    paired = Path(paired)
    report_path = paired / REPORT_FILE
    rep = json.loads(report_path.read_text())
    al = json.loads((paired / "twin_alignment.json").read_text())
    real = Path(real if real is not None else al["real"])
    if not has_truth(real):
        return None
    truth = load_lab_truth(real)
    ds = LeRobotDataset(paired)
    spec = scene_spec_from_dict(al["spec"], where="twin_alignment.json")
    ious: dict[int, list[float]] = {}
    written = 0
    true_masks = TrueMasks(truth)
    try:
        samples = sampled_frames(ds, al["camera"], frames_per_episode)
        for j, (e, k, frame, state, twin_mask, extra) in enumerate(samples):
            true_m = true_masks.mask(extra.get("real_episode", e), k, state)
            ious.setdefault(e, []).append(iou(twin_mask, true_m))
            if written < overlays and (k == 0 or j == len(samples) - 1):
                write_overlay(paired / "report" / f"episode{e:04d}_frame{k:04d}.png", frame, twin_mask, true_m,
                              f"ep {e} frame {k} IoU(truth) {ious[e][-1]:.3f}")
                written += 1
    finally:
        true_masks.close()
    eps = rep["episodes"]
    for row in eps:
        row["robot_iou_vs_true_masks"] = float(np.mean(ious[row["episode"]]))
        row.update(_object_errors(ds, row["episode"], row["real_episode"], truth, spec))
    d_m, d_deg = pose_error(np.asarray(al["T_cam_from_base"]), truth.T_cam_from_base)
    summary = rep["summary"]
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
    if rep.get("self_check"):
        summary["self_check_vs_truth"] = self_check_vs_truth(eps)
        summary["uncertainty_vs_truth"] = uncertainty_vs_truth(placement_errors(real, al))
    motion = camera_motion_vs_truth(real, al)
    if motion is not None:
        summary["camera_motion_vs_truth"] = motion
    write_json(rep, report_path)
    log(f"[report vs lab truth] {json.dumps(summary)}")
    return rep


def placement_errors(real, al: dict) -> list[dict]:
    """Every object placement of a twin alignment ``al`` (``twin_alignment.json``) of the lab recording ``real``
    against the truth: {"episode", "object", "error_m" (first-frame position, x-y), "bound_95_m" (the twin's
    95% bound, or None), "flagged" (the self-check distrusts it), "why", "m_per_px"}."""
    truth = load_lab_truth(real)
    rows = []
    for e, objs in sorted(al["objects"].items(), key=lambda kv: int(kv[0])):
        tr = truth.trajectory(int(e))
        names = [str(n) for n in tr["object_names"]]
        checked = al["self_check"]["objects"].get(e, {})
        for name, f in objs.items():
            if name not in names:
                continue
            res = checked.get(name, {})
            unc = res.get("uncertainty") or {}
            err = (float(np.linalg.norm(np.asarray(f["pos"][:2]) - tr["object_pos"][0][names.index(name)][:2]))
                   if f.get("found") else float("inf"))
            rows.append({"episode": int(e), "object": name, "error_m": err, "bound_95_m": unc.get("bound_95_m"),
                         "flagged": not res.get("reliable", True), "why": res.get("why"),
                         "m_per_px": unc.get("m_per_px")})
    return rows


def uncertainty_vs_truth(rows: list[dict], limit_m: float = 0.02) -> dict:
    """The twin's position uncertainty scored on placements (``placement_errors``): how often the 95% bound
    holds (error <= bound), the placements over ``limit_m`` that were trusted (should be none), and the share
    of placements within it that were flagged anyway (false alarms)."""
    bounded = [r for r in rows if r["bound_95_m"] is not None]
    good = [r for r in rows if r["error_m"] <= limit_m]
    bad = [r for r in rows if r["error_m"] > limit_m]
    return {"placements": len(rows), "with_bound": len(bounded),
            "bound_holds": sum(r["error_m"] <= r["bound_95_m"] for r in bounded),
            "bound_coverage": (sum(r["error_m"] <= r["bound_95_m"] for r in bounded) / len(bounded)
                               if bounded else None),
            "within_limit": len(good), "within_limit_flagged": sum(r["flagged"] for r in good),
            "false_flag_rate": sum(r["flagged"] for r in good) / len(good) if good else None,
            "over_limit": len(bad), "over_limit_flagged": sum(r["flagged"] for r in bad),
            "over_limit_trusted": [{"episode": r["episode"], "object": r["object"], "error_m": round(r["error_m"], 4)}
                                   for r in bad if not r["flagged"]],
            "limit_m": limit_m}


def true_image_shift(T_still: np.ndarray, T_frame: np.ndarray, K) -> np.ndarray:
    """How far (px, x y) the lab's camera at ``T_frame`` sees the image centre's content move from where the
    camera at ``T_still`` (the calibration stills') sees it: a far point on the still camera's axis."""
    fx, fy = float(as_K(K)[0]), float(as_K(K)[1])
    R0, t0 = T_still[:3, :3], T_still[:3, 3]
    X = -R0.T @ t0 + R0.T @ np.array([0.0, 0.0, 100.0])
    p = T_frame[:3, :3] @ X + T_frame[:3, 3]
    return np.array([fx * p[0] / p[2], fy * p[1] / p[2]])


def true_first_frames(real, e: int, spec) -> dict:
    """Episode ``e``'s first frames of the lab recording ``real`` as the twin localizes objects in them
    (``replay.first_image``: undistorted, the median of the first frames) with the lab's TRUE camera of that
    episode, to test localization and colours without calibration: {"image", "still" (the robot-free still as
    that camera saw it), "arm" (the arm's pixels, dilated), "K", "T", "state" (the first row), "poses" {name:
    (x, y, yaw)} the objects' true first poses}. ``spec``: the twin's nominal spec (its camera's size)."""
    truth, ds = load_lab_truth(real), LeRobotDataset(real)
    cam = camera_key(ds)
    H, W = ds.features[f"observation.images.{cam}"]["shape"][:2]
    K, dist = dataset_intrinsics(Path(real), spec, cam, W, H)
    K = np.asarray(as_K(K), np.float64)
    tr = truth.trajectory(e)
    T = np.asarray(tr["camera_T_cam_from_base"][0] if "camera_T_cam_from_base" in tr else truth.T_cam_from_base)
    still = shifted_image(stills_background(real, W, H), true_image_shift(truth.T_cam_from_base, T, K), K)
    ep = ds.read_window(e, 0, FIRST_FRAMES, cameras=[cam])
    img = first_image(ep, cam, None if dist is None else undistort_maps(K, dist, W, H))
    arm = robot_exclusion(aligned_spec(spec, cam, T, K, W, H), cam, ep.state[0, :7], float(ep.state[0, 7]))
    poses = {str(n): (float(p[0]), float(p[1]), _yaw(q))
             for n, p, q in zip(tr["object_names"], tr["object_pos"][0], tr["object_quat"][0])}
    return {"image": img, "still": still, "arm": arm, "K": K, "T": T, "state": ep.state[0], "poses": poses}


def camera_motion_vs_truth(real, al: dict) -> dict | None:
    """The twin's per-frame camera motion (``al["camera_motion"]``, px) against the lab's: per episode the true
    mean shift and the error of the twin's track (mean, rms, max over frames), and over all frames; None
    when the alignment measured none."""
    motion = al.get("camera_motion") or {}
    if not motion:
        return None
    truth = load_lab_truth(real)
    per, errs = {}, []
    for e, m in sorted(motion.items(), key=lambda kv: int(kv[0])):
        tr = truth.trajectory(int(e))
        track = np.asarray(m["track_px"], np.float64)
        cams = tr.get("camera_T_cam_from_base")
        true = (np.stack([true_image_shift(truth.T_cam_from_base, Tk, al["K"]) for Tk in cams]) if cams is not None
                else np.zeros_like(track))
        applied = track if m["moved"] else np.zeros_like(track)  # what the render followed
        d = np.linalg.norm(applied - true, axis=1)
        errs.append(d)
        per[e] = {"true_mean_px": true.mean(0).round(3).tolist(), "moved": m["moved"],
                  "error_px_mean": round(float(d.mean()), 4), "error_px_max": round(float(d.max()), 4)}
    d = np.concatenate(errs)
    return {"episodes": per, "error_px_mean": float(d.mean()), "error_px_rms": float(np.sqrt((d ** 2).mean())),
            "error_px_max": float(d.max())}


def self_check_vs_truth(episodes: list[dict]) -> dict:
    """The twin's self-check scored against the truth: the initial position errors (first frame, and after the
    whole-video refinement where there was one) of the object placements it trusted and of those it named
    unreliable (the episodes' ``unreliable_objects``)."""
    out = {}
    for key in ("object_initial_error_m", "object_initial_error_m_refined"):
        trusted, flagged = [], []
        for row in episodes:
            bad = row.get("unreliable_objects") or {}
            for name, err in (row.get(key) or {}).items():
                (flagged if name in bad else trusted).append(float(err))
        if trusted or flagged:
            out[key] = {"trusted": len(trusted), "trusted_max_m": max(trusted, default=None),
                        "trusted_within_2cm": sum(v <= 0.02 for v in trusted),
                        "unreliable": len(flagged), "unreliable_m": sorted(flagged)}
    return out


def _all(episodes: list[dict], key: str) -> list[float]:
    """Every object's value of ``key`` over all episodes (NaN if none, e.g. nothing found)."""
    vals = [v for x in episodes for v in x.get(key, {}).values()]
    return vals or [float("nan")]


def _yaw(quat) -> float:
    return float(Rotation.from_quat([quat[1], quat[2], quat[3], quat[0]]).as_euler("zyx")[0])


def _object_errors(ds: LeRobotDataset, e: int, real_e: int, truth: LabTruth, spec) -> dict:
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


def replay_and_score(real, twin, out, log=print, **replay_kw) -> Path:
    """``comsim.twin.replay.replay_dataset`` of a recording, then, for a lab recording, the truth columns
    added to its alignment report (when the replay wrote one)."""
    from comsim.twin.replay import replay_dataset

    paired = Path(replay_dataset(real, twin, out, log=log, **replay_kw))
    if (paired / REPORT_FILE).is_file() and has_truth(real):
        add_truth_to_alignment_report(paired, real, log=log)
    return paired
