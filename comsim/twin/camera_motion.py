"""The camera's motion after calibration, from the frames alone.

A camera bumped after its calibration stills (a tripod knocked, a mount settling) and drifting
slowly within an episode moves the whole static scene in the image by a pixel or so. At 128 px an
arm link is a few pixels wide: replayed through the calibrated camera, the twin's arm then sits a
pixel off the real one, and pairs that are a pixel out of line teach a translator a blurred,
doubled arm. The static scene says how far the camera moved:

1. ``register_shift``: each frame against the robot-free calibration still (both undistorted), as
   the camera turning about its centre (the image centre's content moving by (dx, dy) px; off the
   centre the image moves a little more, and across): robust Gauss-Newton (Lucas-Kanade) on band-passed grey images (lights and
   exposure change between the still and an episode; edges and texture stay), with a gain, the
   arm's pixels left out (the twin's silhouette at the recorded joints, dilated) and a redescending
   weight so that what the still does not show (objects, shadows, someone walking past) does not
   vote.
2. ``episode_motion``: every frame's shift, smoothed over ``SMOOTH_S`` seconds (the drift is slow;
   the per-frame estimate is not), the episode's offset (median) and drift, the residual (rms of the
   per-frame estimates about the smoothed track) and the offset's standard error. An episode is
   ``moved`` when the track leaves ``MOVED_MIN_PX`` anywhere: only then is it rendered with the
   motion, so a camera that did not move gives the same pairs as without this step.
3. The replay renders a moved episode through ``comsim.sim.camera.shifted_camera`` at each frame's
   smoothed shift: the calibrated camera turned about its centre so that its image moves by it.

Measured on the lab's cells (true shift known to the lab only; comsim.lab.twin_truth scores it):
0.03-0.09 px rms per frame on the workshop (shifts of 0.4-1.2 px), 0.02-0.06 px on cells whose camera
stands still (the built-in lab, cool_studio).
"""
from __future__ import annotations

import cv2
import numpy as np
from scipy.spatial.transform import Rotation

from comsim.sim.camera import as_K

MOVED_MIN_PX = 0.2  # an episode whose smoothed shift passes this anywhere is rendered with it (static cells: < 0.1)
SMOOTH_S = 1.5  # Gaussian sigma (seconds) of the per-frame shifts' smoothing
BAND = (0.7, 3.0)  # band-pass (difference of Gaussians, px at 128 wide): texture and edges, not shading
ROBUST = 2.0  # Cauchy weight scale, in robust standard deviations of the residual
ITERS = 30


def _band_pass(img: np.ndarray, scale: float) -> np.ndarray:
    g = cv2.cvtColor(np.asarray(img, np.uint8), cv2.COLOR_RGB2GRAY).astype(np.float32)
    return cv2.GaussianBlur(g, (0, 0), BAND[0] * scale) - cv2.GaussianBlur(g, (0, 0), BAND[1] * scale)


def _unit_flows(K, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Image motion (H, W, 2) of every pixel when the camera turns about its centre so that the image centre's
    content moves by one pixel along x, and along y (``comsim.sim.camera.shifted_camera``): off the centre a
    turning camera's image moves a little more, and a little across (``K R K^-1``). Central differences of
    +-1 px: the motions here are a pixel or two, where the flow is linear in the shift to 1e-4 px."""
    fx, fy, cx, cy = as_K(K)
    v, u = np.mgrid[0:height, 0:width].astype(np.float64)
    rays = np.stack([(u - cx) / fx, (v - cy) / fy, np.ones_like(u)], -1)

    def flow(sx, sy):
        R = Rotation.from_rotvec([-sy / fy, sx / fx, 0.0]).as_matrix()
        q = rays @ R.T
        return np.stack([fx * q[..., 0] / q[..., 2] + cx - u, fy * q[..., 1] / q[..., 2] + cy - v], -1)

    return ((flow(1, 0) - flow(-1, 0)) / 2).astype(np.float32), ((flow(0, 1) - flow(0, -1)) / 2).astype(np.float32)


def _warp(img: np.ndarray, shift, flows) -> np.ndarray:
    """``img`` as the camera turned by ``shift`` (the image centre's motion, px) sees it (bilinear)."""
    H, W = img.shape[:2]
    F = float(shift[0]) * flows[0] + float(shift[1]) * flows[1]
    v, u = np.mgrid[0:H, 0:W].astype(np.float32)
    return cv2.remap(img, (u - F[..., 0]).astype(np.float32), (v - F[..., 1]).astype(np.float32), cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_REPLICATE)


def shifted_image(img: np.ndarray, shift, K) -> np.ndarray:
    """An image (e.g. the robot-free still, pinhole, camera ``K``) as the camera turned so that its image centre
    moved by ``shift`` px sees it."""
    img = np.asarray(img)
    return _warp(img, shift, _unit_flows(K, img.shape[1], img.shape[0]))


def register_shift(reference: np.ndarray, image: np.ndarray, weight: np.ndarray, K, start=(0.0, 0.0),
                   flows=None) -> dict:
    """How far the camera of ``image`` turned from that of ``reference`` (RGB, same size, pinhole ``K``), as the
    motion s (px) of the image centre's content: image ~ g * reference seen by the camera turned by s, fitted on
    band-passed grey images over the pixels where ``weight`` (H, W) > 0. Returns {"shift" (dx, dy) px, "sd"
    (formal standard deviation, px, each axis), "gain", "residual" (robust rms of the band-passed residual)}."""
    H, W = image.shape[:2]
    scale = W / 128
    flows = _unit_flows(K, W, H) if flows is None else flows
    A, B = _band_pass(reference, scale), _band_pass(image, scale)
    gy, gx = np.gradient(A)
    w0 = np.asarray(weight, np.float32)
    s, g = np.asarray(start, np.float64).copy(), 1.0
    Hm, r, w = np.eye(3), np.zeros_like(B), w0
    for _ in range(ITERS):
        Aw, gxw, gyw = _warp(A, s, flows), _warp(gx, s, flows), _warp(gy, s, flows)
        r = g * Aw - B
        sc = 1.4826 * float(np.median(np.abs(r[w0 > 0]))) + 1e-6
        w = w0 / (1.0 + (r / (ROBUST * sc)) ** 2)
        # d r / d(sx, sy): the reference sampled at p - F(s), F(s) = sx Fx + sy Fy
        dsx = -g * (gxw * flows[0][..., 0] + gyw * flows[0][..., 1])
        dsy = -g * (gxw * flows[1][..., 0] + gyw * flows[1][..., 1])
        J = np.stack([dsx, dsy, Aw], -1).reshape(-1, 3)
        wf = w.reshape(-1)
        Hm = (J * wf[:, None]).T @ J
        d = np.linalg.solve(Hm + 1e-9 * np.eye(3), -(J * wf[:, None]).T @ r.reshape(-1))
        s += d[:2]
        g += d[2]
        if np.abs(d[:2]).max() < 1e-4:
            break
    dof = max(float(w0.sum()) - 3.0, 1.0)
    cov = np.linalg.inv(Hm + 1e-9 * np.eye(3)) * float((w * r * r).sum()) / dof
    return {"shift": s, "sd": np.sqrt(np.maximum(np.diag(cov)[:2], 0.0)), "gain": float(g),
            "residual": float(1.4826 * np.median(np.abs(r[w0 > 0])))}


def _smooth(x: np.ndarray, t: np.ndarray, sigma_s: float) -> np.ndarray:
    """Gaussian-weighted local means of ``x`` (n, 2) over the timestamps ``t`` (n,)."""
    w = np.exp(-0.5 * ((t[:, None] - t[None, :]) / sigma_s) ** 2)
    return (w @ x) / w.sum(1, keepdims=True)


def episode_motion(frames: np.ndarray, still: np.ndarray, exclusions: np.ndarray, timestamps, K) -> dict:
    """The camera's motion over one episode: ``frames`` (n, H, W, 3) undistorted, ``still`` the robot-free
    still at the same size, ``exclusions`` (n, H, W) pixels that cannot be background (the arm),
    ``timestamps`` (n,) seconds, ``K`` the pinhole camera. Returns {"per_frame_px" (n, 2), "track_px" (n, 2) smoothed, "offset_px"
    (median of the track), "drift_px" (largest distance of the track from the offset), "residual_px"
    (rms of the per-frame shifts about the track), "offset_sd_px" (standard error of the offset), "moved"}."""
    t = np.asarray(timestamps, np.float64)
    per, start = [], (0.0, 0.0)
    flows = _unit_flows(K, still.shape[1], still.shape[0])
    for img, ex in zip(frames, exclusions):
        est = register_shift(still, img, ~np.asarray(ex, bool), K, start=start, flows=flows)
        per.append(est["shift"])
        start = est["shift"]  # the next frame is a fraction of a pixel away
    per = np.asarray(per)
    track = _smooth(per, t, SMOOTH_S)
    offset = np.median(track, axis=0)
    residual = float(np.sqrt(np.mean(np.sum((per - track) ** 2, axis=1))))
    # per-frame errors are correlated over about a smoothing window: that many frames count as one
    fps = (len(t) - 1) / max(t[-1] - t[0], 1e-9) if len(t) > 1 else 1.0
    n_eff = max(1.0, len(t) / max(1.0, 2.5 * SMOOTH_S * fps))
    sd = residual / np.sqrt(n_eff)
    moved = bool(np.max(np.linalg.norm(track, axis=1)) >= MOVED_MIN_PX)
    return {"per_frame_px": per, "track_px": track, "offset_px": offset,
            "drift_px": float(np.max(np.linalg.norm(track - offset, axis=1))), "residual_px": residual,
            "offset_sd_px": float(sd), "moved": moved}


def summary(motion: dict, every: int = 1) -> dict:
    """JSON-able record of ``episode_motion`` (the per-frame values rounded to 1/1000 px)."""
    r = (lambda a: np.round(np.asarray(a, np.float64), 3).tolist())
    return {"moved": motion["moved"], "offset_px": r(motion["offset_px"]), "drift_px": round(motion["drift_px"], 3),
            "residual_px": round(motion["residual_px"], 4), "offset_sd_px": round(motion["offset_sd_px"], 4),
            "track_px": r(motion["track_px"][::every]), "per_frame_px": r(motion["per_frame_px"][::every])}
