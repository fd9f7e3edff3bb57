"""Fit ``T_cam_from_base`` so that rendered robot silhouettes agree with observed masks.

Two stages, both deterministic for a given seed:

1. ``coarse_search``: a cross-entropy search over 6-dof pose perturbations that
   maximizes a *trimmed* mean IoU (the worst frames do not vote) at a low resolution.
   It needs no gradients and escapes the flat regions where masks barely overlap.
2. ``refine_contour``: Gauss-Newton (Levenberg-Marquardt) on silhouette contours.
   Render depth, take the rendered silhouette's boundary pixels as 3D points on the
   robot, and move the camera so that those points project onto the observed mask's
   boundary: the residual is the observed mask's signed distance (in pixels) at each
   projected point. The signed distance comes from a soft mask upsampled before
   thresholding, so the observed boundary is located to a fraction of a pixel, and the
   solve sees thousands of points per frame: that is what sub-pixel (and sub-cm) poses
   need, which IoU's staircase cannot give a local optimizer. A redescending robust
   weight keeps parts that no pose explains (cables, a mislabelled finger, a frame whose
   joints were read at another instant) from pulling the pose.

Pose perturbations act on the camera side: ``T = [R(w) | v] @ T0`` with ``w``, ``v`` in
the camera frame (x right, y down, z forward), so rotations mostly shift the image and
translations mostly change parallax and scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
from scipy.spatial.transform import Rotation

from comsim.twin.silhouette import RobotSilhouette


def perturb(T0: np.ndarray, delta, pivot=None) -> np.ndarray:
    """``[R(rotvec) | v] @ T0`` with delta = (rx, ry, rz, vx, vy, vz), camera frame.

    With ``pivot`` (a camera-frame point, e.g. the robot's centre) the rotation turns the
    scene about that point instead of the camera centre: the big moves a coarse search
    needs (orbiting the robot) are then single coordinates, not rotation + translation.
    """
    d = np.asarray(delta, np.float64)
    D = np.eye(4)
    R = Rotation.from_rotvec(d[:3]).as_matrix()
    D[:3, :3] = R
    D[:3, 3] = d[3:] if pivot is None else d[3:] + np.asarray(pivot) - R @ np.asarray(pivot)
    return D @ T0


def pose_error(T_a: np.ndarray, T_b: np.ndarray) -> tuple[float, float]:
    """(metres, degrees) between two camera poses: camera centres and relative rotation."""
    c_a = -T_a[:3, :3].T @ T_a[:3, 3]
    c_b = -T_b[:3, :3].T @ T_b[:3, 3]
    R = T_a[:3, :3] @ T_b[:3, :3].T
    ang = np.degrees(np.arccos(np.clip((np.trace(R) - 1) / 2, -1.0, 1.0)))
    return float(np.linalg.norm(c_a - c_b)), float(ang)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def trimmed_mean(x, keep: float) -> float:
    """Mean of the best ``keep`` fraction (at least one value)."""
    x = np.sort(np.asarray(x, np.float64))[::-1]
    return float(x[:max(1, int(round(keep * len(x))))].mean())


# ----------------------------------------------------------------- observations


@dataclass
class MaskTargets:
    """Observed masks prepared for fitting: binary masks per size, signed distances.

    ``soft`` are float masks (N, H, W) in [0, 1] at the calibration image size; a soft
    boundary (blurred, anti-aliased, or undistorted with interpolation) is kept as
    sub-pixel information by the signed distance maps. ``valid`` (H, W) or (N, H, W),
    optional, marks pixels where the mask is known at all (e.g. where a background model
    exists); the rest counts neither for nor against a pose.
    """
    soft: np.ndarray
    valid: np.ndarray | None = None

    def __post_init__(self):
        self.soft = np.asarray(self.soft, np.float32)
        if self.valid is not None:
            v = np.asarray(self.valid, bool)
            self.valid = np.broadcast_to(v, self.soft.shape) if v.ndim == 2 else v
            # Unknown pixels become "robot" for the distance maps: they only ever hide the
            # robot's base (always covered), and the fit ignores contour points landing there.
            self.soft = np.where(self.valid, self.soft, 1.0).astype(np.float32)
        self._binary: dict[tuple[int, int], np.ndarray] = {}
        self._valid: dict[tuple[int, int], np.ndarray] = {}
        self._sdf: dict[int, tuple] = {}

    @property
    def size(self) -> tuple[int, int]:
        return self.soft.shape[2], self.soft.shape[1]

    def _resize(self, stack: np.ndarray, w: int, h: int) -> np.ndarray:
        if (w, h) == self.size:
            return stack > 0.5
        return np.stack([cv2.resize(m.astype(np.float32), (w, h), interpolation=cv2.INTER_AREA) > 0.5
                         for m in stack])

    def binary(self, w: int, h: int) -> np.ndarray:
        if (w, h) not in self._binary:
            self._binary[(w, h)] = self._resize(self.soft, w, h)
        return self._binary[(w, h)]

    def valid_at(self, w: int, h: int) -> np.ndarray | None:
        if self.valid is None:
            return None
        if (w, h) not in self._valid:
            self._valid[(w, h)] = self._resize(self.valid, w, h)
        return self._valid[(w, h)]

    def sdf(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, int]:
        """Signed distance of mask ``i`` in image pixels (> 0 outside), its gradient, a
        validity map (or None), and the upsampling factor ``f`` of the maps (sample them
        at ``f * (u + 0.5) - 0.5``)."""
        if i not in self._sdf:
            H, W = self.soft.shape[1:]
            f = int(max(1, 1024 // max(W, H)))
            up = self.soft[i] if f == 1 else cv2.resize(self.soft[i], (W * f, H * f), interpolation=cv2.INTER_LINEAR)
            inside = (up > 0.5).astype(np.uint8)
            d_out = cv2.distanceTransform(1 - inside, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)  # outside: to the mask
            d_in = cv2.distanceTransform(inside, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)  # inside: to the outside
            # Pixel centres either side of an edge are half a (fine) pixel from it.
            sdf = np.where(inside > 0, -(d_in - 0.5), d_out - 0.5) / f
            gy, gx = np.gradient(sdf)
            valid = None
            if self.valid is not None:  # contour points within 2 px of unknown pixels do not count
                v = cv2.erode(self.valid[i].astype(np.uint8), np.ones((5, 5), np.uint8), borderType=cv2.BORDER_CONSTANT,
                              borderValue=1)
                valid = cv2.resize(v.astype(np.float32), (W * f, H * f), interpolation=cv2.INTER_NEAREST)
            self._sdf[i] = (sdf.astype(np.float32), (gx * f).astype(np.float32), (gy * f).astype(np.float32),
                            valid, f)
        return self._sdf[i]


def _bilinear(img: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.size == 0:
        return np.zeros(0, np.float32)
    return cv2.remap(img, x.astype(np.float32)[None], y.astype(np.float32)[None], cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_REPLICATE)[0]


# ----------------------------------------------------------------- scoring


class SilhouetteScorer:
    """IoU of rendered silhouettes against observed masks, per frame, at a chosen size."""

    def __init__(self, sil: RobotSilhouette, joints: np.ndarray, fingers: np.ndarray, targets: MaskTargets):
        self.sil, self.joints, self.fingers, self.targets = sil, joints, fingers, targets

    def render(self, T: np.ndarray, j: int, w: int, h: int) -> np.ndarray:
        self.sil.set_camera(T)
        self.sil.set_joints(self.joints[j], self.fingers[j])
        return self.sil.mask(w, h)

    def _iou(self, rendered: np.ndarray, i: int, w: int, h: int) -> float:
        obs = self.targets.binary(w, h)[i]
        valid = self.targets.valid_at(w, h)
        if valid is None:
            return iou(rendered, obs)
        return iou(rendered & valid[i], obs & valid[i])

    def per_frame(self, T: np.ndarray, frames, w: int, h: int) -> np.ndarray:
        return np.array([self._iou(self.render(T, i, w, h), i, w, h) for i in frames])

    def matrix(self, T: np.ndarray, w: int, h: int) -> np.ndarray:
        """IoU[i, j]: image i's mask against the silhouette at joint vector j."""
        n = len(self.joints)
        out = np.zeros((n, n))
        for j in range(n):
            m = self.render(T, j, w, h)
            for i in range(n):
                out[i, j] = self._iou(m, i, w, h)
        return out


# ----------------------------------------------------------------- stage 1: coarse search


def coarse_search(scorer: SilhouetteScorer, T0: np.ndarray, frames, size: tuple[int, int],
                  sigma_rot: float = 0.08, sigma_trans: float = 0.08, iters: int = 10, pop: int = 24,
                  elite: int = 6, keep: float = 0.7, seed: int = 0,
                  pivot_base=(0.3, 0.0, 0.4), patience: int = 3, min_gain: float = 0.002
                  ) -> tuple[np.ndarray, float]:
    """Cross-entropy search around T0; returns the best pose and its trimmed mean IoU."""
    rng = np.random.default_rng(seed)
    w, h = size

    def score(T):
        return trimmed_mean(scorer.per_frame(T, frames, w, h), keep)

    pivot = T0[:3, :3] @ np.asarray(pivot_base) + T0[:3, 3]
    mean = np.zeros(6)
    std = np.array([sigma_rot] * 3 + [sigma_trans] * 3)
    best_T, best = T0, score(T0)
    stale = 0
    for _ in range(iters):
        before = best
        deltas = mean + std * rng.standard_normal((pop, 6))
        deltas[0] = mean
        scores = np.array([score(perturb(T0, d, pivot)) for d in deltas])
        order = np.argsort(-scores)
        if scores[order[0]] > best:
            best, best_T = float(scores[order[0]]), perturb(T0, deltas[order[0]], pivot)
        el = deltas[order[:elite]]
        mean = el.mean(0)
        std = np.maximum(el.std(0), [2e-3] * 3 + [2e-3] * 3)  # keep exploring a little
        stale = stale + 1 if best - before < min_gain else 0
        if stale >= patience:  # the population has settled: the local refinement takes over
            break
    return best_T, best


# ----------------------------------------------------------------- stage 2: contour refinement


def _contour_points(scorer: SilhouetteScorer, T: np.ndarray, frame: int, w: int, h: int) -> np.ndarray:
    """Base-frame 3D points under the rendered silhouette's boundary pixels (N, 3)."""
    sil = scorer.sil
    sil.set_camera(T)
    sil.set_joints(scorer.joints[frame], scorer.fingers[frame])
    depth = sil.depth(w, h)
    inside = np.isfinite(depth).astype(np.uint8)
    eroded = cv2.erode(inside, np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], np.uint8), borderType=cv2.BORDER_REPLICATE)
    edge = (inside > 0) & (eroded == 0)
    edge[:2], edge[-2:], edge[:, :2], edge[:, -2:] = False, False, False, False  # image border is no silhouette edge
    v, u = np.nonzero(edge)
    z = depth[v, u].astype(np.float64)
    fx, fy, cx, cy = sil.K_at(w, h)
    Xc = np.stack([(u - cx) / fx * z, (v - cy) / fy * z, z], 1)
    R, t = T[:3, :3], T[:3, 3]
    return (Xc - t) @ R  # R^T (Xc - t)


def _contour_residuals(scorer: SilhouetteScorer, P: np.ndarray, ids: np.ndarray, frames, Tc: np.ndarray, K,
                       bias: float, offset: float = 0.0):
    """Signed distances (px) of the contour points ``P`` (base frame; ``ids``: their index in ``frames``)
    projected by ``Tc`` to their frames' observed masks, the distance maps' gradients there (u, v), and
    the points in the camera frame. Points on unknown pixels get zero residual and zero gradient."""
    fx, fy, cx, cy = K
    Xc = P @ Tc[:3, :3].T + Tc[:3, 3]
    z = Xc[:, 2]
    u, v = fx * Xc[:, 0] / z + cx, fy * Xc[:, 1] / z + cy
    r = np.empty(len(P))
    gu, gv, ok = np.empty(len(P)), np.empty(len(P)), np.ones(len(P))
    for k, i in enumerate(frames):
        sel = ids == k
        sdf, gx, gy, valid, f = scorer.targets.sdf(i)
        xs, ys = f * (u[sel] + 0.5) - 0.5, f * (v[sel] + 0.5) - 0.5
        r[sel] = _bilinear(sdf, xs, ys) + bias
        gu[sel], gv[sel] = _bilinear(gx, xs, ys), _bilinear(gy, xs, ys)
        if valid is not None:
            ok[sel] = _bilinear(valid, xs, ys) > 0.5
    return (r + offset) * ok, gu * ok, gv * ok, Xc


def _contour_jacobian(Xc: np.ndarray, gu: np.ndarray, gv: np.ndarray, fx: float, fy: float) -> np.ndarray:
    """d residual / d(w, v) (N, 6) for a camera-side perturbation ``[R(w) | v] @ T`` (``perturb``)."""
    X, Y, Z = Xc[:, 0], Xc[:, 1], Xc[:, 2]
    # d(u,v)/dXc, then dXc/d(w, v) = [-[Xc]x | I] for Xc' = R(w) Xc + v.
    du = np.stack([fx / Z, np.zeros_like(Z), -fx * X / Z**2], 1)
    dv = np.stack([np.zeros_like(Z), fy / Z, -fy * Y / Z**2], 1)
    dX = gu[:, None] * du + gv[:, None] * dv  # d r / d Xc
    return np.concatenate([np.cross(Xc, dX), dX], 1)  # d r / d(w) = Xc x dX


def _contour_problem(scorer: SilhouetteScorer, T: np.ndarray, frames, render_size: tuple[int, int]):
    """Contour points of ``frames`` rendered at ``T`` and their residuals there: (ids, r, J) (``refine_contour``'s
    terms, without an offset)."""
    W, H = scorer.targets.size
    fx, fy, cx, cy = scorer.sil.K_at(W, H)
    rw, rh = render_size
    pts, ids = [], []
    for k, i in enumerate(frames):
        P = _contour_points(scorer, T, i, rw, rh)
        pts.append(P)
        ids.append(np.full(len(P), k))
    P, ids = np.concatenate(pts), np.concatenate(ids)
    r, gu, gv, Xc = _contour_residuals(scorer, P, ids, frames, T, (fx, fy, cx, cy), 0.5 * W / rw)
    known = (gu != 0) | (gv != 0)  # points on unknown pixels say nothing
    return ids[known], r[known], _contour_jacobian(Xc, gu, gv, fx, fy)[known]


def contour_residuals(scorer: SilhouetteScorer, T: np.ndarray, frames, render_size: tuple[int, int]) -> np.ndarray:
    """Signed distances (px of the masks) of the silhouettes' contour points at ``T`` from the masks' edges."""
    return _contour_problem(scorer, T, frames, render_size)[1]


def pose_covariance(scorer: SilhouetteScorer, T: np.ndarray, frames, render_size: tuple[int, int],
                    scale_px: float = 1.5) -> np.ndarray:
    """Covariance (6, 6) of a contour fit's pose ``T`` (``refine_contour``'s perturbation ``(w, v)``, camera
    frame), from how much the frames disagree about it: the robust fit's normal equations (each frame
    voting equally, as in the fit) sandwiching the spread of the frames' own gradients at ``T`` (a
    cluster-robust covariance, frames as clusters: errors correlated along a frame's contours, a mask
    that is off in one frame, count once per frame, not once per contour point)."""
    ids, r, J = _contour_problem(scorer, T, frames, render_size)
    n = len(frames)
    if len(r) < 6 or n < 2:
        return np.full((6, 6), np.nan)
    counts = np.bincount(ids, minlength=n).astype(np.float64)
    w = 1.0 / np.maximum(counts[ids], 1.0) / (1.0 + (r / scale_px) ** 2)
    A = (J * w[:, None]).T @ J
    g = np.stack([(J[ids == k] * (w * r)[ids == k, None]).sum(0) for k in range(n)])
    A_inv = np.linalg.pinv(A)
    return A_inv @ (g.T @ g) @ A_inv * n / (n - 1)


def refine_contour(scorer: SilhouetteScorer, T0: np.ndarray, frames, render_size: tuple[int, int],
                   outer: int = 6, inner: int = 8, scale_px: float = 2.0,
                   frame_weights=None, fit_offset: bool = False, points=None) -> tuple[np.ndarray, dict]:
    """Levenberg-Marquardt on contour signed distances; returns the pose and a log.

    ``render_size`` sets how finely contours are sampled (it may exceed the mask size:
    the boundary is then located to a fraction of an observed pixel). ``scale_px`` is the
    robust scale: residuals much larger than it are mostly ignored (Geman-McClure).

    ``fit_offset`` also fits one signed distance offset (px) for all contours: masks
    derived from images are often uniformly dilated or eroded by a fraction of a pixel
    (blur against a dark background), and left unmodelled that reads as a wrong camera
    distance (1 % of scale is ~1.4 cm at 1.4 m). Contours of varied depth separate the
    two: an offset is constant in pixels, a depth change scales each part by 1/Z.

    ``points``: ``(X, uv, weight)``, base-frame points (M, 3) seen at pixels ``uv`` (M, 2, at the masks' size)
    fitted along with the contours; each point's squared reprojection error (px) weighs ``weight`` times one
    frame's mean contour term (the twin's markers: points away from the arm that pin what its silhouettes
    leave loose, a camera orbiting the arm).
    """
    W, H = scorer.targets.size
    fx, fy, cx, cy = scorer.sil.K_at(W, H)
    rw, rh = render_size
    # Rendered contour pixels are half a render pixel inside the rendered boundary.
    bias = 0.5 * W / rw
    T = T0.copy()
    offset = 0.0
    log = {"outer": []}
    fw = np.ones(len(frames)) if frame_weights is None else np.asarray(frame_weights, np.float64)
    for _ in range(outer):
        pts, ids = [], []
        for k, i in enumerate(frames):
            P = _contour_points(scorer, T, i, rw, rh)
            pts.append(P)
            ids.append(np.full(len(P), k))
        P = np.concatenate(pts)
        ids = np.concatenate(ids)
        if len(P) < 6:  # the robot is out of view in every frame: nothing to fit
            log["outer"].append({"points": int(len(P)), "cost": float("nan"), "step_m": 0.0, "step_deg": 0.0,
                                 "offset_px": offset})
            break
        counts = np.bincount(ids, minlength=len(frames)).astype(np.float64)
        norm = fw[ids] / np.maximum(counts[ids], 1.0)  # each frame votes equally

        if points is not None:  # the points' rows go last, unweighted by the robust scale
            X_pts, uv_pts, w_pts = np.asarray(points[0], np.float64), np.asarray(points[1], np.float64), points[2]
            norm = np.concatenate([norm, np.full(2 * len(X_pts), float(w_pts))])
        n_contour = len(P)

        def residuals(Tc):
            r, gu, gv, Xc = _contour_residuals(scorer, P, ids, frames, Tc, (fx, fy, cx, cy), bias, offset)
            if points is None:
                return r, gu, gv, Xc
            Xp = X_pts @ Tc[:3, :3].T + Tc[:3, 3]
            uv = np.stack([fx * Xp[:, 0] / Xp[:, 2] + cx, fy * Xp[:, 1] / Xp[:, 2] + cy], 1)
            one, zero = np.ones(len(Xp)), np.zeros(len(Xp))
            # rows (u, v) of each point: a residual whose "distance map gradient" is the image axis
            return (np.concatenate([r, (uv - uv_pts).ravel()]),
                    np.concatenate([gu, np.stack([one, zero], 1).ravel()]),
                    np.concatenate([gv, np.stack([zero, one], 1).ravel()]),
                    np.concatenate([Xc, np.repeat(Xp, 2, axis=0)]))

        def robust(r):  # Geman-McClure on the contours, plain squares on the points
            out = scale_px**2 * np.log1p((r / scale_px) ** 2)
            out[n_contour:] = r[n_contour:] ** 2
            return out

        def cost(r):
            return float(np.sum(norm * robust(r)))

        lam = 1e-3
        r, gu, gv, Xc = residuals(T)
        c0 = cost(r)
        start = T.copy()
        for _ in range(inner):
            J = _contour_jacobian(Xc, gu, gv, fx, fy)
            if fit_offset:
                on_contour = (r != 0) & (np.arange(len(r)) < n_contour)
                J = np.concatenate([J, on_contour[:, None].astype(np.float64)], 1)
            wts = norm / (1.0 + (r / scale_px) ** 2)
            wts[n_contour:] = norm[n_contour:]
            A = (J * wts[:, None]).T @ J
            b = -(J * wts[:, None]).T @ r
            improved = False
            for _ in range(6):
                delta = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), b)
                Tn = perturb(T, delta[:6])
                old_offset = offset
                if fit_offset:
                    offset += delta[6]
                rn, gun, gvn, Xcn = residuals(Tn)
                cn = cost(rn)
                if cn >= c0:
                    offset = old_offset
                else:
                    T, r, gu, gv, Xc, c0 = Tn, rn, gun, gvn, Xcn, cn
                    lam = max(lam / 3, 1e-6)
                    improved = True
                    break
                lam *= 4
            if not improved or np.abs(delta).max() < 1e-6:
                break
        step = pose_error(T, start)
        log["outer"].append({"points": int(len(P)), "cost": c0, "step_m": step[0], "step_deg": step[1],
                             "offset_px": offset})
        if step[0] < 2e-5 and step[1] < 2e-3:
            break
    return T, log
