"""Robot masks for frames that come without them: background model + self-trained colour cues.

A deliberate choice, for lab or real episodes that come without masks: no robot-free frame is
needed, so the same code runs on a real recording.

1. Background: a fixed camera sees the same background in every frame wherever the arm
   is not. Render the arm at the current camera estimate in every frame, dilate by the
   pose's uncertainty, and take each pixel's median over the frames in which it was free.
   Pixels the arm always covers (its base) have no background ("unknown").
2. Colour cues learned from the twin: pixels well inside the rendered arm are "robot",
   pixels well outside are "not robot". A k-nearest-neighbour classifier over the
   pixel's colour and its colour relative to the background (brightness ratio,
   chromaticity shift) learns what the arm, its shadows and the scene look like in THIS
   camera, whatever the lighting; where the background is unknown it uses colour alone.
3. Sub-pixel boundaries: near the classified boundary, each pixel's robot fraction is
   estimated by matting it between the nearest confident robot and background colours;
   boundary pixels without enough contrast are marked unknown instead of guessed.

Alternating this with calibration (better pose -> cleaner labels, smaller dilation ->
more background -> better masks) converges in a few rounds.
"""
from __future__ import annotations

import warnings

import cv2
import numpy as np
from scipy.spatial import cKDTree

from comsim.twin.silhouette import RobotSilhouette


def render_silhouettes(sil: RobotSilhouette, T: np.ndarray, joints: np.ndarray, fingers: np.ndarray) -> np.ndarray:
    sil.set_camera(T)
    out = []
    for q, f in zip(joints, fingers):
        sil.set_joints(q, f)
        out.append(sil.mask())
    return np.stack(out)


def _dilate(masks: np.ndarray, r: int) -> np.ndarray:
    if r <= 0:
        return masks.copy()
    k = np.ones((2 * r + 1, 2 * r + 1), np.uint8)
    return np.stack([cv2.dilate(m.astype(np.uint8), k) > 0 for m in masks])


def _erode(masks: np.ndarray, r: int) -> np.ndarray:
    if r <= 0:
        return masks.copy()
    k = np.ones((2 * r + 1, 2 * r + 1), np.uint8)
    return np.stack([cv2.erode(m.astype(np.uint8), k) > 0 for m in masks])


def background_model(frames: np.ndarray, exclude: np.ndarray, min_free: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel median over the frames where the pixel is not excluded.

    frames (N, H, W, 3); exclude bool (N, H, W). Returns the background float32 (H, W, 3)
    and ``known`` (H, W): pixels free in at least ``min_free`` frames.
    """
    x = frames.astype(np.float32)
    x[exclude] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN pixels are simply unknown
        bg = np.nanmedian(x, axis=0)
    known = (~exclude).sum(0) >= min_free
    return np.nan_to_num(bg, nan=0.0).astype(np.float32), known


def pixel_features(frame: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """(H, W, 6): log brightness and chromaticity of the pixel, then the same relative to
    the background (scaled so that each axis matters about equally to the kNN)."""
    f = frame.astype(np.float32) + 4.0
    b = bg.astype(np.float32) + 4.0
    Lf, Lb = f.sum(-1), b.sum(-1)
    cf, cb = f / Lf[..., None], b / Lb[..., None]
    return np.stack([0.5 * np.log(Lf), 5 * cf[..., 0], 5 * cf[..., 2], 0.5 * np.log(Lf / Lb),
                     5 * (cf[..., 0] - cb[..., 0]), 5 * (cf[..., 2] - cb[..., 2])], -1)


class RobotColourClassifier:
    """kNN robot/not-robot posterior from examples; 6 features where the background is
    known, the first 3 (colour alone) where it is not."""

    def __init__(self, pos: np.ndarray, neg: np.ndarray, max_examples: int = 20000, k: int = 16, seed: int = 0):
        rng = np.random.default_rng(seed)
        pos = pos[rng.permutation(len(pos))[:max_examples]]
        neg = neg[rng.permutation(len(neg))[:max_examples]]
        if len(pos) < k or len(neg) < k:
            raise ValueError(f"RobotColourClassifier: too few examples ({len(pos)} robot, {len(neg)} background)")
        self.x = np.concatenate([pos, neg]).astype(np.float64)
        self.y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
        self.k = k
        self.tree6, self.tree3 = cKDTree(self.x), cKDTree(self.x[:, :3])

    def predict(self, feats: np.ndarray, known: np.ndarray) -> np.ndarray:
        """Balanced posterior P(robot) per pixel (H, W)."""
        H, W, _ = feats.shape
        f, kn = feats.reshape(-1, 6).astype(np.float64), known.reshape(-1)
        p = np.zeros(len(f))
        if kn.any():
            p[kn] = self.y[self.tree6.query(f[kn], k=self.k)[1]].mean(1)
        if (~kn).any():
            p[~kn] = self.y[self.tree3.query(f[~kn, :3], k=self.k)[1]].mean(1)
        return p.reshape(H, W)


def clean_mask(p: np.ndarray, min_area: int = 6, max_hole: int = 40) -> np.ndarray:
    """Close 1-px gaps, drop specks, fill small enclosed holes (soft mask in, soft out)."""
    p = cv2.morphologyEx(p.astype(np.float32), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
    binary = (p > 0.5).astype(np.uint8)
    n, lab, stats, _ = cv2.connectedComponentsWithStats(binary, connectivity=8)
    small = np.zeros(n, bool)
    small[1:] = stats[1:, cv2.CC_STAT_AREA] < min_area
    p[small[lab]] = 0.0
    n, lab, stats, _ = cv2.connectedComponentsWithStats(1 - binary, connectivity=4)
    H, W = p.shape
    for k in range(1, n):
        x, y, w, h, area = stats[k]
        if area <= max_hole and x > 0 and y > 0 and x + w < W and y + h < H:
            p[lab == k] = 1.0
    return p


def _nearest_fill(img: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Each pixel takes the value of ``img`` at the nearest pixel where ``sources``."""
    _, lab = cv2.distanceTransformWithLabels((~sources).astype(np.uint8), cv2.DIST_L2, 5,
                                             labelType=cv2.DIST_LABEL_PIXEL)
    ys, xs = np.nonzero(sources)
    table = np.zeros((lab.max() + 1,) + img.shape[2:], img.dtype)
    table[lab[ys, xs]] = img[ys, xs]
    return table[lab]


def matte(frame: np.ndarray, coarse: np.ndarray, band: int = 2, min_contrast: float = 20.0,
          bg: np.ndarray | None = None, inner_px: int = 1):
    """Sub-pixel robot fraction near the boundary of ``coarse`` and a validity map.

    Each boundary pixel is a mix of the nearest confident robot colour F (``inner_px``
    inside the coarse mask) and background colour B (the nearest pixel outside, or the
    same pixel of a robot-free still ``bg``): alpha = (I - B).(F - B) / |F - B|^2. Where
    |F - B| < ``min_contrast`` the mix is unreadable and the pixel is marked invalid.
    """
    I = frame.astype(np.float32)
    C = (coarse > 0.5).astype(np.uint8)
    ki = np.ones((2 * inner_px + 1, 2 * inner_px + 1), np.uint8)
    inner, outer = cv2.erode(C, ki) > 0, ~(cv2.dilate(C, np.ones((3, 3), np.uint8)) > 0)
    if not inner.any():
        inner = cv2.erode(C, np.ones((3, 3), np.uint8)) > 0
    if not inner.any() or not outer.any():
        return C.astype(np.float32), np.ones(C.shape, bool)
    kb = np.ones((2 * band + 1, 2 * band + 1), np.uint8)
    boundary = (cv2.dilate(C, kb) > 0) & ~(cv2.erode(C, kb) > 0)
    F = _nearest_fill(I, inner)
    B = _nearest_fill(I, outer) if bg is None else bg.astype(np.float32)
    d = F - B
    den = (d * d).sum(-1)
    alpha = np.clip(((I - B) * d).sum(-1) / np.maximum(den, 1e-6), 0.0, 1.0)
    alpha = np.where(boundary, alpha, C.astype(np.float32)).astype(np.float32)
    valid = ~boundary | (np.sqrt(den) > min_contrast)
    return alpha, valid


def derive_masks(frames: np.ndarray, joints: np.ndarray, fingers: np.ndarray, sil: RobotSilhouette,
                 T: np.ndarray, margin_px: int, background: tuple | None = None, prior: float = 0.3,
                 seed: int = 0, pose_free: bool = False, background_image: np.ndarray | None = None,
                 area_scale: float = 1.0) -> dict:
    """Robot masks for ``frames`` (pinhole, undistorted) given a camera estimate ``T``
    whose silhouettes are trusted to within ``margin_px``.

    ``background``: (frames, joints, fingers) to build the background from (default: the
    frames themselves; more frames with the arm elsewhere give more background).
    ``pose_free``: skip the learned colour cues (first round, pose still far off).
    ``background_image``: a robot-free still of the same camera (e.g. the arm parked out of
    view): the background is then known everywhere, and only pixels within a band around
    the rendered arm (3 x ``margin_px``) are classified (the rest is background).
    ``area_scale``: pixel-area scale of the speck / hole sizes (e.g. 16 at 4x the resolution).
    Returns dict(masks (N, H, W) soft, valid (N, H, W), coarse (N, H, W), bg, known).
    """
    if background_image is not None:
        bg, known = background_image.astype(np.float32), np.ones(frames.shape[1:3], bool)
    else:
        bf, bj, bfi = background if background is not None else (frames, joints, fingers)
        bg, known = background_model(bf, _dilate(render_silhouettes(sil, T, bj, bfi), margin_px))
    min_area, max_hole = max(1, int(round(6 * area_scale))), int(round(40 * area_scale))
    if pose_free:  # the pose is too rough to label pixels: contrast cues only
        c = contrast_masks(frames, bg, known, min_area=min_area, max_hole=max_hole)
        return {"masks": c, "valid": np.ones(c.shape, bool), "coarse": c, "bg": bg, "known": known}
    sils = render_silhouettes(sil, T, joints, fingers)
    # Positives: well inside the rendered arm (thin links vanish under a wide erosion, so cap it).
    px = np.sqrt(area_scale)  # pixels per pixel at the 128-px scale the defaults were set for
    pos_m, neg_m = _erode(sils, min(int(round(2 * px)), max(1, margin_px // 2))), ~_dilate(sils, margin_px)
    if background_image is not None:  # fine pixels are noisy: classify a little smoothed colour
        sm = 0.5 * np.sqrt(area_scale)
        g = (lambda x: cv2.GaussianBlur(x.astype(np.float32), (0, 0), sm))
        feats = np.stack([pixel_features(g(f), g(bg)) for f in frames])
    else:
        feats = np.stack([pixel_features(f, bg) for f in frames])
    clf = RobotColourClassifier(feats[pos_m], feats[neg_m], seed=seed)
    band = _dilate(sils, 3 * margin_px) if background_image is not None else np.ones(sils.shape, bool)
    coarse, alphas, valids = [], [], []
    for f, ft, bd in zip(frames, feats, band):
        p = np.zeros(bd.shape)
        ys, xs = np.nonzero(bd)
        p[ys, xs] = clf.predict(ft[ys, xs][None], known[ys, xs][None])[0]
        p = p * prior / (p * prior + (1 - p) * (1 - prior) + 1e-9)  # few pixels are robot
        c = clean_mask(p, min_area=min_area, max_hole=max_hole)
        if background_image is not None:  # B from the still itself; F sampled beyond the blur
            px = np.sqrt(area_scale)
            a, v = matte(f, c, band=int(round(2 * px)), bg=bg, inner_px=int(round(1.5 * px)))
        else:
            a, v = matte(f, c)
        coarse.append(c)
        alphas.append(a)
        valids.append(v)
    return {"masks": np.stack(alphas), "valid": np.stack(valids), "coarse": np.stack(coarse), "bg": bg,
            "known": known}


def contrast_masks(frames: np.ndarray, bg: np.ndarray, known: np.ndarray, diff_lo: float = 14.0,
                   diff_hi: float = 30.0, min_area: int = 6, max_hole: int = 40) -> np.ndarray:
    """Pose-free first guess (N, H, W): pixels clearly brighter than the background (a
    Panda's white shell) or far darker (its black caps); moderately darker pixels are
    shadows, strongly coloured ones objects. Used before any pose is trusted."""
    out = []
    for frame in frames:
        f = cv2.GaussianBlur(frame.astype(np.float32), (3, 3), 0.7)
        b = cv2.GaussianBlur(bg, (3, 3), 0.7)
        diff = np.clip((np.linalg.norm(f - b, axis=-1) - diff_lo) / (diff_hi - diff_lo), 0.0, 1.0)
        ratio = (f.sum(-1) + 15.0) / (b.sum(-1) + 15.0)
        p = diff * np.maximum(np.clip((ratio - 1.04) / 0.12, 0, 1), np.clip((0.42 - ratio) / 0.12, 0, 1))
        sat = (f.max(-1) - f.min(-1)) / (f.max(-1) + 1.0)
        p *= np.clip((0.55 - sat) / 0.2, 0.0, 1.0)
        p[~known] = 0.0
        out.append(clean_mask(p, min_area=min_area, max_hole=max_hole))
    return np.stack(out)
