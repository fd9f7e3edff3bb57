"""Align the twin to a recorded dataset (lab or real episodes without masks).

    alignment = align_dataset(dataset_root, twin_spec)     # calibration + objects + colours

1. Camera: when the dataset has calibration stills (``ROOT/calibration/``: full-resolution
   stills of the arm in several poses + a robot-free still, as ``comsim lab record`` writes
   them), from those (``calibrate_stills``: masks from the difference to the robot-free
   still). Otherwise (the fallback) from the episodes themselves: frames sampled across
   episodes are undistorted with the published intrinsics
   (``camera_intrinsics.json``, if any), robot masks are derived (``masks.py``) and the
   camera is calibrated (``calibrate.py``), alternating a few rounds: the first starts
   from the twin spec's nominal camera with a wide uncertainty and a global search; later
   rounds shrink the uncertainty and only refine.
2. Objects: each episode's first frame localizes every object of the spec (``localize.py``),
   against the robot-free still when there are calibration stills (``stills_background``).
3. Colours: table, backdrop, robot and objects from the frames (``colors.py``).

The result is an aligned SceneSpec (camera, colours) plus per-episode object poses; the
hidden truth of a lab recording is never read here.
"""
from __future__ import annotations

import copy
import functools
import json
import time
from pathlib import Path

import numpy as np

from comsim.io.keys import seen_cameras
from comsim.io.lerobot import LeRobotDataset
from comsim.sim.camera import as_K, scale_K
from comsim.sim.spec import SceneSpec
from comsim.twin.calibrate import calibrate_camera
from comsim.twin.frames import CalibrationDataError, CalibrationFrames, undistort, undistort_maps
from comsim.twin.masks import derive_masks
from comsim.twin.silhouette import RobotSilhouette

STILLS_DIR = "calibration"  # calibration stills next to the dataset (written by `comsim lab record`)
INTRINSICS_FILE = "camera_intrinsics.json"  # public: written by `comsim lab record`, or by a user
# (margin px of the uncertainty band, coarse search?) per round, at 128 px wide; scaled with width
ROUNDS = ((16, True), (5, False), (2, False), (2, False))


def camera_key(ds: LeRobotDataset, camera: str | None = None) -> str:
    real = seen_cameras(ds.camera_keys)
    if camera is not None:
        if camera not in real:
            raise CalibrationDataError(f"{ds.root}: no camera {camera!r}; cameras are {real}")
        return camera
    if not real:
        raise CalibrationDataError(f"{ds.root}: no camera video features")
    return real[0]


def dataset_intrinsics(root: Path, spec: SceneSpec, cam: str, width: int, height: int):
    """(K, dist): from ``camera_intrinsics.json`` if present, else the spec's camera K."""
    path = Path(root) / INTRINSICS_FILE
    if path.is_file():
        d = json.loads(path.read_text())
        for key in ("width", "height"):
            if key not in d:
                raise CalibrationDataError(f"{path}: missing field {key!r}")
        if (d["width"], d["height"]) != (width, height):
            raise CalibrationDataError(f"{path}: intrinsics for {d['width']}x{d['height']}, but the videos are "
                                       f"{width}x{height}")
        try:
            K = as_K(d["K"] if "K" in d else [d["fx"], d["fy"], d["cx"], d["cy"]])
        except (KeyError, ValueError) as e:
            raise CalibrationDataError(f"{path}: field 'K': {e}") from None
        dist = np.asarray(d.get("dist_coeffs") or d.get("dist") or [], np.float64)
        return K, (dist if dist.size and np.any(dist) else None)
    c = _spec_camera(spec, cam)
    return scale_K(c.K, c.width, c.height, width, height), None


def _spec_camera(spec: SceneSpec, cam: str):
    try:
        return spec.camera(cam)
    except KeyError:
        if len(spec.cameras) == 1:
            return spec.cameras[0]
        raise CalibrationDataError(f"twin spec: no camera {cam!r} (the dataset's); cameras are "
                                   f"{[c.name for c in spec.cameras]}") from None


def sample_frames(ds: LeRobotDataset, cam: str, per_episode: int, maps=None, episodes=None):
    """Evenly spaced frames of each episode (undistorted): images, joints, fingers, ids."""
    images, joints, fingers, ids = [], [], [], []
    for e in (range(len(ds)) if episodes is None else episodes):
        ep = ds.read_episode(e, cameras=[cam])
        if ep.state.shape[1] < 8:
            raise CalibrationDataError(f"{ds.root}: episode {e}: observation.state has {ep.state.shape[1]} values, "
                                       "expected 7 joints + gripper width")
        for i in np.unique(np.linspace(0, len(ep) - 1, per_episode).astype(int)):
            img = ep.frames[cam][i]
            images.append(undistort(img, maps) if maps is not None else img)
            joints.append(ep.state[i, :7].astype(np.float64))
            fingers.append([ep.state[i, 7] / 2.0] * 2)
            ids.append((e, int(i)))
    return np.stack(images), np.stack(joints), np.asarray(fingers, np.float64), ids


def calibrate_dataset(root, spec: SceneSpec, camera: str | None = None, n_calib: int = 36,
                      per_episode_bg: int = 20, seed: int = 0, init_T=None, log=print) -> dict:
    """Camera calibration from a dataset's own frames (no masks, no board)."""
    t0 = time.perf_counter()
    ds = LeRobotDataset(root)
    cam = camera_key(ds, camera)
    H, W = ds.features[f"observation.images.{cam}"]["shape"][:2]
    K, dist = dataset_intrinsics(root, spec, cam, W, H)
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    images, joints, fingers, ids = sample_frames(ds, cam, per_episode_bg, maps)
    pick = np.unique(np.linspace(0, len(images) - 1, min(n_calib, len(images))).astype(int))
    T = np.asarray(init_T if init_T is not None else _spec_camera(spec, cam).T_cam_from_base, np.float64)
    rounds = []
    with RobotSilhouette(spec, K, W, H, visual=spec.robot.visual) as sil:
        for r, (margin, coarse) in enumerate(ROUNDS):
            margin = max(1, int(round(margin * W / 128)))
            m = derive_masks(images[pick], joints[pick], fingers[pick], sil, T, margin,
                             background=(images, joints, fingers), seed=seed, pose_free=coarse)
            fr = CalibrationFrames(names=[f"ep{e}_f{i}" for e, i in (ids[k] for k in pick)], images=images[pick],
                                   masks=m["masks"], joints=joints[pick], fingers=fingers[pick], K=K, dist=dist,
                                   init_T=T, valid=m["valid"] & m["known"][None])
            res = calibrate_camera(fr, robot=spec, coarse=coarse, fine_visual=spec.robot.visual, seed=seed,
                                   log=log)
            T = np.asarray(res["T_cam_from_base"])
            rounds.append({"margin_px": margin, "mean_iou": res["mean_iou"], "outliers": res["outlier_frames"]})
            log(f"[align] round {r}: mask uncertainty {margin}px, mean IoU {res['mean_iou']:.3f} "
                f"({time.perf_counter() - t0:.0f}s)")
    res.update({"camera": cam, "rounds": rounds, "mask_source": "background model + self-trained colour cues",
                "seconds": round(time.perf_counter() - t0, 1), "masks": m, "frames": fr})
    return res


def stills_folder(root) -> Path | None:
    """``ROOT/calibration`` when it holds calibration stills (color/ + qpos/ + mask/ or background)."""
    d = Path(root) / STILLS_DIR
    if (d / "color").is_dir() and (d / "qpos").is_dir() and ((d / "mask").is_dir() or any(
            (d / f"background{e}").is_file() for e in (".png", ".jpg", ".jpeg"))):
        return d
    return None


def calibrate_stills(folder, spec: SceneSpec, cam: str, seed: int = 0, log=print) -> dict:
    """Camera calibration from a calibration-stills folder (any resolution with the video's
    aspect ratio), starting from the twin spec's nominal camera."""
    from comsim.twin.calibrate import calibrate_folder
    t0 = time.perf_counter()
    res = calibrate_folder(folder, robot=spec, init_T=np.asarray(_spec_camera(spec, cam).T_cam_from_base, np.float64),
                           seed=seed, log=log)
    res.setdefault("rounds", [])
    res.setdefault("mask_source", "given masks")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def stills_background(root, width: int, height: int) -> np.ndarray | None:
    """The calibration's robot-free still, undistorted and resampled to ``width`` x ``height``
    (an object-free background for localizing objects), or None. Cached: do not modify."""
    return _stills_background(str(Path(root).resolve()), int(width), int(height))


@functools.lru_cache(maxsize=4)
def _stills_background(root: str, width: int, height: int) -> np.ndarray | None:
    d = stills_folder(root)
    if d is None:
        return None
    from comsim.twin.frames import load_calibration_folder
    try:
        fr = load_calibration_folder(d)
    except CalibrationDataError:
        return None
    if fr.background is None:
        return None
    import cv2
    return cv2.resize(fr.background, (width, height), interpolation=cv2.INTER_AREA)


def aligned_spec(spec: SceneSpec, cam: str, T: np.ndarray, K, width: int, height: int,
                 colors: dict | None = None) -> SceneSpec:
    """A copy of the twin spec with the calibrated camera (at the data's size) and colours."""
    out = copy.deepcopy(spec)
    c = _spec_camera(out, cam)
    c.name, c.width, c.height = cam, int(width), int(height)
    c.K = [float(v) for v in as_K(K)]
    c.T_cam_from_base = np.asarray(T).tolist()
    if colors:
        from comsim.twin.colors import apply_colors
        apply_colors(out, colors)
    return out
