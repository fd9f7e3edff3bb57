"""Object localization: each object of the twin spec, from one frame, placed on the table.

For every object (box or cylinder of known size):

1. Colour cue: a per-pixel likelihood that the pixel shows the object, from its
   chromaticity's distance to the object's colour (the spec's nominal colour first, then
   the colour actually seen in the object's core: lighting and white balance shift it).
   With an object-free background image (calibration stills), also any change from it
   that is not a shadow (``change_not_shadow``).
2. Candidate: the connected blob with the most evidence whose size fits the object's
   expected projected size; its centre back-projected onto the plane z = half height.
3. Refinement: (x, y, yaw) maximizing the agreement between the object's projected
   silhouette (convex hull of its corners, rasterized with sub-pixel precision and
   area-averaged, so the objective is smooth) and the soft colour map. Several yaw
   starts; the yaw is reported modulo the shape's symmetry (90 deg for a square box,
   180 deg for a rectangular one, none for a cylinder).

All geometry goes through the calibrated camera (K, T_cam_from_base, pinhole frames).
"""
from __future__ import annotations

import cv2
import numpy as np
from scipy.optimize import minimize

from comsim.sim.camera import as_K, project_points
from comsim.sim.spec import ObjectSpec

SUPERSAMPLE = 8  # rasterization sub-pixels per pixel (cv2.fillPoly shift bits = 3)
BLUR_PX = 0.8  # optical blur + codec, in pixels: applied to the model, not the data


def symmetry(obj: ObjectSpec) -> float | None:
    """Yaw period of the shape (radians); None when yaw is meaningless."""
    if obj.shape == "cylinder":
        return None
    return np.pi / 2 if abs(obj.size[0] - obj.size[1]) < 1e-6 else np.pi


def object_points(obj: ObjectSpec, x: float, y: float, yaw: float) -> np.ndarray:
    """Points whose convex hull is the object's silhouette (world frame, resting on z = 0)."""
    c, s = np.cos(yaw), np.sin(yaw)
    R = np.array([[c, -s], [s, c]])
    if obj.shape == "box":
        hx, hy, h = obj.size[0] / 2, obj.size[1] / 2, obj.size[2]
        xy = np.array([[hx, hy], [hx, -hy], [-hx, -hy], [-hx, hy]])
    else:
        r, h = obj.size[0], obj.size[1]
        a = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        xy = r * np.stack([np.cos(a), np.sin(a)], 1)
    xy = xy @ R.T + [x, y]
    return np.concatenate([np.c_[xy, np.zeros(len(xy))], np.c_[xy, np.full(len(xy), h)]])


def _fill(hull_uv: np.ndarray, window) -> np.ndarray:
    x0, y0, x1, y1 = window
    S = SUPERSAMPLE
    # Pixel centres are integers: the window's top-left pixel spans [x0 - 0.5, x0 + 0.5).
    pts = np.round((hull_uv - [x0 - 0.5, y0 - 0.5]) * S * 8).astype(np.int32)  # 3 more fractional bits
    canvas = np.zeros(((y1 - y0) * S, (x1 - x0) * S), np.uint8)
    cv2.fillPoly(canvas, [pts], 255, lineType=cv2.LINE_8, shift=3)
    return cv2.resize(canvas.astype(np.float32) / 255.0, (x1 - x0, y1 - y0), interpolation=cv2.INTER_AREA)


def coverage(obj: ObjectSpec, pose, K, T, window: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Fractional pixel coverage inside ``window`` (x0, y0, x1, y1) of the object's top face
    and of the rest of its silhouette (the visible sides), each blurred like the camera.
    (Fitting the two with separate brightness levels was tried: the extra freedom let
    shadows and lit sides pull the pose, so the fit uses their sum.)"""
    uv = project_points(K, T, object_points(obj, *pose))
    whole = _fill(cv2.convexHull(uv.astype(np.float32)).reshape(-1, 2), window)
    top = _fill(cv2.convexHull(uv[len(uv) // 2:].astype(np.float32)).reshape(-1, 2), window)
    blur = (lambda c: cv2.GaussianBlur(c, (0, 0), BLUR_PX))
    return blur(top), blur(np.clip(whole - top, 0.0, 1.0))


def chroma(img: np.ndarray) -> np.ndarray:
    f = img.astype(np.float32) + 6.0
    return f[..., :2] / f.sum(-1, keepdims=True)


def local_background(img: np.ndarray, object_px: float) -> np.ndarray:
    """What the surface around each pixel looks like without small objects: a median
    filter a few object-sizes wide."""
    k = int(max(5, 3 * object_px)) | 1
    return cv2.medianBlur(img, min(k, 255))


def colour_likelihood(img: np.ndarray, rgb, bg: np.ndarray, lo: float = 0.12, hi: float = 0.4) -> np.ndarray:
    """Soft map (H, W): evidence that a pixel shows an object of colour ``rgb`` (0-1 floats).

    Lighting and white balance move absolute colours a lot (a red cube under warm light
    reads orange), but an object still shifts the chromaticity of the surface it hides
    TOWARDS its own colour; shadows only darken it. The evidence is the pixel's
    chromaticity shift from the background, projected on the direction from the
    background to the object's colour, relative to that direction's length.
    """
    target = np.asarray(rgb[:3], np.float32) * 255 + 6.0
    target = target[:2] / target.sum()
    cb = chroma(bg)
    direction = target - cb
    norm2 = np.maximum((direction ** 2).sum(-1), 1e-6)
    shift = chroma(img) - cb
    along = (shift * direction).sum(-1) / norm2  # 1 = fully the object's colour
    across = np.abs(shift[..., 0] * direction[..., 1] - shift[..., 1] * direction[..., 0]) / np.sqrt(norm2)
    score = np.clip((along - lo) / (hi - lo), 0.0, 1.0) * np.exp(-(across / 0.06) ** 2)
    return score.astype(np.float32)


CHANGE = (20.0, 40.0)  # change_not_shadow thresholds (0-255 units)


def change_not_shadow(img: np.ndarray, bg: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Soft map (H, W): the pixel differs from an object-free background by more than ``lo``
    (0-255 units, full at ``hi``), and not as a shadow does (all channels darker by about
    the same factor)."""
    f, b = img.astype(np.float32), bg.astype(np.float32)
    diff = np.linalg.norm(f - b, axis=-1)
    r = (f + 6.0) / (b + 6.0)
    spread = (r.max(-1) - r.min(-1)) / r.max(-1)  # 0: every channel scaled alike
    shadow = np.clip((0.95 - r.max(-1)) / 0.1, 0, 1) * np.clip((0.3 - spread) / 0.1, 0, 1)
    return (np.clip((diff - lo) / (hi - lo), 0.0, 1.0) * (1 - shadow)).astype(np.float32)


def _ray_to_plane(K, T, uv, z: float) -> np.ndarray:
    fx, fy, cx, cy = as_K(K)
    d_cam = np.array([(uv[0] - cx) / fx, (uv[1] - cy) / fy, 1.0])
    R, t = T[:3, :3], T[:3, 3]
    origin = -R.T @ t
    d = R.T @ d_cam
    s = (z - origin[2]) / d[2]
    return origin + s * d


def expected_area_px(obj: ObjectSpec, K, T, x: float, y: float) -> float:
    uv = project_points(K, T, object_points(obj, x, y, 0.0))
    return float(cv2.contourArea(cv2.convexHull(uv.astype(np.float32))))


def localize_object(img: np.ndarray, obj: ObjectSpec, K, T, rgb=None, exclude=None, background=None) -> dict:
    """(x, y, yaw) of ``obj`` resting on the table in the pinhole frame ``img``.

    ``rgb``: colour to look for (default: the spec's); ``exclude`` (H, W) bool: pixels to
    ignore (e.g. the robot); ``background``: an object-free image of the same camera (e.g.
    the calibration's background still, resampled): then the colour evidence is measured
    against it (instead of a local median estimate) and joined by ``change_not_shadow``,
    so that faces whose colour the light washed out count too (measured on the lab with
    the true camera: 1.0 -> 0.56 cm mean, 2.1 -> 1.3 cm max).
    Returns pos (3,), yaw, score, found.
    """
    H, W = img.shape[:2]
    centre = _ray_to_plane(K, T, [as_K(K)[2], as_K(K)[3]], obj.half_height)
    size_px = np.sqrt(max(expected_area_px(obj, K, T, centre[0], centre[1]), 1.0))
    bg = local_background(img, size_px) if background is None else background
    like = colour_likelihood(img, obj.rgba if rgb is None else rgb, bg)
    if exclude is not None:
        like[exclude] = 0.0
    n, lab, stats, cents = cv2.connectedComponentsWithStats((like > 0.3).astype(np.uint8), connectivity=8)
    best, best_score = None, 0.0
    for k in range(1, n):
        c = cents[k]
        p = _ray_to_plane(K, T, c, obj.half_height)
        expect = max(expected_area_px(obj, K, T, p[0], p[1]), 1.0)
        area = stats[k, cv2.CC_STAT_AREA]
        evidence = like[lab == k].sum()
        fit = np.exp(-np.log(max(area, 1) / expect) ** 2)  # blob size vs the object's projected size
        if evidence * fit > best_score:
            best, best_score = k, evidence * fit
    if best is None:
        return {"found": False, "pos": None, "yaw": None, "score": 0.0}
    p0 = _ray_to_plane(K, T, cents[best], obj.half_height)
    x0, y0, w, h = stats[best, :4]
    pad = int(max(w, h)) + 4
    win = (max(0, x0 - pad), max(0, y0 - pad), min(W, x0 + w + pad), min(H, y0 + h + pad))
    target = like[win[1]:win[3], win[0]:win[2]]
    if background is not None:  # + faces whose colour the light washes out (a specular top, a dark side)
        ch = change_not_shadow(img, background, *CHANGE)
        if exclude is not None:
            ch[exclude] = 0.0
        target = np.maximum(target, ch[win[1]:win[3], win[0]:win[2]])

    def loss(v):
        top, side = coverage(obj, (v[0], v[1], v[2]), K, T, win)
        return float(((top + side - target) ** 2).sum())

    period = symmetry(obj)
    starts = [0.0] if period is None else list(np.arange(0, period, period / 6))
    results = []
    for yaw0 in starts:
        r = minimize(loss, [p0[0], p0[1], yaw0], method="Nelder-Mead",
                     options={"initial_simplex": [[p0[0], p0[1], yaw0], [p0[0] + 0.01, p0[1], yaw0],
                                                  [p0[0], p0[1] + 0.01, yaw0], [p0[0], p0[1], yaw0 + 0.2]],
                              "xatol": 1e-4, "fatol": 1e-4, "maxfev": 300})
        results.append(r)
    r = min(results, key=lambda r: r.fun)
    x, y, yaw = r.x
    if period is None:
        yaw = 0.0
    else:
        yaw = float((yaw + period / 2) % period - period / 2)
    return {"found": True, "pos": [float(x), float(y), float(obj.half_height)], "yaw": yaw,
            "score": float(1.0 - r.fun / max(float((target ** 2).sum()), 1e-6))}


def localize_objects(img: np.ndarray, objects: list[ObjectSpec], K, T, robot_mask=None, colors=None,
                     background=None) -> dict:
    """{name: localize_object(...)} for every object of the spec."""
    out = {}
    for o in objects:
        rgb = None if colors is None else colors.get(o.name)
        out[o.name] = localize_object(img, o, K, T, rgb=rgb, exclude=robot_mask, background=background)
    return out


def yaw_error(a: float, b: float, period: float | None) -> float:
    """|a - b| modulo the shape's symmetry, radians."""
    if period is None:
        return 0.0
    d = (a - b) % period
    return float(min(d, period - d))
