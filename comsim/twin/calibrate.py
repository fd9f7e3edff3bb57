"""Camera calibration without a board: ``T_cam_from_base`` from robot silhouettes.

Given K, joint angles and robot masks for a few frames (``frames.py`` loads them),
``calibrate_camera``:

1. searches coarsely (cross-entropy on a trimmed mean IoU at low resolution) around the
   rough initial guess, or around the best of a grid of look-at viewpoints if none;
2. refines with Gauss-Newton on silhouette contours (``pose_fit.refine_contour``);
3. scores every image against every joint vector (the IoU matrix). A frame whose own
   joint vector is clearly beaten by another frame's, or whose IoU is far below the
   others', is flagged (joints read at another instant than the image: unsynchronized
   capture) and the pose is refit on the trusted frames; this repeats until the
   trusted set stops changing;
4. refines once more at full resolution with the full meshes, and reports per-frame IoU
   (own joints, all frames), the flagged frames with their best-matching joint vector,
   each frame's best IoU with a camera pose of its own (how far it is from any common
   pose), and, separately labelled, the mean IoU under the best one-to-one
   re-association of images and joint vectors (Hungarian).

With a robot-free still instead of masks (``calibrate_with_background``), the calibration may take a sharper
stage (``sharpen``: the links' shaded rim the derived masks lost, and a mask offset). ``sharpen_by_markers``
decides: where the twin spec's markers show in the still, the pose that puts them closer is kept; without
markers, the stage runs when the trusted stills still disagree with the silhouettes (``SHARPEN_BELOW_IOU``).
The markers then take part in the last contour fit (``fit_markers``): the silhouettes of a few stills leave the
camera free to orbit the arm, a point at a known place on the table does not.
Every result carries its residual for the twin's position uncertainty (``fit_residual``).

``calibrate_folder`` writes ``calibration.json`` and overlays (each frame with the
rendered silhouette's outline) when the fit converged; otherwise it writes
``calibration_rejected.json`` with the best pose and IoU it found and says so.

Also here: ``solve_pnp`` for users with 2D-3D point pairs (``intrinsics_from_checkerboard``, for
users without K, lives with the loading of the calibration folder in ``frames.py``).
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import cv2
import numpy as np
from scipy.optimize import linear_sum_assignment

from comsim.io.files import read_json_object
from comsim.io.paths import check_output_path
from comsim.sim.camera import as_K, as_rigid, look_at, project_points
from comsim.sim.scene import MARKER_TOP_Z
from comsim.twin.frames import (CalibrationDataError, CalibrationFrames, intrinsics_from_checkerboard,
                                load_calibration_folder)
from comsim.twin.pose_fit import (MaskTargets, SilhouetteScorer, coarse_search, contour_residuals, perturb,
                                  pose_covariance, pose_error, refine_contour, trimmed_mean)
from comsim.io.files import write_json
from comsim.twin.overlay import write_overlay
from comsim.twin.silhouette import RobotSilhouette

# A frame is "unsynchronized" when another frame's joint vector explains its mask better
# than its own by this IoU margin at the fitted pose.
SYNC_MARGIN = 0.05
# ... or "poor fit" when its IoU is this far below the trusted frames' median.
POOR_FIT_DROP = 0.15
MIN_TRUSTED_IOU = 0.8  # mean IoU of the trusted frames for a calibration to count as converged


def _sizes(width: int, height: int) -> dict[str, tuple[int, int]]:
    """Image sizes for each stage: coarse (~160 wide), mid (~320), fine render (>= 512)."""
    def at(target):
        s = min(1.0, target / width)
        return max(8, int(round(width * s / 2)) * 2), max(8, int(round(height * s / 2)) * 2)
    f = max(1, int(round(512 / width)))
    return {"coarse": at(160), "mid": at(320), "fine": (width * f, height * f), "image": (width, height)}


def flag_frames(M: np.ndarray, trusted_hint=None) -> dict[int, dict]:
    """Frames to distrust, from the IoU matrix M[i, j] (image i vs joint vector j)."""
    n = len(M)
    own = np.diag(M).copy()
    flags = {}
    for i in range(n):
        others = [j for j in range(n) if j != i]
        if not others:
            break
        j = max(others, key=lambda k: M[i, k])
        if M[i, j] > own[i] + SYNC_MARGIN:
            flags[i] = {"reason": "unsynchronized", "iou_own": float(own[i]), "best_joint_vector": int(j),
                        "iou_best": float(M[i, j])}
    rest = [i for i in range(n) if i not in flags]
    if rest:
        med = float(np.median(own[rest]))
        for i in rest:
            if own[i] < med - POOR_FIT_DROP:
                flags[i] = {"reason": "poor_fit", "iou_own": float(own[i]), "best_joint_vector": int(np.argmax(M[i])),
                            "iou_best": float(M[i].max())}
    return flags


def calibrate_camera(fr: CalibrationFrames, robot="panda", seed: int = 0, init_T: np.ndarray | None = None,
                     fine_visual: str = "full", coarse: bool = True, log=print) -> dict:
    """Fit T_cam_from_base to the frames; returns the result dict (see module docstring).

    ``coarse=False`` skips the global search (the start is already within ~1 cm).
    Every stage runs a fixed number of iterations, so the pose does not depend on how fast
    the machine is.
    """
    t_start = time.perf_counter()

    def elapsed():
        return time.perf_counter() - t_start

    W, H = fr.size
    sizes = _sizes(W, H)
    targets = MaskTargets(fr.masks, fr.valid)
    n = len(fr.names)
    frames = list(range(n))
    light = RobotSilhouette(robot, fr.K, W, H, visual="light")
    full = RobotSilhouette(robot, fr.K, W, H, visual=fine_visual)
    try:
        fast = SilhouetteScorer(light, fr.joints, fr.fingers, targets)
        exact = SilhouetteScorer(full, fr.joints, fr.fingers, targets)
        T0 = init_T if init_T is not None else fr.init_T
        if T0 is None:
            T0 = viewpoint_search(fast, frames, sizes["coarse"])
            log(f"[calibrate] no initial pose given; best look-at viewpoint {elapsed():.0f}s")
        T = T0
        if coarse:
            T, s = coarse_search(fast, T0, frames, sizes["coarse"], sigma_rot=0.15, sigma_trans=0.15, iters=12,
                                 pop=32, seed=seed)
            T, s = coarse_search(fast, T, frames, sizes["coarse"], sigma_rot=0.05, sigma_trans=0.05, iters=10,
                                 pop=24, seed=seed + 1)
            log(f"[calibrate] coarse search: trimmed mean IoU {s:.3f} ({elapsed():.0f}s)")
            T, _ = refine_contour(fast, T, frames, sizes["mid"], scale_px=5.0, outer=12)
        T, _ = refine_contour(fast, T, frames, sizes["mid"], scale_px=2.0, outer=8)

        trusted, flags = frames, {}
        for it in range(4):
            M = fast.matrix(T, *sizes["mid"])
            flags = flag_frames(M)
            new = [i for i in frames if i not in flags] or frames
            log(f"[calibrate] pass {it}: trusted frames {[fr.names[i] for i in new]} "
                f"(mean IoU {np.diag(M)[new].mean():.3f}, {elapsed():.0f}s)")
            if new == trusted and it > 0:
                break
            trusted = new
            T, _ = refine_contour(fast, T, trusted, sizes["mid"], scale_px=2.0, outer=8)

        # the full-resolution, full-mesh polish
        T, fine_log = refine_contour(exact, T, trusted, sizes["fine"], scale_px=1.5, outer=8)
        per_frame = exact.per_frame(T, frames, W, H)
        M = exact.matrix(T, *sizes["mid"])
        flags = flag_frames(M)  # final verdict at the final pose
        trusted = [i for i in frames if i not in flags] or frames

        own_pose = own_pose_fits(fast, T, frames, sizes["mid"])
        rows, cols = linear_sum_assignment(-M)
        last = fine_log["outer"][-1]
        settled = last["step_m"] < 1e-3 and last["step_deg"] < 0.1
        trusted_iou = float(per_frame[trusted].mean())
        converged = bool(settled and trusted_iou >= MIN_TRUSTED_IOU and len(trusted) >= min(3, n))
        result = {
            "T_cam_from_base": T.tolist(),
            "K": [[fr.K[0], 0.0, fr.K[2]], [0.0, fr.K[1], fr.K[3]], [0.0, 0.0, 1.0]],
            "width": W, "height": H,
            "dist": None if fr.dist is None else fr.dist.tolist(),
            "frames": list(fr.names),
            "per_frame_iou": {fr.names[i]: float(per_frame[i]) for i in frames},
            "mean_iou": float(per_frame.mean()),
            "mean_iou_trusted": trusted_iou,
            "trusted_frames": [fr.names[i] for i in trusted],
            "outlier_frames": [fr.names[i] for i in sorted(flags)],
            "outliers": {fr.names[i]: {**f, "best_joint_vector": fr.names[f["best_joint_vector"]]}
                         for i, f in sorted(flags.items())},
            "iou_matrix": {"rows_images_cols_joint_vectors": M.round(4).tolist(), "size": list(sizes["mid"])},
            "reassociated": {
                "note": "diagnostic only: best one-to-one matching of images to joint vectors (Hungarian); "
                        "NOT the calibration's IoU",
                "joint_vector_for_image": {fr.names[r]: fr.names[c] for r, c in zip(rows, cols)},
                "mean_iou": float(M[rows, cols].mean())},
            "converged": converged,
            "seconds": round(elapsed(), 1),
        }
        result["own_pose"] = {
            "note": "each frame fitted with a camera pose of its own: the best IoU its own joints allow, "
                    "and how far that pose is from the common one",
            **{fr.names[i]: v for i, v in own_pose.items()}}
        result.update(fit_residual(exact, T, trusted, sizes["fine"], W))
        if not converged:
            result["why_not_converged"] = (
                f"trusted frames' mean IoU {trusted_iou:.3f} (needs >= {MIN_TRUSTED_IOU}), "
                f"{len(trusted)} trusted frames, last refinement step {last['step_m'] * 1000:.2f} mm "
                f"{last['step_deg']:.3f} deg")
        return result
    finally:
        light.close()
        full.close()


def fit_residual(scorer: SilhouetteScorer, T: np.ndarray, frames, render_size, width: int) -> dict:
    """How well the fitted silhouettes explain the masks, for the twin's position uncertainty
    (``comsim.twin.uncertainty``): the median distance (px at 128 px wide) of the silhouettes' contour points
    from the masks' edges, and the pose's covariance from the frames' disagreement
    (``pose_fit.pose_covariance``, perturbation (w, v) in the camera frame)."""
    r = contour_residuals(scorer, T, frames, render_size)
    C = pose_covariance(scorer, T, frames, render_size)
    return {"contour_residual_px": round(float(np.median(np.abs(r))) * 128 / width, 4) if len(r) else None,
            "pose_covariance": C.tolist()}


def own_pose_fits(scorer: SilhouetteScorer, T: np.ndarray, frames, size) -> dict[int, dict]:
    out = {}
    for i in frames:
        Ti, _ = refine_contour(scorer, T, [i], size, scale_px=2.0, outer=8)
        d_m, d_deg = pose_error(Ti, T)
        out[i] = {"iou": float(scorer.per_frame(Ti, [i], *size)[0]), "shift_m": round(d_m, 4),
                  "shift_deg": round(d_deg, 3)}
    return out


def viewpoint_search(scorer: SilhouetteScorer, frames, size, target=(0.3, 0.0, 0.35)) -> np.ndarray:
    """No initial guess: the best of a grid of upright look-at cameras around the robot."""
    best, best_T = -1.0, None
    for dist in (1.0, 1.5, 2.0, 2.6):
        for elev in np.radians([5, 20, 35, 50]):
            for azim in np.radians(np.arange(0, 360, 20)):
                eye = np.asarray(target) + dist * np.array(
                    [np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim), np.sin(elev)])
                T = look_at(eye, target)
                s = trimmed_mean(scorer.per_frame(T, frames, *size), 0.7)
                if s > best:
                    best, best_T = s, T
    return best_T


# ----------------------------------------------------------------- folder -> files


# (mask uncertainty in px at 128 px wide, coarse search?) per round of mask derivation +
# calibration for folders with a background still instead of masks; scaled with the width.
BACKGROUND_ROUNDS = ((16, True), (5, False), (2, False))


def calibrate_with_background(fr: CalibrationFrames, robot="panda", init_T=None, seed: int = 0,
                              fine_visual: str = "full", log=print) -> dict:
    """Calibration for frames without masks but with a robot-free background still.

    Masks are derived from the difference to the background (``masks.derive_masks`` with
    ``background_image``): the first round from contrast alone (no pose needed), later
    rounds with colour cues learned from the arm rendered at the current estimate, each
    round shrinking the pose uncertainty. Returns ``calibrate_camera``'s result (with the
    derived masks' frames in ``result["frames_used"]``, not JSON).
    """
    from comsim.twin.masks import derive_masks

    if fr.background is None:
        raise CalibrationDataError(f"{fr.folder}: no background still to derive masks from")
    t0 = time.perf_counter()
    W, H = fr.size
    T = init_T if init_T is not None else fr.init_T
    rounds, res = [], None
    with RobotSilhouette(robot, fr.K, W, H, visual=fine_visual) as sil:
        for r, (margin, coarse) in enumerate(BACKGROUND_ROUNDS):
            margin = max(1, int(round(margin * W / 128)))
            try:
                m = derive_masks(fr.images, fr.joints, fr.fingers, sil, T if T is not None else np.eye(4), margin,
                                 seed=seed, pose_free=coarse or T is None, background_image=fr.background,
                                 area_scale=(W / 128) ** 2)
            except ValueError as e:  # the arm rendered at the estimate misses the image: no colour cues
                if res is None:
                    raise CalibrationDataError(f"{fr.folder}: {e}") from None
                log(f"[calibrate] background round {r}: {e}; stopping at the previous estimate")
                res["converged"] = False
                res["why_not_converged"] = f"round {r}: {e} (is the initial camera pose far off?)"
                break
            fr_m = CalibrationFrames(names=fr.names, images=fr.images, masks=m["masks"], joints=fr.joints,
                                     fingers=fr.fingers, K=fr.K, dist=fr.dist, init_T=T, folder=fr.folder,
                                     valid=m["valid"], background=fr.background)
            res = calibrate_camera(fr_m, robot=robot, coarse=coarse or T is None, fine_visual=fine_visual,
                                   seed=seed, init_T=T, log=log)
            T = np.asarray(res["T_cam_from_base"])
            rounds.append({"margin_px": margin, "mean_iou": res["mean_iou"], "outliers": res["outlier_frames"]})
            log(f"[calibrate] background round {r}: mask uncertainty {margin}px, mean IoU {res['mean_iou']:.3f} "
                f"({time.perf_counter() - t0:.0f}s)")
    if res["converged"]:
        fr_m = sharpen_by_markers(fr_m, res, robot, fine_visual, log)
        fit_markers(fr_m, res, robot, fine_visual, log)
    res.update({"rounds": rounds, "mask_source": "difference to the background still + self-trained colour cues",
                "seconds": round(time.perf_counter() - t0, 1)})
    res["frames_used"] = fr_m
    return res


# Without a marker of the twin spec in the still (``sharpen_by_markers``), the sharper stage (``sharpen``) runs
# when the trusted stills' mean IoU at the fitted pose is under this: the
# derived masks disagree with the robot's silhouettes more than the built-in lab's stills do (0.889 there;
# 0.85-0.86 on the workshop and cool_studio cells, whose cameras came out 9-11 mm off, against the lab's truth).
SHARPEN_BELOW_IOU = 0.875
RIM_ROUNDS = 4  # rounds of rim recovery + contour refinement
RIM_DARKER = 5.0  # grey levels (0-255) a pixel must be darker than the still to be taken as the arm's rim


def rim_pixels(image: np.ndarray, background: np.ndarray, mask: np.ndarray, rendered: np.ndarray,
               scale: float) -> np.ndarray:
    """Pixels inside the arm's rendered silhouette that the derived ``mask`` left out although they are darker
    than the robot-free still (its exposure matched over the pixels far from the arm): the shaded rim of a
    link. A link's side turned from the light is darker than the wall behind it; under the lens blur the
    matte (``masks.matte``), which mixes the link's lit inside with the still, reads it as background, and
    the silhouettes fitted to such masks lean towards the lit side."""
    I, B = image.astype(np.float32), background.astype(np.float32)
    k = int(round(5 * scale)) * 2 + 1
    far = ~(cv2.dilate(((mask > 0.5) | rendered).astype(np.uint8), np.ones((k, k), np.uint8)) > 0)
    gain = np.median((I[far] + 1.0) / (B[far] + 1.0), axis=0) if far.any() else np.ones(3)
    blur = (lambda x: cv2.GaussianBlur(x, (0, 0), 0.25 * scale))
    darker = (blur(np.clip(B * gain, 0, 255)) - blur(I)).mean(-1)
    return rendered & (mask < 0.5) & (darker > RIM_DARKER)


def marker_face(x: float, y: float) -> list[list[float]]:
    """The point of known place of a marker at table position (x, y): the centre of its disc's seen face
    (``MARKER_TOP_Z`` above the table top, which is z = 0 in the base frame), as one (1, 3) point list."""
    return [[x, y, MARKER_TOP_Z]]


def locate_markers(still: np.ndarray, K, T, markers, min_share: float = 0.3) -> dict[str, np.ndarray]:
    """Where the twin's markers (``SceneSpec.markers``: flat discs on the table at known places) show in a
    robot-free ``still`` (undistorted, pinhole ``K``): per marker, the centroid (px) of the pixels of its hue
    within a window around where ``T`` puts it. A marker whose hue covers under ``min_share`` of its
    projected disc there (occluded, out of view, faded) is left out."""
    H, W = still.shape[:2]
    hsv = cv2.cvtColor(still, cv2.COLOR_RGB2HSV).astype(np.float32)  # hue 0-179
    found = {}
    for mk in markers:
        centre = project_points(K, T, marker_face(*mk.pos[:2]))[0]
        rim = project_points(K, T, marker_face(mk.pos[0] + mk.radius, mk.pos[1])
                             + marker_face(mk.pos[0], mk.pos[1] + mk.radius))
        r_px = float(np.linalg.norm(rim - centre, axis=1).mean())
        half = int(np.ceil(2 * r_px + 3))
        x0, y0 = int(round(centre[0])) - half, int(round(centre[1])) - half
        if r_px < 1.0 or x0 < 0 or y0 < 0 or x0 + 2 * half >= W or y0 + 2 * half >= H:
            continue
        rgb = np.clip(np.asarray(mk.rgba[:3]) * 255, 0, 255).astype(np.uint8)[None, None]
        hue = float(cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)[0, 0, 0])
        win = hsv[y0:y0 + 2 * half + 1, x0:x0 + 2 * half + 1]
        d_hue = np.abs(win[..., 0] - hue)
        sel = (np.minimum(d_hue, 180 - d_hue) < 12) & (win[..., 1] > 80) & (win[..., 2] > 30)
        if sel.sum() < min_share * np.pi * r_px ** 2:
            continue
        ys, xs = np.nonzero(sel)
        found[mk.name] = np.array([xs.mean() + x0, ys.mean() + y0])
    return found


def marker_error_px(K, T, markers, found: dict[str, np.ndarray]) -> float:
    """Mean distance (px) between the located markers and where ``T`` projects them."""
    by_name = {mk.name: mk for mk in markers}
    return float(np.mean([np.linalg.norm(project_points(K, T, marker_face(*by_name[n].pos[:2]))[0] - uv)
                          for n, uv in found.items()]))


def sharpen_by_markers(fr: CalibrationFrames, res: dict, robot, fine_visual: str, log=print) -> CalibrationFrames:
    """Decide on the sharper stage (``sharpen``) and run it: with markers of the twin spec visible in the
    robot-free still, both calibrations are made and the one that puts the markers closer to where they show
    is kept (the silhouettes of a few stills pin the camera's distance better than its rotation, and which
    way the stage turns it differs from recording to recording: a point at a known place on the table tells);
    without any, the stills' IoU decides (``SHARPEN_BELOW_IOU``). Returns the frames of the calibration kept;
    ``res`` is updated in place."""
    markers = list(getattr(robot, "markers", None) or [])
    found = locate_markers(fr.background, fr.K, res["T_cam_from_base"], markers) if markers else {}
    if not found:
        return sharpen(fr, res, robot, fine_visual, log) if res["mean_iou_trusted"] < SHARPEN_BELOW_IOU else fr
    plain = copy.deepcopy(res)
    fr_s = sharpen(fr, res, robot, fine_visual, log)
    err_plain = marker_error_px(fr.K, plain["T_cam_from_base"], markers, found)
    err_sharp = marker_error_px(fr.K, res["T_cam_from_base"], markers, found)
    by_markers = {"markers": sorted(found), "marker_error_px": round(err_sharp, 3),
                  "marker_error_px_without": round(err_plain, 3)}
    if err_sharp < err_plain:
        res["sharpened"].update(by_markers, why=f"the markers {sorted(found)} sit {err_sharp:.2f} px from where "
                                                f"this pose puts them, {err_plain:.2f} px without the stage")
        return fr_s
    log(f"[calibrate] sharper stage not kept: markers {err_sharp:.2f} px off with it, {err_plain:.2f} px without")
    res.clear()
    res.update(plain, not_sharpened={**by_markers, "why": "the markers sit closer to where the pose without the "
                                                          "stage puts them"})
    return fr


def _update_pose(res: dict, scorer: SilhouetteScorer, T: np.ndarray, names, trusted, size) -> None:
    """``res`` at a refitted pose ``T``: the pose, every still's IoU and the fit's residual (``fit_residual``)."""
    W, H = size
    per_frame = scorer.per_frame(T, list(range(len(names))), W, H)
    res.update(fit_residual(scorer, T, trusted, (W, H), W))
    res.update({"T_cam_from_base": T.tolist(), "per_frame_iou": {n: float(v) for n, v in zip(names, per_frame)},
                "mean_iou": float(per_frame.mean()), "mean_iou_trusted": float(per_frame[trusted].mean())})


# How much a located marker weighs in the last contour fit (``fit_markers``): its squared error (px) counts as much
# as one still's mean contour term. Weights of 4 and 16 moved the camera by under 0.5 mm more on twelve recordings.
MARKER_WEIGHT = 1.0


def fit_markers(fr: CalibrationFrames, res: dict, robot, fine_visual: str, log=print) -> None:
    """The last full-resolution contour fit with the markers located in the robot-free still as points of known
    place (``refine_contour``'s ``points``). A few stills' silhouettes leave the camera free to orbit the arm:
    a centimetre sideways and the matching turn move the arm's outline by a fraction of a pixel, and the table
    by more. ``res`` is updated in place (pose, IoU, residual); without a located marker nothing changes."""
    markers = list(getattr(robot, "markers", None) or [])
    T = np.asarray(res["T_cam_from_base"])
    found = locate_markers(fr.background, fr.K, T, markers) if markers else {}
    if not found:
        return
    by_name = {mk.name: mk for mk in markers}
    X = np.array([marker_face(*by_name[n].pos[:2])[0] for n in sorted(found)])
    uv = np.array([found[n] for n in sorted(found)])
    W, H = fr.size
    trusted = [fr.names.index(n) for n in res["trusted_frames"]]
    before = marker_error_px(fr.K, T, markers, found)
    with RobotSilhouette(robot, fr.K, W, H, visual=fine_visual) as sil:
        scorer = SilhouetteScorer(sil, fr.joints, fr.fingers, MaskTargets(fr.masks, fr.valid))
        T_fit, _ = refine_contour(scorer, T, trusted, (W, H), scale_px=1.5, outer=8, points=(X, uv, MARKER_WEIGHT))
        _update_pose(res, scorer, T_fit, fr.names, trusted, (W, H))
    d_m, d_deg = pose_error(T_fit, T)
    after = marker_error_px(fr.K, T_fit, markers, found)
    res["markers_fitted"] = {"markers": sorted(found), "weight": MARKER_WEIGHT,
                             "marker_error_px_before": round(before, 3), "marker_error_px": round(after, 3),
                             "moved_mm": round(1000 * d_m, 2), "moved_deg": round(d_deg, 3)}
    log(f"[calibrate] fitted with the markers {sorted(found)}: {before:.2f} -> {after:.2f} px, moved "
        f"{1000 * d_m:.1f} mm {d_deg:.2f} deg")


def sharpen(fr: CalibrationFrames, res: dict, robot, fine_visual: str, log=print) -> CalibrationFrames:
    """The sharper stage of a calibration from a robot-free still (``res`` from ``calibrate_camera`` on ``fr``,
    updated in place): ``RIM_ROUNDS`` rounds of adding the rim pixels (``rim_pixels``) of the arm rendered at the
    current pose to the masks and refitting the contours, the last one with a mask offset (masks that are still
    uniformly eroded or dilated by the blur read as a camera distance otherwise, ``refine_contour``). Returns
    the frames with the sharpened masks."""
    T = np.asarray(res["T_cam_from_base"])
    W, H = fr.size
    scale = W / 128
    trusted = [fr.names.index(n) for n in res["trusted_frames"]]
    masks = fr.masks.copy()
    before = (res["mean_iou_trusted"], res["T_cam_from_base"])
    with RobotSilhouette(robot, fr.K, W, H, visual=fine_visual) as sil:
        for r in range(RIM_ROUNDS):
            sil.set_camera(T)
            for i in range(len(masks)):
                sil.set_joints(fr.joints[i], fr.fingers[i])
                masks[i] = np.maximum(masks[i], rim_pixels(fr.images[i], fr.background, masks[i], sil.mask(),
                                                           scale).astype(np.float32))
            scorer = SilhouetteScorer(sil, fr.joints, fr.fingers, MaskTargets(masks, fr.valid))
            T, fit = refine_contour(scorer, T, trusted, (W, H), scale_px=1.5, outer=8,
                                    fit_offset=r == RIM_ROUNDS - 1)
        _update_pose(res, scorer, T, fr.names, trusted, (W, H))
    d_m, d_deg = pose_error(T, np.asarray(before[1]))
    res["sharpened"] = {"why": f"trusted stills' mean IoU {before[0]:.3f} < {SHARPEN_BELOW_IOU}",
                        "rounds": RIM_ROUNDS, "mask_offset_px": round(fit["outer"][-1]["offset_px"], 3),
                        "moved_mm": round(1000 * d_m, 2), "moved_deg": round(d_deg, 3),
                        "mean_iou_trusted_before": before[0]}
    log(f"[calibrate] sharpened (rim pixels + mask offset): moved {1000 * d_m:.1f} mm {d_deg:.2f} deg, trusted mean "
        f"IoU {before[0]:.3f} -> {res['mean_iou_trusted']:.3f}")
    return CalibrationFrames(names=fr.names, images=fr.images, masks=masks, joints=fr.joints, fingers=fr.fingers,
                             K=fr.K, dist=fr.dist, init_T=fr.init_T, folder=fr.folder, valid=fr.valid,
                             background=fr.background)


def calibrate_folder(folder, robot="panda", out=None, seed: int = 0, init_T=None, log=print) -> dict:
    """``comsim twin calibrate``: load, fit, write ``calibration.json`` + overlays into ``out``.

    ``robot``: a built-in robot name, a RobotSpec / SceneSpec, or a twin spec YAML (its robot).
    A folder without ``mask/`` but with ``background.png`` gets derived masks
    (``calibrate_with_background``). ``init_T``: rough start (default: the folder's
    ``init_T_cam_from_base.txt``, else the twin spec's camera when ``robot`` is a twin spec,
    else a search over viewpoints).
    """
    if out is not None:
        check_output_path(out)  # a file there is refused now, not after minutes of fitting
    fr = load_calibration_folder(folder)
    if isinstance(robot, (str, Path)) and str(robot).endswith((".yaml", ".yml")):  # a twin spec: its robot
        from comsim.sim.spec import load_scene_spec
        robot = load_scene_spec(robot)
    if init_T is None and fr.init_T is None and getattr(robot, "cameras", None):
        init_T = np.asarray(robot.cameras[0].T_cam_from_base, np.float64)  # a twin spec's nominal camera
        log("[calibrate] no init_T_cam_from_base.txt: starting from the twin spec's camera")
    if fr.background is not None:
        visual = robot.robot.visual if hasattr(robot, "robot") else "full"
        result = calibrate_with_background(fr, robot=robot, init_T=init_T, seed=seed, fine_visual=visual, log=log)
        fr = result.pop("frames_used")
    else:
        result = calibrate_camera(fr, robot=robot, seed=seed, init_T=init_T, log=log)
    result["folder"] = str(Path(folder))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        T = np.asarray(result["T_cam_from_base"])
        with RobotSilhouette(robot, fr.K, *fr.size, visual="full") as sil:
            sil.set_camera(T)
            for i, name in enumerate(fr.names):
                sil.set_joints(fr.joints[i], fr.fingers[i])
                label = f"{name} IoU {result['per_frame_iou'][name]:.3f}"
                if name in result["outliers"]:
                    o = result["outliers"][name]
                    label += f"  {o['reason']}: best joints {o['best_joint_vector']}"
                write_overlay(out / "overlays" / f"{name}.png", fr.images[i], sil.mask(), fr.masks[i] > 0.5, label)
        name = "calibration.json" if result["converged"] else "calibration_rejected.json"
        write_json(result, out / name)
        result["path"] = str(out / name)
    return result


def load_calibration(path) -> dict:
    """A calibration.json: T_cam_from_base (4x4) and K (3x3) as arrays, checked."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationDataError(f"{path}: file not found")
    d = read_json_object(path, CalibrationDataError, "a JSON object with T_cam_from_base and K")
    for key in ("T_cam_from_base", "K"):
        if key not in d:
            raise CalibrationDataError(f"{path}: missing field {key!r}")
    if d.get("converged") is False:
        raise CalibrationDataError(f"{path}: this calibration did not converge ({d.get('why_not_converged')})")
    for key, check in (("T_cam_from_base", as_rigid), ("K", as_K)):
        try:
            d[key] = check(d[key])
        except ValueError as e:
            raise CalibrationDataError(f"{path}: {key}: {e}") from None
    return d


# ----------------------------------------------------------------- other paths to a pose


def solve_pnp(points_2d, points_3d, K, dist=None, ransac: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """T_cam_from_base from 2D pixel / 3D base-frame point pairs (>= 4); returns (T, inlier indices)."""
    p2 = np.asarray(points_2d, np.float64).reshape(-1, 2)
    p3 = np.asarray(points_3d, np.float64).reshape(-1, 3)
    if len(p2) != len(p3):
        raise ValueError(f"solve_pnp: {len(p2)} image points but {len(p3)} 3D points")
    if len(p2) < 4:
        raise ValueError(f"solve_pnp: needs at least 4 point pairs, got {len(p2)}")
    fx, fy, cx, cy = as_K(K)
    Km = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1]])
    d = None if dist is None else np.asarray(dist, np.float64)
    if ransac and len(p2) >= 6:
        ok, rvec, tvec, inl = cv2.solvePnPRansac(p3, p2, Km, d, reprojectionError=3.0, iterationsCount=200,
                                                 flags=cv2.SOLVEPNP_EPNP)
        inliers = inl.reshape(-1) if ok and inl is not None else np.arange(len(p2))
    else:
        ok, rvec, tvec = cv2.solvePnP(p3, p2, Km, d, flags=cv2.SOLVEPNP_ITERATIVE if len(p2) >= 6
                                      else cv2.SOLVEPNP_SQPNP)
        inliers = np.arange(len(p2))
    if not ok:
        raise ValueError("solve_pnp: OpenCV found no pose for these points")
    rvec, tvec = cv2.solvePnPRefineLM(p3[inliers], p2[inliers], Km, d, rvec, tvec)
    T = np.eye(4)
    T[:3, :3] = cv2.Rodrigues(rvec)[0]
    T[:3, 3] = tvec.reshape(3)
    return T, inliers


__all__ = ["calibrate_camera", "calibrate_folder", "flag_frames", "intrinsics_from_checkerboard", "load_calibration",
           "locate_markers", "marker_face", "perturb", "solve_pnp"]
