"""Object localization: each object of the twin spec, from one frame, placed on the table.

For every object (box or cylinder of known size):

1. Evidence (``EvidenceMaps``): a per-pixel likelihood that the pixel shows the object, from
   its chromaticity's shift towards the object's colour from the background (lighting and
   white balance move absolute colours; an object still shifts the surface it hides towards
   its own colour). With an object-free background image (the calibration's robot-free
   still), that still is first registered to the frame (exposure and white balance per
   channel, one-pixel shifts: ``register_background``) and any change from it that is not a
   shadow counts too (``change_not_shadow``): a face whose colour the light washes out, or a
   cube on a table of its own hue, is still a change from the still.
2. Candidates (``candidates``): connected blobs of the object's colour (and, with a still, of
   change), kept only where the object could be: resting on the table, of about its
   projected size there, changed from the still. Ranked by evidence, size fit, how much more
   they show this object's colour than another object's, and a prior around the twin spec's
   position. Objects are placed in order of how clearly they show their own colour; each
   placed one removes its pixels from the others' evidence.
3. Refinement (``fit_pose``): (x, y, yaw) maximizing the agreement between the object's
   projected silhouette (convex hull of its corners, rasterized with sub-pixel precision and
   area-averaged, so the objective is smooth) and the evidence. Several yaw starts; the yaw
   is reported modulo the shape's symmetry (90 deg for a square box, 180 deg for a
   rectangular one, none for a cylinder). A fit that slides off the table is dropped for the
   next candidate.

All geometry goes through the calibrated camera (K, T_cam_from_base, pinhole frames). How far
to trust the result is the self-check's business (``selfcheck.py``).
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


def visible_sides(obj: ObjectSpec, pose, T) -> list[int]:
    """The sides of a box at ``pose`` (x, y, yaw) turned towards the camera (indices into its corners: side i
    joins corners i and i + 1); none for a cylinder."""
    if obj.shape != "box":
        return []
    x, y, yaw = pose
    pts = object_points(obj, x, y, yaw)
    eye = -T[:3, :3].T @ T[:3, 3]
    out = []
    for i in range(4):
        j = (i + 1) % 4
        outward = np.r_[(pts[i, :2] + pts[j, :2]) / 2 - [x, y], 0.0]
        if outward @ (eye - (pts[i] + pts[j]) / 2) > 0:
            out.append(i)
    return out


def face_polygons(obj: ObjectSpec, pose, K, T, sides=None) -> list[np.ndarray]:
    """Image outlines (n, 2) of the faces the camera sees, each one colour under one light: the top, and
    for a box each side turned towards the camera (``sides``: these sides instead, ``visible_sides``); for a
    cylinder its whole silhouette (``face_coverage`` takes the top out of it)."""
    x, y, yaw = pose
    pts = object_points(obj, x, y, yaw)
    uv = project_points(K, T, pts)
    n = len(pts) // 2
    top = cv2.convexHull(uv[n:].astype(np.float32)).reshape(-1, 2)
    if obj.shape != "box":
        return [top, cv2.convexHull(uv.astype(np.float32)).reshape(-1, 2)]
    sides = visible_sides(obj, pose, T) if sides is None else sides
    return [top] + [np.stack([uv[i], uv[(i + 1) % 4], uv[n + (i + 1) % 4], uv[n + i]]) for i in sides]


def face_coverage(obj: ObjectSpec, pose, K, T, window: tuple[int, int, int, int], sides=None) -> list[np.ndarray]:
    """Fractional pixel coverage inside ``window`` of each face ``face_polygons`` names, blurred like the
    camera (a cylinder's second entry is its silhouette less its top)."""
    covs = [_fill(p, window) for p in face_polygons(obj, pose, K, T, sides)]
    if obj.shape != "box":
        covs[1] = np.clip(covs[1] - covs[0], 0.0, 1.0)
    return [cv2.GaussianBlur(c, (0, 0), BLUR_PX) for c in covs]


def chroma(img: np.ndarray) -> np.ndarray:
    f = img.astype(np.float32) + 6.0
    return f[..., :2] / f.sum(-1, keepdims=True)


def local_background(img: np.ndarray, object_px: float) -> np.ndarray:
    """What the surface around each pixel looks like without small objects: a median
    filter a few object-sizes wide."""
    k = int(max(5, 3 * object_px)) | 1
    return cv2.medianBlur(img, min(k, 255))


def colour_shift(img: np.ndarray, rgb, bg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(along, across) (H, W): the pixels' chromaticity shift from the background ``bg``, along the direction
    from the background's chromaticity to the colour ``rgb`` (0-1 floats; 1: fully that colour), and across
    it (chromaticity units)."""
    target = np.asarray(rgb[:3], np.float32) * 255 + 6.0
    target = target[:2] / target.sum()
    cb = chroma(bg)
    direction = target - cb
    norm2 = np.maximum((direction ** 2).sum(-1), 1e-6)
    shift = chroma(img) - cb
    along = (shift * direction).sum(-1) / norm2
    across = np.abs(shift[..., 0] * direction[..., 1] - shift[..., 1] * direction[..., 0]) / np.sqrt(norm2)
    return along, across


def colour_likelihood(img: np.ndarray, rgb, bg: np.ndarray, lo: float = 0.12, hi: float = 0.4) -> np.ndarray:
    """Soft map (H, W): evidence that a pixel shows an object of colour ``rgb`` (0-1 floats).

    Lighting and white balance move absolute colours a lot (a red cube under warm light
    reads orange), but an object still shifts the chromaticity of the surface it hides
    TOWARDS its own colour; shadows only darken it. The evidence is the pixel's
    chromaticity shift from the background, projected on the direction from the
    background to the object's colour, relative to that direction's length.
    """
    along, across = colour_shift(img, rgb, bg)
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


def register_background(img: np.ndarray, background: np.ndarray, exclude=None, shift_px: int = 1) -> np.ndarray:
    """The robot-free still made comparable with ``img``: scaled per channel by the median
    ratio of the two over the pixels not in ``exclude`` (exposure and white balance move
    between the still and an episode), then each pixel taken from the one of its neighbours
    within ``shift_px`` that is closest to ``img`` there. A still is drawn at another
    resolution and resampled, and a camera may have moved by a pixel since: the edges of the
    table and of its texture then land a pixel apart, which would read as change. An object
    is wider than ``shift_px``, so no neighbouring background pixel looks like it."""
    f, b = img.astype(np.float32), background.astype(np.float32)
    keep = np.ones(f.shape[:2], bool) if exclude is None else ~exclude
    if keep.any():
        b = np.clip(b * np.median((f[keep] + 6.0) / (b[keep] + 6.0), axis=0), 0.0, 255.0)
    H, W = f.shape[:2]
    r = int(shift_px)
    pad = cv2.copyMakeBorder(b, r, r, r, r, cv2.BORDER_REPLICATE)
    best, dist = b.copy(), np.linalg.norm(f - b, axis=-1)
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            s = pad[r + dy:r + dy + H, r + dx:r + dx + W]
            d = np.linalg.norm(f - s, axis=-1)
            closer = d < dist
            best[closer], dist[closer] = s[closer], d[closer]
    return best


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


AREA_RATIO = (0.3, 3.0)  # a candidate blob's pixel area over the object's projected area at its place
MIN_CHANGE = 0.4  # with a robot-free still: a candidate's mean change from it (the object is not in the still)
PRIOR_M = 0.2  # spread (m) of the prior on where an object is, around its position in the twin spec
MAX_FITS = 3  # candidates fitted, best first, until one's fitted pose rests on the table
COLOUR_FLOOR = 0.25  # colour term of a candidate: (floor + own colour) / (floor + another object's colour)


class EvidenceMaps:
    """One frame's evidence for every object: each colour's ``colour_likelihood`` against the
    background (the robot-free still registered to the frame, ``register_background``, else a
    local median) and, with a still, ``change_not_shadow`` from it; the arm's pixels are never
    evidence. ``claim`` removes the pixels of an object already placed from the others'."""

    def __init__(self, img: np.ndarray, colors: dict, object_px: float, background=None, exclude=None):
        self.img = img
        self.background = None if background is None else register_background(img, background, exclude)
        bg = local_background(img, object_px) if self.background is None else self.background
        self.like = {n: colour_likelihood(img, rgb, bg) for n, rgb in colors.items()}
        self.change = None if self.background is None else change_not_shadow(img, self.background, *CHANGE)
        self.free = np.ones(img.shape[:2], bool) if exclude is None else ~exclude
        self._apply()

    def _apply(self) -> None:
        for m in (*self.like.values(), *([] if self.change is None else [self.change])):
            m[~self.free] = 0.0

    def claim(self, mask: np.ndarray) -> None:
        self.free &= ~mask
        self._apply()

    def evidence(self, name: str) -> np.ndarray:
        """What an object's silhouette is fitted to: its colour, and with a still any change from
        it that is not a shadow (faces whose colour the light washes out, a specular top, a dark side)."""
        return self.like[name] if self.change is None else np.maximum(self.like[name], self.change)


def _on_table(p, obj: ObjectSpec, table) -> bool:
    if table is None:
        return True
    r = max(obj.size[:2]) / 2 if obj.shape == "box" else obj.size[0]
    return all(abs(p[i] - table.center[i]) <= table.size[i] / 2 - r for i in (0, 1))


def candidates(maps: EvidenceMaps, obj: ObjectSpec, K, T, table=None) -> list[dict]:
    """Blobs that could be ``obj``, best first: connected regions of its colour (and, with a still, of
    change from it), kept only where the object could be (resting on the table, the blob's area within
    ``AREA_RATIO`` of the object's projected area there, with a still: changed from it), scored by their
    evidence, how well their size fits, how much more they show this object's colour than another's, and
    the prior around the twin spec's position."""
    like, ev = maps.like[obj.name], maps.evidence(obj.name)
    seeds = [like > 0.3]
    if maps.change is not None:  # a face of the object's own colour can vanish against a table of that colour
        seeds.append(cv2.morphologyEx((ev > 0.5).astype(np.uint8), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8)) > 0)
    others = [m for n, m in maps.like.items() if n != obj.name]
    out = []
    for seed in seeds:
        n, lab, stats, cents = cv2.connectedComponentsWithStats(seed.astype(np.uint8), connectivity=8)
        for k in range(1, n):
            p = _ray_to_plane(K, T, cents[k], obj.half_height)
            if not _on_table(p, obj, table):
                continue
            blob = lab == k
            ratio = stats[k, cv2.CC_STAT_AREA] / max(expected_area_px(obj, K, T, p[0], p[1]), 1.0)
            if not AREA_RATIO[0] <= ratio <= AREA_RATIO[1]:
                continue
            if maps.change is not None and maps.change[blob].mean() < MIN_CHANGE:
                continue
            own = float(like[blob].mean())
            other = max((float(m[blob].mean()) for m in others), default=0.0)
            prior = np.exp(-np.sum((p[:2] - np.asarray(obj.pos[:2])) ** 2) / (2 * PRIOR_M ** 2))
            score = ev[blob].sum() * np.exp(-np.log(ratio) ** 2) * (COLOUR_FLOOR + own) / (COLOUR_FLOOR + other) * prior
            out.append({"score": float(score), "centre": cents[k], "bbox": stats[k, :4], "colour": own - other})
    return sorted(out, key=lambda c: -c["score"])


def fit_pose(maps: EvidenceMaps, obj: ObjectSpec, K, T, cand: dict) -> dict:
    """(x, y, yaw) whose silhouette best matches the object's evidence around the candidate ``cand``."""
    H, W = maps.img.shape[:2]
    p0 = _ray_to_plane(K, T, cand["centre"], obj.half_height)
    x0, y0, w, h = (int(v) for v in cand["bbox"])
    pad = int(max(w, h)) + 4
    win = (max(0, x0 - pad), max(0, y0 - pad), min(W, x0 + w + pad), min(H, y0 + h + pad))
    target = maps.evidence(obj.name)[win[1]:win[3], win[0]:win[2]]

    def loss(v):
        top, side = coverage(obj, (v[0], v[1], v[2]), K, T, win)
        return float(((top + side - target) ** 2).sum())

    x, y, yaw, fun = _nelder_mead(loss, p0, obj)
    return {"found": True, "pos": [x, y, float(obj.half_height)], "yaw": yaw,
            "score": float(1.0 - fun / max(float((target ** 2).sum()), 1e-6))}


SIGMA_RGB = 12.0  # robust scale of the painted fit's residual (0-255 units): noise and codec pass it, a print does not
SHADOW_MIN = 0.25  # the darkest a cast shadow makes the still (one factor on every channel)
IRLS_ROUNDS = 3


def painted(maps: EvidenceMaps, obj: ObjectSpec, pose, K, T, window, sides=None) -> dict:
    """The frame inside ``window`` as the twin explains it with ``obj`` at ``pose`` (x, y, yaw): the still
    (registered to the frame) with each face the camera sees (``face_coverage``) painted over it in one
    colour of its own (a face's light is its own: the lit top, a side in shade). The colours are solved by
    robust least squares (iteratively reweighted, Cauchy at ``SIGMA_RGB``), so the pixels of a print or a
    highlight, which disagree with the face's body colour, do not pull it. Where the object covers under
    half a pixel the still may also be darker by one factor on every channel (down to ``SHADOW_MIN``):
    its cast shadow is no part of it. ``sides``: ``face_polygons``'.

    Returns {"loss" (robust, summed over the pixels the arm leaves visible), "colours" (F, 3, 0-255),
    "cover" (n, F) each visible pixel's face coverage, "r2" (n,) squared residuals, "weight" (n,) their
    robust weights, "pixels" (window-sized bool: the visible pixels, in the order of the rows)}."""
    x0, y0, x1, y1 = window
    free = maps.free[y0:y1, x0:x1]
    img = maps.img[y0:y1, x0:x1][free].astype(np.float64)
    still = maps.background[y0:y1, x0:x1][free].astype(np.float64)
    shade = np.clip((img * still).sum(1) / np.maximum((still * still).sum(1), 1e-6), SHADOW_MIN, 1.0)
    A = np.stack([c[free] for c in face_coverage(obj, pose, K, T, window, sides)], 1)
    a = A.sum(1)
    w = np.ones(len(img))
    for _ in range(IRLS_ROUNDS):
        Aw = A * w[:, None]
        rhs = img - still * (1.0 - a)[:, None]
        colours = np.clip(np.linalg.solve(Aw.T @ A + 1e-3 * np.eye(A.shape[1]), Aw.T @ rhs), 0.0, 255.0)
        face = A @ colours
        r2 = ((img - still * (1.0 - a)[:, None] - face) ** 2).sum(1)
        r2_shadow = ((img - still * (shade * (1.0 - a))[:, None] - face) ** 2).sum(1)
        r2 = np.where(a < 0.5, np.minimum(r2, r2_shadow), r2)
        w = 1.0 / (1.0 + r2 / SIGMA_RGB ** 2)
    return {"loss": float((SIGMA_RGB ** 2 * np.log1p(r2 / SIGMA_RGB ** 2)).sum()), "colours": colours, "cover": A,
            "r2": r2, "weight": w, "pixels": free}


def fit_pose_painted(maps: EvidenceMaps, obj: ObjectSpec, K, T, cand: dict) -> dict:
    """(x, y, yaw) whose ``painted`` frame best explains the frame around the candidate ``cand`` (needs the
    robot-free still). Unlike ``fit_pose`` it fits the pixels, not a thresholded evidence map: a pixel half
    covered by a bright top face is half changed, not fully, so the silhouette does not grow towards the
    face with the most contrast (the lit top, away from the camera: measured with the lab's true cameras,
    ``fit_pose`` places cubes 0.1-0.65 px farther than they are on all three lab cells)."""
    H, W = maps.img.shape[:2]
    p0 = _ray_to_plane(K, T, cand["centre"], obj.half_height)
    x0, y0, w, h = (int(v) for v in cand["bbox"])
    pad = int(max(w, h)) + 4
    win = (max(0, x0 - pad), max(0, y0 - pad), min(W, x0 + w + pad), min(H, y0 + h + pad))

    def loss(v):
        return painted(maps, obj, (v[0], v[1], v[2]), K, T, win)["loss"]

    x, y, yaw, fun = _nelder_mead(loss, p0, obj)
    return {"found": True, "pos": [float(x), float(y), float(obj.half_height)], "yaw": yaw, "score": float(-fun),
            "fit": "painted"}


def _nelder_mead(loss, p0, obj: ObjectSpec) -> tuple[float, float, float, float]:
    """Minimize ``loss(x, y, yaw)`` from the table point ``p0`` with several yaw starts: x, y, yaw (modulo the
    shape's symmetry), loss."""
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
    yaw = 0.0 if period is None else float((yaw + period / 2) % period - period / 2)
    return float(x), float(y), yaw, float(r.fun)


def object_px(obj: ObjectSpec, K, T) -> float:
    """The object's projected size (pixels) at the image centre on the table."""
    centre = _ray_to_plane(K, T, [as_K(K)[2], as_K(K)[3]], obj.half_height)
    return float(np.sqrt(max(expected_area_px(obj, K, T, centre[0], centre[1]), 1.0)))


def localize_object(img: np.ndarray, obj: ObjectSpec, K, T, rgb=None, exclude=None, background=None,
                    table=None) -> dict:
    """(x, y, yaw) of ``obj`` resting on the table in the pinhole frame ``img`` (``localize_objects``
    with this object alone). Returns pos (3,), yaw, score, found."""
    return localize_objects(img, [obj], K, T, robot_mask=exclude, colors=None if rgb is None else {obj.name: rgb},
                            background=background, table=table)[obj.name]


def silhouette_window(obj: ObjectSpec, pose, K, T, width: int, height: int) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1): the object's projected silhouette at ``pose`` with a margin of one
    object size around it, clipped to the image; None when it is outside the image."""
    uv = project_points(K, T, object_points(obj, *pose))
    pad = int(np.ceil(np.ptp(uv, 0).max())) + 2
    x0, y0 = np.floor(uv.min(0)).astype(int) - pad
    x1, y1 = np.ceil(uv.max(0)).astype(int) + pad + 1
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
    if x1 - x0 < 2 or y1 - y0 < 2:
        return None
    return int(x0), int(y0), int(x1), int(y1)


FITS = ("evidence", "painted")  # fit_pose, fit_pose_painted (needs the robot-free still)


def localize_objects(img: np.ndarray, objects: list[ObjectSpec], K, T, robot_mask=None, colors=None,
                     background=None, table=None, fit: str = "evidence") -> dict:
    """{name: {found, pos (3,), yaw, score}} for every object of the spec in the pinhole frame ``img``.

    ``colors``: {name: rgb} to look for (default: the spec's); ``robot_mask`` (H, W) bool: pixels
    to ignore (the arm); ``background``: an object-free image of the same camera (the
    calibration's robot-free still, resampled): then the colour evidence is measured against it
    (instead of a local median estimate) and joined by ``change_not_shadow``, so that faces whose
    colour the light washed out count too, and a candidate must have changed from it (measured on
    the lab with the true camera: 1.0 -> 0.56 cm mean, 2.1 -> 1.3 cm max); ``table``: the twin's
    TableSpec (objects rest on it). Objects are placed in the order of how clearly their best
    candidate shows their own colour; each one placed removes its pixels from the others' evidence,
    so two objects never share a blob. An object with no candidate is ``found: False``. ``fit``: how each
    candidate is refined, ``fit_pose`` ("evidence") or, with a ``background``, ``fit_pose_painted`` ("painted").
    """
    if fit not in FITS:
        raise ValueError(f"localize_objects: fit must be one of {FITS}, got {fit!r}")
    refine = fit_pose_painted if fit == "painted" and background is not None else fit_pose
    colors = {o.name: (o.rgba if colors is None or o.name not in colors else colors[o.name]) for o in objects}
    size = max((object_px(o, K, T) for o in objects), default=8.0)
    maps = EvidenceMaps(img, colors, size, background, robot_mask)
    first = {o.name: candidates(maps, o, K, T, table) for o in objects}
    order = sorted(objects, key=lambda o: -(first[o.name][0]["colour"] if first[o.name] else -np.inf))
    out = {}
    for o in order:
        cands = first[o.name] if not out else candidates(maps, o, K, T, table)
        # the best candidate whose fitted pose stays on the table (a fit can slide off a blob that is not the object)
        fits = (refine(maps, o, K, T, c) for c in cands[:MAX_FITS])
        out[o.name] = next((f for f in fits if _on_table(f["pos"], o, table)), None)
        if out[o.name] is None:
            out[o.name] = {"found": False, "pos": None, "yaw": None, "score": 0.0}
            continue
        H, W = img.shape[:2]
        top, side = coverage(o, (out[o.name]["pos"][0], out[o.name]["pos"][1], out[o.name]["yaw"]), K, T, (0, 0, W, H))
        maps.claim(cv2.dilate(((top + side) > 0.3).astype(np.uint8), np.ones((3, 3), np.uint8)) > 0)
    return {o.name: out[o.name] for o in objects}


def yaw_error(a: float, b: float, period: float | None) -> float:
    """|a - b| modulo the shape's symmetry, radians."""
    if period is None:
        return 0.0
    d = (a - b) % period
    return float(min(d, period - d))
