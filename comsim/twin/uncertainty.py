"""How far each object placement may be off: a position uncertainty from what the twin knows.

At 128 px a cube at the back of the table is 5 px wide and one pixel is almost 2 cm there, so the
twin says, for every object it places, how sure it is: a 2-D normal on the table around the placement
(``sd_m``, ``cov_m2``) and the radius that holds 95% of it (``bound_95_m``). The self-check
(``selfcheck.py``) distrusts an object whose bound crosses ``BOUND_M``. The parts, each propagated to
the object's (x, y) on the table:

1. the camera: the calibration's residual (``calibrate.fit_residual``: how far, in pixels, the fitted
   silhouettes' contours lie from the masks' edges: a silhouette off by that much at the arm moves the
   object's image by about as much) and the frames' disagreement about the pose
   (``pose_fit.pose_covariance``), through the object's ray to the table;
2. the silhouette fit: its sensitivity (a Laplace approximation of the fit's loss at the placement: the
   loss's curvature over the pixels the arm leaves visible, scaled by its residual per pixel) and a floor
   for what the fit's residual does not see, larger when the arm hides part of the object. For the
   evidence fit (``localize.fit_pose``) the floor stands for a side in shadow, a printed face, the shadow
   a cube casts, and grows where the recording shows the objects' colours less clearly
   (``recording_clarity``); for the painted fit (``localize.fit_pose_painted``, which models faces, prints
   and shadows) it stands for what is left: the part of the camera's error its residuals do not show and
   the faces' shading across them, the same in every cell (``PAINTED_FLOOR_PX``);
3. the camera's motion since the stills (``camera_motion``): the shift's standard error when the episode
   was corrected, the shift itself when it was not.

The scales were set on lab recordings that the results page does not score (seed 100 of the three lab cells,
10 episodes each; docs/results/2026-12-06-twin-alignment-and-uncertainty.md). ``CAMERA_SCALE``, ``FIT_SCALE``,
``FIT_FLOOR_PX``, ``CLARITY_POWER`` (the evidence fit): the largest share of placements whose bound holds on
cool_studio and the workshop while no placement of the built-in lab is flagged. ``PAINTED_FLOOR_PX``: the middle
of the range of floors (0.23-0.30 px) that give cool_studio's and the workshop's painted placements the best
coverage (39 of 40) with at most 10% of those within ``BOUND_M`` flagged. The twin never reads a truth.
"""
from __future__ import annotations

import cv2
import numpy as np

from comsim.sim.camera import project_points
from comsim.sim.spec import ObjectSpec
from comsim.twin.localize import (EvidenceMaps, _ray_to_plane, coverage, face_coverage, painted, silhouette_window,
                                  visible_sides)
from comsim.twin.pose_fit import perturb

BOUND_M = 0.02  # an object whose 95% position bound crosses this is not trusted
CAMERA_SCALE = 0.5  # the calibration's contour residual (px) -> 1 sd of the object's image position (px)
FIT_SCALE = 0.25  # the silhouette fit's Laplace covariance -> its share of the variance
FIT_FLOOR_PX = 0.06  # 1 sd (px) of what the fit's residual does not see, for a wholly visible object of clarity 1
CLARITY_POWER = 2.0  # ... divided by the recording's clarity to this power
PAINTED_FLOOR_PX = 0.265  # the painted fit's floor: 1 sd (px) for a wholly visible object
STEPS = (0.001, 0.001, 0.02)  # finite differences of the fit's pose (m, m, rad)


def table_per_pixel(obj: ObjectSpec, pose, K, T) -> np.ndarray:
    """(2, 2) metres on the table per pixel of image motion at the object's centre (its ray at half height)."""
    h = obj.half_height
    uv = project_points(K, T, np.array([[pose[0], pose[1], h]]))[0]
    J = np.zeros((2, 2))
    for j in range(2):
        d = np.zeros(2)
        d[j] = 0.25
        J[:, j] = (_ray_to_plane(K, T, uv + d, h)[:2] - _ray_to_plane(K, T, uv - d, h)[:2]) / 0.5
    return J


def table_per_pose(obj: ObjectSpec, pose, K, T) -> np.ndarray:
    """(2, 6) metres on the table per camera pose perturbation (``pose_fit.perturb``'s (w, v)): where the
    object's centre would be placed from the same pixel by a camera perturbed from ``T``."""
    h = obj.half_height
    uv = project_points(K, T, np.array([[pose[0], pose[1], h]]))[0]
    J = np.zeros((2, 6))
    for j in range(6):
        d = np.zeros(6)
        d[j] = 1e-4
        J[:, j] = (_ray_to_plane(K, perturb(T, d), uv, h)[:2] - _ray_to_plane(K, perturb(T, -d), uv, h)[:2]) / 2e-4
    return J


def fit_covariance(maps: EvidenceMaps, obj: ObjectSpec, pose, K, T) -> np.ndarray | None:
    """(2, 2) covariance (m^2) of the silhouette fit's (x, y) at ``pose`` (x, y, yaw): the Gauss-Newton
    curvature of ``fit_pose``'s loss (the silhouette's coverage against the object's evidence) over the
    pixels near the object that the arm leaves visible, times the loss's residual per pixel there. None
    when the silhouette is outside the image."""
    H, W = maps.img.shape[:2]
    win = silhouette_window(obj, pose, K, T, W, H)
    if win is None:
        return None
    x0, y0, x1, y1 = win
    target = maps.evidence(obj.name)[y0:y1, x0:x1]

    def cov(p):
        top, side = coverage(obj, tuple(p), K, T, win)
        return top + side

    p0 = np.asarray(pose, np.float64)
    c0 = cov(p0)
    near = cv2.dilate(((c0 > 0.05) | (target > 0.05)).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    region = near & maps.free[y0:y1, x0:x1]
    if region.sum() < 6:
        return None
    J = np.stack([((cov(p0 + e * s) - cov(p0 - e * s)) / (2 * s))[region] for e, s in zip(np.eye(3), STEPS)], 1)
    r = (c0 - target)[region]
    s2 = float((r ** 2).sum()) / max(len(r) - 3, 1)
    return (s2 * np.linalg.pinv(J.T @ J))[:2, :2]


def painted_covariance(maps: EvidenceMaps, obj: ObjectSpec, pose, K, T) -> np.ndarray | None:
    """(2, 2) covariance (m^2) of the painted fit's (x, y) at ``pose`` (``localize.fit_pose_painted``): the
    Gauss-Newton curvature of its loss over the pixels near the object that the arm leaves visible (the faces'
    colours held at their fit, each pixel at its robust weight), times the weighted residual per value. None
    when the silhouette is outside the image or no still was registered."""
    H, W = maps.img.shape[:2]
    win = silhouette_window(obj, pose, K, T, W, H)
    if win is None or maps.background is None:
        return None
    x0, y0, x1, y1 = win
    sides = visible_sides(obj, pose, T)
    fit = painted(maps, obj, pose, K, T, win, sides)
    free, colours = fit["pixels"], fit["colours"]
    if free.sum() < 6:
        return None
    still = maps.background[y0:y1, x0:x1][free].astype(np.float64)

    def image(p):
        A = np.stack([c[free] for c in face_coverage(obj, tuple(p), K, T, win, sides)], 1)
        return (still * (1.0 - A.sum(1))[:, None] + A @ colours).ravel()

    p0 = np.asarray(pose, np.float64)
    J = np.stack([(image(p0 + e * s) - image(p0 - e * s)) / (2 * s) for e, s in zip(np.eye(3), STEPS)], 1)
    w = np.repeat(fit["weight"], 3)
    s2 = float((fit["weight"] * fit["r2"]).sum()) / max(3 * len(fit["r2"]) - 3, 1)
    return (s2 * np.linalg.pinv((J * w[:, None]).T @ J))[:2, :2]


def radius_95(cov: np.ndarray) -> float:
    """The radius of the disc around the mean that holds 95% of a 2-D normal with covariance ``cov``."""
    lam = np.clip(np.linalg.eigvalsh(np.asarray(cov, np.float64)), 1e-18, None)
    th = (np.arange(720) + 0.5) * (2 * np.pi / 720)
    q = np.cos(th) ** 2 / lam[1] + np.sin(th) ** 2 / lam[0]

    def inside(R):  # P(|e| <= R), integrated over the direction
        return float(np.mean((1.0 - np.exp(-0.5 * R * R * q)) / q) / np.sqrt(lam[0] * lam[1]))

    lo, hi = 0.0, 4.0 * float(np.sqrt(lam[1]))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if inside(mid) < 0.95 else (lo, mid)
    return hi


def recording_clarity(residuals: list[dict]) -> float:
    """How clearly a recording's camera shows the objects as their own colour: the median, over every found
    object of every episode (``selfcheck.object_residual``), of the mean colour evidence inside its silhouette.
    Where light, white balance and prints wash the colours out (0.38 on the workshop cell, 0.47 on cool_studio,
    0.61 on the built-in lab), the silhouette fit leans on change from the still and shadows pull it further."""
    own = [r["own_colour"] for per in residuals for r in per.values() if "own_colour" in r]
    return float(np.median(own)) if own else 1.0


def object_uncertainty(maps: EvidenceMaps, obj: ObjectSpec, pose, K, T, visible: float, clarity: float,
                       calibration: dict | None, motion: dict | None, fit: str = "evidence") -> dict:
    """The position uncertainty of ``obj`` placed at ``pose`` (x, y, yaw) from the first frames' evidence
    ``maps`` (nothing claimed) through the episode's camera (``K``, ``T``): {"sd_m" (x, y), "cov_m2",
    "bound_95_m", "parts_px" (each part's 1 sd in pixels: camera, fit, floor, motion), "m_per_px", "parts_m2"
    (the pieces before scaling: per_px2 (m^2 per px^2 on the table), pose (the frames' disagreement about the
    camera, propagated), fit (the Laplace covariance))}.
    ``visible``: the share of its silhouette the arm leaves visible; ``clarity``: the recording's
    (``recording_clarity``); ``calibration``: the alignment's
    (its ``contour_residual_px`` and ``pose_covariance``; a calibration given without them adds no camera
    part); ``motion``: the episode's ``camera_motion.summary`` (None: no robot-free still to measure it);
    ``fit``: how the placement was fitted (``localize.localize_objects``)."""
    J_px = table_per_pixel(obj, pose, K, T)
    per_px = J_px @ J_px.T
    parts = {"per_px2": per_px, "pose": np.zeros((2, 2)), "fit": np.zeros((2, 2))}
    calibration = calibration or {}
    camera_px = CAMERA_SCALE * float(calibration.get("contour_residual_px") or 0.0)
    painted_fit = fit == "painted" and maps.background is not None
    if painted_fit:
        floor_px, fit_scale = PAINTED_FLOOR_PX / np.sqrt(max(float(visible), 0.1)), 1.0
    else:
        floor_px = FIT_FLOOR_PX / np.sqrt(max(float(visible), 0.1)) / max(float(clarity), 0.1) ** CLARITY_POWER
        fit_scale = FIT_SCALE
    motion_px = 0.0
    if motion is not None:
        motion_px = float(motion["offset_sd_px"]) if motion["moved"] else float(np.hypot(*motion["offset_px"]))
    C_pose = np.asarray(calibration.get("pose_covariance") or np.zeros((6, 6)), np.float64)
    if np.all(np.isfinite(C_pose)):
        J_pose = table_per_pose(obj, pose, K, T)
        parts["pose"] = J_pose @ C_pose @ J_pose.T
    laplace = painted_covariance(maps, obj, pose, K, T) if painted_fit else fit_covariance(maps, obj, pose, K, T)
    if laplace is not None:
        parts["fit"] = laplace
    fit_px = float(fit_scale * np.sqrt(np.trace(parts["fit"]) / max(np.trace(per_px), 1e-12)))
    cov = per_px * (camera_px ** 2 + floor_px ** 2 + motion_px ** 2) + parts["pose"] + fit_scale ** 2 * parts["fit"]
    return {"sd_m": [float(v) for v in np.sqrt(np.diag(cov))], "cov_m2": np.asarray(cov).round(10).tolist(),
            "bound_95_m": radius_95(cov),
            "parts_px": {"camera": round(camera_px, 3), "fit": round(fit_px, 3), "floor": round(float(floor_px), 3),
                         "motion": round(motion_px, 3)},
            "m_per_px": float(np.sqrt(abs(np.linalg.det(J_px)))),
            "parts_m2": {k: np.asarray(v).round(10).tolist() for k, v in parts.items()}}
