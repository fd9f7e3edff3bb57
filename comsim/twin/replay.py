"""Replay real episodes in the twin -> a paired LeRobotDataset (``comsim twin replay``).

    replay_dataset(real="runs/lab_push", twin="configs/twin/panda_cell.yaml", out="runs/paired")

1. Alignment (once per dataset, cached in ``OUT/twin_alignment.json``): the camera from a
   given ``calibration.json``, else from the dataset's calibration stills
   (``REAL/calibration/``: robot stills + a robot-free still, as ``comsim lab record``
   writes them), else from the dataset's own frames (``align.py``),
   and the colours (``colors.py``). The published lens distortion, if any, is read from
   the dataset's ``camera_intrinsics.json``; nothing else about the recording is assumed.
   Every episode's camera motion since the stills is measured on its frames (``camera_motion.py``),
   its objects are localized in its first frames (``localize.py``) with a position uncertainty each
   (``uncertainty.py``), and the twin checks itself (``selfcheck.py``: the calibration's IoU per
   frame, how far each episode's camera moved from the stills, each object's silhouette against
   what the first frames show there, each object's 95% position bound). A twin that fails is refused by name before any episode is written, or, with
   ``on_unreliable="mark"``, replayed with the episodes concerned marked ``twin_unreliable``.
2. Per episode, from the objects found in its first frames:
   - ``kinematic``: the robot is set to the recorded joint positions frame by frame;
     objects stay where they were found (no contact dynamics);
   - ``physics``: the twin starts from the first recorded state and its servos track
     the recorded actions, each held for the time to the next frame's timestamp
     (so dropped or irregular frames stay in sync); objects move by contact. A cube's
     yaw cannot be read from a small first frame, yet which face the finger meets decides
     a push: each object the replay touches gets the initial pose (yaw, offset across the
     arm's approach) whose physics replay best explains the whole real video (``track.py``;
     ``refine=False``: the first-frame estimate).
   The twin is rendered through the real camera (its size and distortion), frame by frame where
   the episode's camera moved since the stills (a camera that did not gets the same pairs as
   without that step).
3. Each output episode holds ``observation.images.<cam>`` (the real video),
   ``observation.images.<cam>_sim`` (the twin), optionally ``<cam>_sim_seg`` (palette
   labels) and ``<cam>_sim_depth`` (1 grey level per cm), the real actions and states, the
   twin's own state and object poses (``twin_state``, ``twin_object_pos``,
   ``twin_object_quat``), and provenance with the aligned twin spec's hash.

Resumable: episodes already staged in OUT are skipped (``DatasetWriter(resume=True)``).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import yaml
from tqdm.auto import tqdm

from comsim.episode import SOURCES, Episode, Provenance
from comsim.errors import InputError
from comsim.io.keys import CONTROLS, depth_key, normal_key, seg_key, sim_key
from comsim.io.lerobot import DatasetError, DatasetWriter, LeRobotDataset, dataset_complete
from comsim.sim.camera import as_K, scale_K
from comsim.sim.scene import yaw_quat
from comsim.sim.spec import SceneSpec, load_scene_spec, scene_spec_from_dict, spec_hash
from comsim.twin.align import (aligned_spec, calibrate_dataset, calibrate_stills, camera_key, dataset_intrinsics,
                               stills_background, stills_folder)
from comsim.twin.alignment_report import frame_camera
from comsim.twin.calibrate import load_calibration
from comsim.io.labels import seg_to_rgb
from comsim.twin.camera_model import RealCameraView, depth_to_rgb, normal_to_rgb, with_render_camera
from comsim.twin.colors import estimate_colors, twin_scene
from comsim.twin.frames import CalibrationDataError, undistort, undistort_maps
from comsim.twin.camera_motion import episode_motion, shifted_image
from comsim.twin.camera_motion import summary as motion_summary
from comsim.twin.localize import EvidenceMaps, localize_objects, object_px
from comsim.twin.prints import body_pixels
from comsim.io.files import atomic_output, write_json
from comsim.io.lock import output_lock
from comsim.io.paths import OutputFolderError, claim_output, is_inside
from comsim.twin.selfcheck import (ON_UNRELIABLE, UnreliableTwinError, check_alignment, episode_verdict,
                                   log_self_check, object_residual, unreliable_message)
from comsim.twin.silhouette import RobotSilhouette
from comsim.twin.uncertainty import object_uncertainty, recording_clarity

ALIGNMENT_FILE = "twin_alignment.json"
UNCERTAINTY_KEYS = ("contour_residual_px", "pose_covariance")  # the calibration's, for the objects' uncertainty
MODES = ("physics", "kinematic")
FIRST_FRAMES = 6  # frames averaged (median) to localize objects: less noise, arm not there yet


def _check_episode(ds: LeRobotDataset, e: int, ep: Episode, cam: str) -> None:
    where = f"{ds.root}: episode {e}"
    if ep.state.shape[1] < 8:
        raise DatasetError(f"{where}: observation.state has {ep.state.shape[1]} values, expected 7 joints + gripper")
    if ep.action.shape[1] < 8:
        raise DatasetError(f"{where}: action has {ep.action.shape[1]} values, expected 7 joints + gripper")
    if len(ep.frames[cam]) != len(ep):
        raise DatasetError(f"{where}: {len(ep.frames[cam])} video frames for {len(ep)} rows")
    t = ep.timestamps.astype(np.float64)
    if len(t) > 1 and np.any(np.diff(t) <= 0):
        raise DatasetError(f"{where}: timestamps must increase (field 'timestamp')")


def first_image(ep: Episode, cam: str, maps) -> np.ndarray:
    img = np.median(ep.frames[cam][:FIRST_FRAMES], axis=0).astype(np.uint8)
    return undistort(img, maps) if maps is not None else img


def robot_exclusion(spec: SceneSpec, cam: str, q7, width: float, K=None) -> np.ndarray:
    """The arm's pixels (dilated) in the aligned twin's pinhole view (``K``: the episode's, default the
    spec camera's): not an object."""
    import cv2
    c = spec.camera(cam)
    with RobotSilhouette(spec, c.K if K is None else K, c.width, c.height, visual=spec.robot.visual) as sil:
        sil.set_camera(np.asarray(c.T_cam_from_base))
        sil.set_joints(q7, [width / 2, width / 2])
        m = sil.mask()
    return cv2.dilate(m.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0


def episode_camera_motion(ds: LeRobotDataset, e: int, spec: SceneSpec, cam: str, maps, background) -> dict | None:
    """Episode ``e``'s camera motion since the calibration stills (``camera_motion.episode_motion``: every
    frame registered to the robot-free still, the arm's pixels left out), or None without a still."""
    import cv2
    if background is None:
        return None
    ep = ds.read_episode(e, cameras=[cam])
    frames = [undistort(f, maps) if maps is not None else f for f in ep.frames[cam]]
    c = spec.camera(cam)
    k5 = np.ones((5, 5), np.uint8)
    with RobotSilhouette(spec, c.K, c.width, c.height, visual=spec.robot.visual) as sil:
        sil.set_camera(np.asarray(c.T_cam_from_base))
        excl = []
        for st in ep.state:
            sil.set_joints(st[:7], [st[7] / 2, st[7] / 2])
            excl.append(cv2.dilate(sil.mask().astype(np.uint8), k5) > 0)
    return episode_motion(np.stack(frames), background, np.stack(excl), ep.timestamps, c.K)


def first_shift(motion: dict | None) -> np.ndarray | None:
    """The image shift (px) of an episode's first frames when its camera moved (``motion["moved"]``), else None."""
    if not motion or not motion["moved"]:
        return None
    return np.mean(np.asarray(motion["track_px"], np.float64)[:FIRST_FRAMES], axis=0)


def object_poses(found: dict, spec: SceneSpec) -> dict:
    """{name: (pos, quat)} for the objects that were found (the rest keep the spec's pose)."""
    out = {}
    for o in spec.objects:
        r = found.get(o.name)
        if r and r["found"]:
            out[o.name] = (np.asarray(r["pos"]), yaw_quat(r["yaw"]))
    return out


def object_fit(background) -> dict:
    """How the objects' poses are fitted (``localize.localize_objects``' ``fit``), and why: "painted" (the
    robot-free still with the object's faces painted over it, fitted to the pixels: no farther bias) where the
    recording has calibration stills and so a robot-free ``background``; "evidence" (the thresholded colour
    evidence map, which places cubes 0.1-0.65 px farther than they are on the lab cells) where it has none.
    Against the lab's truth the painted fit placed objects closer on every cell it was tried on, the built-in lab
    included (docs/results/2026-12-07-twin-painted-everywhere.md)."""
    if background is not None:
        return {"fit": "painted", "why": "the recording has a robot-free still to paint the objects on"}
    return {"fit": "evidence", "why": "the recording has no calibration stills (no robot-free still)"}


def first_frames_objects(ds: LeRobotDataset, e: int, spec: SceneSpec, cam: str, maps, background,
                         motion: dict | None = None, fit: str = "evidence") -> dict:
    """Episode ``e``'s objects from its first frames in the aligned twin ``spec`` (its camera):
    {"image", "state" (first row), "found" (``localize_objects``), "residual" (``selfcheck.object_residual``
    of each found object; the twin's own check, no truth), "K" (the episode's), "evidence" (the first frames'
    ``EvidenceMaps``)}. When the episode's camera moved since the stills (``motion``, ``episode_camera_motion``),
    objects are localized with the principal point moved by the first frames' shift and against the still
    moved by it. ``fit``: ``localize_objects``'."""
    c = spec.camera(cam)
    K, T = np.asarray(c.K, np.float64), np.asarray(c.T_cam_from_base)
    ep = ds.read_window(e, 0, min(FIRST_FRAMES, ds.episode_length(e)), cameras=[cam])
    img = first_image(ep, cam, maps)
    shift = first_shift(motion)
    excl_K = None
    if shift is not None:  # the camera moved since the stills
        background = shifted_image(background, shift, K)
        K = K + [0.0, 0.0, shift[0], shift[1]]
        excl_K = K
    excl = robot_exclusion(spec, cam, ep.state[0, :7], float(ep.state[0, 7]), K=excl_K)
    colors = {o.name: list(o.rgba) for o in spec.objects}
    found = localize_objects(img, spec.objects, K, T, robot_mask=excl, colors=colors, background=background,
                             table=spec.table, fit=fit)
    ev = EvidenceMaps(img, colors, max((object_px(o, K, T) for o in spec.objects), default=8.0), background, excl)
    residual = {o.name: (object_residual(ev, o, (found[o.name]["pos"][0], found[o.name]["pos"][1],
                                                 found[o.name]["yaw"]), K, T)
                         if found[o.name]["found"] else {"not_found": True})
                for o in spec.objects}
    prints = {}
    if fit == "painted":  # which pixels show each object's body colour, and what a print covers (prints.py)
        for o in spec.objects:
            g = found[o.name]
            if g["found"] and (b := body_pixels(ev, o, (g["pos"][0], g["pos"][1], g["yaw"]), K, T, o.rgba)):
                prints[o.name] = b
                residual[o.name]["print_coverage"] = b["print_coverage"]
    return {"image": img, "state": ep.state[0], "found": found, "residual": residual, "K": [float(v) for v in K],
            "evidence": ev, "prints": prints}


# ----------------------------------------------------------------- alignment


def align(real: Path, spec: SceneSpec, calibration: Path | None = None, camera: str | None = None,
          log=print) -> dict:
    """Camera + colours for replaying ``real`` in ``spec``'s twin (JSON-able dict)."""
    ds = LeRobotDataset(real)
    cam = camera_key(ds, camera)
    H, W = ds.features[f"observation.images.{cam}"]["shape"][:2]
    K, dist = dataset_intrinsics(real, spec, cam, W, H)
    if calibration is not None:
        cal = load_calibration(calibration)
        cw, ch = cal.get("width", W), cal.get("height", H)
        K = scale_K(cal["K"], cw, ch, W, H) if (cw, ch) != (W, H) else cal["K"]
        if cal.get("dist"):
            dist = np.asarray(cal["dist"], np.float64)
        T = cal["T_cam_from_base"]
        calib = {"source": str(calibration), "mean_iou": cal.get("mean_iou"), "converged": cal.get("converged"),
                 **{k: cal[k] for k in UNCERTAINTY_KEYS if k in cal}}
    else:
        stills = stills_folder(real)
        if stills is not None:  # the cell's calibration stills: finer pixels, a robot-free still
            res = calibrate_stills(stills, spec, cam, log=log)
            source = str(stills)
        else:
            res = calibrate_dataset(real, spec, camera=cam, log=log)
            source = "dataset frames"
        T = np.asarray(res["T_cam_from_base"])
        calib = {"source": source, "mean_iou": res["mean_iou"], "converged": res["converged"],
                 "per_frame_iou": res["per_frame_iou"], "outlier_frames": res["outlier_frames"],
                 "rounds": res["rounds"], "mask_source": res["mask_source"], "seconds": res["seconds"],
                 **{k: res[k] for k in (*UNCERTAINTY_KEYS, "sharpened", "not_sharpened", "markers_fitted") if k in res}}
        if not res["converged"]:
            raise CalibrationDataError(f"{real}: the camera calibration from {source} did not converge "
                                       f"({res.get('why_not_converged')}); best mean IoU {res['mean_iou']:.3f}")
    aligned = aligned_spec(spec, cam, T, K, W, H)
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    al = {"camera": cam, "width": W, "height": H, "K": [float(v) for v in as_K(K)],
          "dist": None if dist is None else [float(v) for v in dist], "T_cam_from_base": np.asarray(T).tolist()}
    motions = camera_motions(ds, spec, al)
    # episode 0's objects give the colours (seen through its camera, which may have moved since the stills);
    # every episode's are localized and checked by self_check_alignment
    background = stills_background(real, W, H)
    fit = object_fit(background)
    f0 = first_frames_objects(ds, 0, aligned, cam, maps, background, motions[0], fit["fit"])
    seen = aligned if first_shift(motions[0]) is None else aligned_spec(spec, cam, T, f0["K"], W, H)
    colors = estimate_colors(seen, cam, f0["image"], f0["state"][:7].astype(np.float64), float(f0["state"][7]),
                             object_poses(f0["found"], aligned),
                             valid=None if maps is None else _valid_after_undistort(maps),
                             body={n: b["body"] for n, b in f0["prints"].items() if b["print_pixels"]} or None)
    if f0["prints"]:  # what the objects' colours were matched on
        colors["prints"] = {n: {k: b[k] for k in ("print_coverage", "face_pixels", "print_pixels")}
                            for n, b in f0["prints"].items()}
    final = aligned_spec(spec, cam, T, K, W, H, colors)
    log(f"[replay] aligned: camera from {calib['source']}, colour residuals "
        f"{ {k: round(v, 1) for k, v in colors['residual'].items()} }")
    al = {"real": str(real), **al, "calibration": calib, "colors": colors, "input_spec_hash": spec_hash(spec),
          "nominal_object_rgba": {o.name: list(o.rgba) for o in spec.objects},
          "spec": dataclasses.asdict(final), "spec_hash": spec_hash(final), "object_fit": fit}
    al.update(self_check_alignment(ds, spec, al, motions))
    return al


def _valid_after_undistort(maps) -> np.ndarray:
    """Pixels of the undistorted image that come from inside the real image."""
    mx, my = maps
    H, W = mx.shape
    return (mx >= 0) & (mx <= W - 1) & (my >= 0) & (my <= H - 1)


# ----------------------------------------------------------------- replay


def refine_objects(ep: Episode, al: dict, spec: SceneSpec, found: dict, background, maps, fps: float,
                   K=None, log=None) -> dict:
    """Initial object poses whose physics replay best reproduces the objects in the whole
    real video (``track.py``): {"objects": {name: {...}}, "simulations"}. (No wall time: it
    goes into the episode's provenance, and the same inputs must give byte-identical datasets.)"""
    from comsim.twin.track import Evidence, PhysicsReplay, refine_initial_poses
    cam = al["camera"]
    frames = ep.frames[cam]
    if maps is not None:
        frames = np.stack([undistort(f, maps) for f in frames])
    K = np.asarray(al["K"] if K is None else K)  # the episode's: a camera moved since the stills shifts it
    ev = Evidence(frames, ep.state, spec, cam, K, np.asarray(al["T_cam_from_base"]),
                  colors=al["nominal_object_rgba"], background=background)
    return refine_initial_poses(PhysicsReplay(spec, ep.state, ep.action, ep.timestamps), spec, found, ev, fps, log=log)


def replay_episode(ds: LeRobotDataset, e: int, al: dict, spec: SceneSpec, mode: str,
                   channels=("seg", "normal"), refine: bool = True, log=None) -> Episode:
    cam = al["camera"]
    ep = ds.read_episode(e)
    _check_episode(ds, e, ep, cam)
    K, dist = np.asarray(al["K"]), (None if al["dist"] is None else np.asarray(al["dist"]))
    W, H = al["width"], al["height"]
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    bg = stills_background(ds.root, W, H)
    # Objects were localized in every episode's first frames by the alignment (by their nominal colours:
    # the matched ones describe the twin's lighting, not what the camera sees).
    found = al["objects"][str(e)]
    motion = (al.get("camera_motion") or {}).get(str(e))
    shift = first_shift(motion)
    if shift is not None:  # the camera moved since the stills: the still as it sees it
        bg = shifted_image(bg, shift, K)
    refined = None
    poses = object_poses(found, spec)
    if mode == "physics" and refine and any(r["found"] for r in found.values()):
        refined = refine_objects(ep, al, spec, found, bg, maps, float(ds.fps), K=al["episode_K"][str(e)], log=log)
        poses = {n: (np.asarray(r["pos"]), yaw_quat(r["yaw"])) for n, r in refined["objects"].items()}
    render_spec, render_cam, margin = with_render_camera(spec, cam, dist)
    # the aligned spec carries the robot's tint (robot.tint); alignments written without it keep it in colors
    scene = twin_scene(render_spec, None if render_spec.robot.tint is not None else al["colors"]["robot_tint"])
    scene.reset(arm_qpos=ep.state[0, :7], object_poses=poses)
    scene.set_robot_qpos(ep.state[0, :7], float(ep.state[0, 7]))
    view = RealCameraView(scene, cam, render_cam, K, dist, W, H, margin)
    n = len(ep)
    t = ep.timestamps.astype(np.float64)
    # a camera that moved since the stills is followed frame by frame; one that did not is left alone
    follow = shift is not None
    T = np.asarray(al["T_cam_from_base"], np.float64)
    sim, seg, depth, normal, tstate, opos, oquat = [], [], [], [], [], [], []
    try:
        for k in range(n):
            if mode == "kinematic":
                scene.set_robot_qpos(ep.state[k, :7], float(ep.state[k, 7]))
            if follow:
                view.place_camera(frame_camera(T, K, motion, k))
            sim.append(view.rgb())
            if "seg" in channels:
                seg.append(seg_to_rgb(view.segmentation()))
            if "depth" in channels:
                depth.append(depth_to_rgb(view.depth()))
            if "normal" in channels:
                normal.append(normal_to_rgb(view.normals()))
            tstate.append(scene.get_state())
            p = [scene.object_pose(nm) for nm in scene.object_names]
            opos.append([a for a, _ in p])
            oquat.append([q for _, q in p])
            if mode == "physics" and k < n - 1:
                steps = max(1, int(round((t[k + 1] - t[k]) / scene.control_dt)))
                scene.step(ep.action[k, :8], n_substeps=steps * scene.spec.physics.substeps)
    finally:
        view.close()
    frames = {cam: ep.frames[cam], sim_key(cam): np.stack(sim)}
    if seg:
        frames[seg_key(cam)] = np.stack(seg)
    if depth:
        frames[depth_key(cam)] = np.stack(depth)
    if normal:
        frames[normal_key(cam)] = np.stack(normal)
    src = ep.provenance.source if ep.provenance.source in SOURCES else "real"
    prov = Provenance(source=src, task=ep.provenance.task or ep.task, seed=ep.provenance.seed,
                      twin_spec_hash=al["spec_hash"],
                      extra={"real_dataset": al["real"], "real_episode": e, "replay_mode": mode,
                             "camera_calibration": al["calibration"]["source"],
                             "localized_objects": found, "real_provenance": ep.provenance.to_dict()})
    if refined is not None:  # initial poses from the whole video (analysis by synthesis over time)
        prov.extra["refined_objects"] = refined
    if follow:  # the camera's motion since the stills, followed by the render
        prov.extra["camera_motion_px"] = {"offset": motion["offset_px"], "drift": motion["drift_px"]}
    unreliable = episode_verdict(al["self_check"], e)
    if unreliable:  # written only with on_unreliable="mark": what the twin's self-check distrusts here
        prov.extra["twin_unreliable"] = unreliable
    extra = {"twin_state": np.asarray(tstate, np.float32)}
    if scene.object_names:
        extra["twin_object_pos"] = np.asarray(opos, np.float32)
        extra["twin_object_quat"] = np.asarray(oquat, np.float32)
    return Episode(frames=frames, action=ep.action, state=ep.state, fps=float(ds.fps), task=ep.task,
                   success=ep.success, provenance=prov, extra=extra)


def replay_dataset(real, twin, out, mode: str = "physics", calibration=None, camera: str | None = None,
                   channels=("seg", "normal"), episodes=None, report: bool = True, close: bool = True,
                   refine: bool = True, workers: int = 1, on_unreliable: str = "refuse", log=print) -> Path:
    """Replay every episode of ``real`` in the twin ``twin`` (YAML path or SceneSpec) into ``out``.

    ``episodes``: a subset to do now; with ``close=False`` they are only staged, so that
    several processes can share the work and a last call (all episodes) joins them.
    ``workers``: episodes replayed in that many spawned processes, handed out one at a time
    (each episode's replay depends on nothing else: the same files for any number).
    ``report``: then write ``OUT/alignment_report.json`` (needs the "seg" channel).
    ``refine``: in physics mode, choose each moving object's initial pose by replaying
    candidates against the whole video (``track.py``), not from the first frame alone.
    ``on_unreliable``: what to do when the twin's self-check (``selfcheck.py``: the calibration's
    per-frame IoU, each object's silhouette against the first frames) distrusts the camera or an
    object: "refuse" raises ``UnreliableTwinError`` naming them before any episode is written
    (the alignment and ``alignment_report.json`` with the self-check are kept in OUT); "mark" replays
    and writes the episodes concerned with ``twin_unreliable`` in their provenance.
    """
    if mode not in MODES:
        raise InputError(None, "mode", f"one of {MODES}", mode)
    if on_unreliable not in ON_UNRELIABLE:
        raise InputError(None, "on_unreliable", f"one of {ON_UNRELIABLE}", on_unreliable)
    if workers < 1:
        raise InputError(None, "workers", "at least 1", workers)
    unknown = [c for c in channels if c not in CONTROLS]
    if unknown:
        raise InputError(None, "--channels", f"some of {list(CONTROLS)}", unknown)
    real, out = Path(real), Path(out)
    if is_inside(out, real) or is_inside(real, out):
        raise InputError(out, "--out", f"a folder outside --real {real}", "the same folder or one inside the other")
    spec = twin if isinstance(twin, SceneSpec) else load_scene_spec(twin)
    ds = LeRobotDataset(real)
    camera_key(ds, camera)
    for name in ("observation.state", "action"):  # every episode's, before the alignment is spent and written
        shape = ds.features.get(name, {}).get("shape", [0])
        if int(np.prod(shape)) < 8:
            raise DatasetError(f"{ds.root}/meta/info.json: {name}: expected 7 joints + gripper (8 values), "
                               f"got shape {shape}")
    ds.check_finite()  # NaN states would replay into NaN twin states and be written as pairs
    ds.check_videos()  # a corrupt video is named now, not after the episodes before it are replayed
    if calibration is not None:
        load_calibration(calibration)
    al_path = out / ALIGNMENT_FILE
    # Only a new or empty folder, or this replay's own (alignment.json of the same data and twin).
    claim_output(out, ALIGNMENT_FILE, {"input_spec_hash": spec_hash(spec), "real": str(real)},
                 ("input_spec_hash", "real"), "comsim twin replay")
    if al_path.is_file():  # resume: the alignment is part of what was already written
        al = json.loads(al_path.read_text())
        if al.get("input_spec_hash") != spec_hash(spec) or al.get("real") != str(real):
            raise OutputFolderError(f"{al_path}: was made for {al.get('real')} and twin spec {al.get('input_spec_hash')}; "
                             f"now asked for {real} and {spec_hash(spec)}: use a new --out folder")
    with output_lock(out, "comsim twin replay"):  # one writer per output; everything above wrote nothing
        return _replay(ds, spec, real, out, mode, calibration, camera, channels, episodes, report, close, refine,
                       workers, on_unreliable, log)


def _replay(ds, spec, real, out, mode, calibration, camera, channels, episodes, report, close, refine, workers,
            on_unreliable, log) -> Path:
    """The writing part of ``replay_dataset``, with the output locked and every input checked."""
    al_path = out / ALIGNMENT_FILE
    if al_path.is_file():
        al = json.loads(al_path.read_text())
        if dataset_complete(out):
            log(f"[replay] {out} is already complete")
            _report(out, real, report and "seg" in channels, log)
            return out
    else:
        al = align(real, spec, Path(calibration) if calibration else None, camera, log=log)
        al["mode"] = mode
        out.mkdir(parents=True, exist_ok=True)
        write_json(al, al_path)
        with atomic_output(out / "twin_aligned.yaml") as tmp:  # the aligned cell, for `comsim generate --scene`
            tmp.write_text(yaml.safe_dump(al["spec"], sort_keys=False))
    if "self_check" not in al:  # an alignment written without the self-check: add it before replaying
        al.update(self_check_alignment(ds, spec, al))
        write_json(al, al_path)
    check = al["self_check"]
    log_self_check(check, log)
    refusal = unreliable_message(check, str(al_path))
    if refusal and on_unreliable == "refuse":
        write_json({"paired": str(out), "real": str(real), "camera": al["camera"], "calibration": al["calibration"],
                    "self_check": check, "refused": refusal}, out / "alignment_report.json")
        raise UnreliableTwinError(f"{refusal}. Nothing was replayed; the self-check is in "
                                  f"{out / 'alignment_report.json'} (--on-unreliable mark writes the episodes "
                                  "marked unreliable)")
    aligned = scene_spec_from_dict(al["spec"], where=str(al_path))
    writer = DatasetWriter(out, ds.fps, resume=True)
    todo = [e for e in (range(len(ds)) if episodes is None else episodes) if e not in writer.finished_episodes]
    log(f"[replay] episodes to replay: {todo} ({len(writer.finished_episodes)} already staged)")
    bar = tqdm(total=len(todo), desc=f"twin replay ({mode})", unit="episode")
    if workers > 1 and len(todo) > 1:
        import multiprocessing as mp
        import os

        from comsim.workers import exit_with_parent
        jobs = [(str(real), str(out), al, mode, tuple(channels), refine, e) for e in todo]
        # workers end with this process: a rerun after a kill never races one staging the same episode
        with mp.get_context("spawn").Pool(min(workers, len(todo)), initializer=exit_with_parent,
                                          initargs=(os.getpid(),)) as pool:
            for _ in pool.imap_unordered(_replay_and_stage, jobs):
                bar.update(1)
    else:
        for e in todo:
            writer.add_episode(replay_episode(ds, e, al, aligned, mode, channels, refine=refine, log=log),
                               episode_index=e)
            bar.update(1)
    bar.close()
    if not close:
        return out
    writer.close()
    _report(out, real, report and "seg" in channels, log)
    return out


def _replay_and_stage(job: tuple) -> int:
    """Worker of ``replay_dataset(workers=N)``: replay one episode and stage it in OUT."""
    real, out, al, mode, channels, refine, e = job
    ds = LeRobotDataset(real)
    spec = scene_spec_from_dict(al["spec"], where=str(Path(out) / ALIGNMENT_FILE))
    DatasetWriter(out, ds.fps, resume=True).add_episode(
        replay_episode(ds, e, al, spec, mode, channels, refine=refine, log=print), episode_index=e)
    return e


def camera_motions(ds: LeRobotDataset, spec: SceneSpec, al: dict) -> dict[int, dict | None]:
    """Every episode's camera motion since the calibration stills (``episode_camera_motion``, as
    ``camera_motion.summary``) in the alignment ``al`` of ``ds`` to the nominal twin ``spec``."""
    cam, W, H = al["camera"], al["width"], al["height"]
    K, dist = np.asarray(al["K"]), (None if al["dist"] is None else np.asarray(al["dist"]))
    aligned = aligned_spec(spec, cam, np.asarray(al["T_cam_from_base"]), K, W, H)
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    bg = stills_background(ds.root, W, H)
    motions = {e: episode_camera_motion(ds, e, aligned, cam, maps, bg) for e in range(len(ds))}
    return {e: None if m is None else motion_summary(m) for e, m in motions.items()}


def self_check_alignment(ds: LeRobotDataset, spec: SceneSpec, al: dict, motions: dict | None = None) -> dict:
    """The ``camera_motion``, ``objects``, ``episode_K`` and ``self_check`` entries of an alignment ``al`` of
    ``ds`` to the nominal twin ``spec`` (``motions``: ``camera_motions``' result, computed when not given)."""
    cam, W, H = al["camera"], al["width"], al["height"]
    K, dist = np.asarray(al["K"]), (None if al["dist"] is None else np.asarray(al["dist"]))
    aligned = aligned_spec(spec, cam, np.asarray(al["T_cam_from_base"]), K, W, H)
    maps = undistort_maps(K, dist, W, H) if dist is not None else None
    bg = stills_background(ds.root, W, H)
    motions = camera_motions(ds, spec, al) if motions is None else motions
    fit = object_fit(bg)["fit"]
    firsts = {e: first_frames_objects(ds, e, aligned, cam, maps, bg, motions[e], fit) for e in range(len(ds))}
    placed = {e: {o.name: o for o in aligned.objects} for e in firsts}
    clarity = recording_clarity([f["residual"] for f in firsts.values()])
    for e, f in firsts.items():  # each found object's position uncertainty (uncertainty.py)
        T = np.asarray(al["T_cam_from_base"])
        for name, res in f["residual"].items():
            if res.get("not_found") or res.get("outside_image"):
                continue
            g = f["found"][name]
            res["uncertainty"] = object_uncertainty(f["evidence"], placed[e][name], (g["pos"][0], g["pos"][1], g["yaw"]),
                                                    np.asarray(f["K"]), T, res["visible"], clarity,
                                                    al["calibration"], motions[e], fit)
    return {"camera_motion": {str(e): m for e, m in motions.items() if m is not None},
            "objects": {str(e): f["found"] for e, f in firsts.items()},
            "episode_K": {str(e): f["K"] for e, f in firsts.items()},
            "self_check": check_alignment(al["calibration"], {e: f["residual"] for e, f in firsts.items()},
                                          motions)}


def _report(out: Path, real: Path, wanted: bool, log) -> None:
    path = out / "alignment_report.json"
    if wanted and (not path.is_file() or "episodes" not in json.loads(path.read_text())):
        from comsim.twin.alignment_report import alignment_report
        alignment_report(out, real, log=log)
