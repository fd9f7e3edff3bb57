"""Scores that see the robot: its region, its edges, and seams on the translator's token grid.

Whole-frame PSNR can be won by hedging: where the twin's arm is a pixel out of line with the real
one, the MSE-optimal drawing is the average of arm and background, a soft, doubled, half-transparent
arm. These scores sit beside it (docs/metrics.md, "Robot region"):

- ``region_psnr`` / ``region_ssim``: PSNR and SSIM inside the real robot mask, per frame; pooled as
  the mean over frames, split into still and moving frames by ``outline_motion``;
- ``edge_peaks``: the sharpness of the robot's outline: for every outline pixel of the real mask,
  the largest luma gradient (forward differences) within +-``EDGE_BAND_PX``; a prediction's sum over
  those pixels divided by the real frames' sum is its sharpness ratio (1 for the real frames; a sharp
  arm 1 px off keeps ~1, a blurred, doubled or see-through one drops);
- ``seam_sums``: mean |luma step| across the lines of the ``token_px`` grid over the same across the
  lines half a token further on (8x8 JPEG blocks and anything else with a period that divides half a
  token cancel); on the whole frame and near the robot (within half a token of its mask).

Frames are uint8 (T, H, W, 3), masks bool (T, H, W) (the caller's: the lab's true robot masks where a
recording has them, the twin's label 1 dilated otherwise). ``robot_region_scores`` returns per-frame
values so that episodes pool by frame (``pool_robot_region``).
"""
from __future__ import annotations

import numpy as np
from scipy import ndimage

from comsim.io.labels import ROBOT_LABEL, rgb_to_seg
from comsim.metrics import frame as fm

TOKEN_PX = 16  # the translator's patch in pixels (tiny_lab: 16x16 pixel patches)
EDGE_BAND_PX = 2  # an outline pixel's peak gradient is searched within +-2 px: a sharp arm 1 px off is not blur
STILL_BELOW_PX = 0.25  # outline motion per frame, in px at 128 px frame width: below it a frame is still
MOTION_REF_WIDTH = 128
LABEL_DILATE_PX = 2  # the twin's robot label grown by 2 px (at 128 px width) where no true mask exists
LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R BT.601


def luma(frames: np.ndarray) -> np.ndarray:
    """float64 (T, H, W) luma in [0, 255] of uint8 (T, H, W, 3) frames."""
    return np.asarray(frames, np.float64) @ LUMA


def resize_masks(masks: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """bool (T, H, W) masks at ``size`` (h, w): a pixel is in where the mask covers at least half of it."""
    masks = np.asarray(masks, bool)
    if masks.shape[1:] == tuple(size):
        return masks
    from comsim.episode import resize_frames

    cover = resize_frames(np.repeat(masks[..., None].astype(np.uint8) * 255, 3, -1), tuple(size))[..., 0]
    return cover >= 128


def robot_masks_from_labels(seg_frames: np.ndarray, size: tuple[int, int] | None = None) -> np.ndarray:
    """The twin's robot masks, bool (T, H, W), from its label video (``<cam>_sim_seg``: palette
    colours after lossy coding, uint8 (T, H, W, 3)). At another ``size`` (h, w) a pixel is robot
    where the robot covers at least half of it."""
    robot = rgb_to_seg(np.asarray(seg_frames)) == ROBOT_LABEL
    return robot if size is None else resize_masks(robot, size)


def label_robot_masks(seg_frames: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Where a real cell has no truth: the twin's robot (label 1 of its ``<cam>_sim_seg`` video) at ``size``,
    grown by ``LABEL_DILATE_PX`` (at 128 px width) to cover the twin's misalignment, and the label itself
    (whose outline motion splits still from moving frames)."""
    label = robot_masks_from_labels(seg_frames, size)
    return dilate(label, max(1, round(LABEL_DILATE_PX * size[1] / MOTION_REF_WIDTH))), label


def dilate(masks: np.ndarray, px: int) -> np.ndarray:
    """Each (T, H, W) mask grown by ``px`` pixels (a (2 px + 1)^2 square), frame by frame."""
    if px <= 0:
        return np.asarray(masks, bool)
    return ndimage.binary_dilation(masks, np.ones((1, 2 * px + 1, 2 * px + 1), bool))


def outline(masks: np.ndarray) -> np.ndarray:
    """The mask's own pixels that touch a non-mask pixel (4-neighbours); the image border is not an edge."""
    masks = np.asarray(masks, bool)
    cross = np.zeros((3, 3, 3), bool)
    cross[1] = ndimage.generate_binary_structure(2, 1)  # within the frame, never across time
    return masks & ~ndimage.binary_erosion(masks, cross, border_value=1)


def outline_motion(masks: np.ndarray) -> np.ndarray:
    """How far the robot's outline moves at each frame, float64 (T,), in px at ``MOTION_REF_WIDTH`` px width:
    the pixels that change between two consecutive masks over the outline's length (the mean displacement
    normal to the outline), the larger of the step from the previous frame and the step to the next.
    A one-frame episode, or frames without robot, score 0."""
    masks = np.asarray(masks, bool)
    T, _, W = masks.shape
    if T < 2:
        return np.zeros(T)
    changed = (masks[1:] ^ masks[:-1]).sum(axis=(1, 2))
    length = np.maximum(outline(masks).sum(axis=(1, 2)), 1)
    step = changed / np.maximum(length[1:], length[:-1]) * (MOTION_REF_WIDTH / W)  # (T-1,): frame k-1 -> k
    return np.maximum(np.r_[step[0], step], np.r_[step, step[-1]])


def moving_frames(masks: np.ndarray, still_below: float = STILL_BELOW_PX) -> np.ndarray:
    """bool (T,): True where ``outline_motion`` is at least ``still_below``."""
    return outline_motion(masks) >= still_below


def region_psnr(pred: np.ndarray, ref: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Per-frame PSNR (dB, data range 255) over the pixels (all three channels) inside ``masks``;
    inf where they are identical there, nan where the mask is empty."""
    pred, ref = fm.check_pair(pred, ref, "region psnr")
    masks = _check_masks(masks, pred, "region psnr")
    sq = ((pred.astype(np.float64) - ref.astype(np.float64)) ** 2).sum(-1)  # (T, H, W)
    n = masks.sum(axis=(1, 2)) * 3
    with np.errstate(divide="ignore", invalid="ignore"):
        mse = (sq * masks).sum(axis=(1, 2)) / n
        return np.where(n > 0, 10 * np.log10(fm.DATA_RANGE**2 / mse), np.nan)


def region_ssim(pred: np.ndarray, ref: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Per-frame SSIM (``frame.ssim``'s definition) averaged over the window centres inside ``masks``: the
    11x11 windows lie inside the image, so mask pixels within 5 px of the border are left out; nan where
    no window centre is in the mask."""
    pred, ref = fm.check_pair(pred, ref, "region ssim")
    masks = _check_masks(masks, pred, "region ssim")
    smap = fm.ssim_map(pred, ref)  # (T, H - 2r, W - 2r), centred on pixel (r + i, r + j)
    r = (masks.shape[1] - smap.shape[1]) // 2
    inner = masks[:, r:r + smap.shape[1], r:r + smap.shape[2]]
    n = inner.sum(axis=(1, 2))
    with np.errstate(invalid="ignore"):
        return np.where(n > 0, (smap * inner).sum(axis=(1, 2)) / np.maximum(n, 1), np.nan)


def gradient_magnitude(frames: np.ndarray) -> np.ndarray:
    """float64 (T, H, W): sqrt(dx^2 + dy^2) of the luma, forward differences (a step between two pixels is its
    full height; a two-pixel ramp, half), 0 past the last row / column."""
    y = luma(frames)
    dx, dy = np.zeros_like(y), np.zeros_like(y)
    dx[:, :, :-1] = y[:, :, 1:] - y[:, :, :-1]
    dy[:, :-1] = y[:, 1:] - y[:, :-1]
    return np.hypot(dx, dy)


def edge_peaks(frames: np.ndarray, masks: np.ndarray, band: int = EDGE_BAND_PX) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: the sum over the outline pixels of ``masks`` of the peak gradient magnitude within
    +-``band`` px of each, and the number of outline pixels. float64 (T,), int (T,)."""
    g = gradient_magnitude(frames)
    peak = ndimage.maximum_filter(g, size=(1, 2 * band + 1, 2 * band + 1), mode="nearest")
    edge = outline(_check_masks(masks, frames, "edge peaks"))
    return (peak * edge).sum(axis=(1, 2)), edge.sum(axis=(1, 2))


def seam_sums(frames: np.ndarray, token_px: int = TOKEN_PX, near: np.ndarray | None = None) -> np.ndarray:
    """Per frame (T, 4): [sum, count] of |luma step| across the token-grid lines (between pixel k*token - 1 and
    k*token, k >= 1, columns and rows) and [sum, count] across the lines half a token further on. ``near``:
    bool (T, H, W); a step counts only where one of its two pixels is in it."""
    if token_px < 2 or token_px % 2:
        raise ValueError(f"seam score: token_px must be an even number of pixels >= 2, got {token_px}")
    y = luma(frames)
    T, H, W = y.shape
    if min(H, W) <= token_px:
        raise ValueError(f"seam score: {H}x{W} frames hold no {token_px}-px token line")
    keep = np.ones((T, H, W), bool) if near is None else _check_masks(near, frames, "seam score")
    out = np.zeros((T, 4))
    for col, offset in ((0, 0), (2, token_px // 2)):
        for axis in (2, 1):  # steps across vertical lines (along x), then horizontal ones (along y)
            n = y.shape[axis]
            idx = np.arange(token_px + offset if offset else token_px, n, token_px)
            idx = idx[idx < n]
            a, b = np.take(y, idx - 1, axis=axis), np.take(y, idx, axis=axis)
            k = np.take(keep, idx - 1, axis=axis) | np.take(keep, idx, axis=axis)
            out[:, col] += (np.abs(b - a) * k).sum(axis=(1, 2))
            out[:, col + 1] += k.sum(axis=(1, 2))
    return out


def seam_score(sums: np.ndarray) -> float:
    """Pooled seam score of ``seam_sums`` rows (any frames): mean step on the grid / mean step off it."""
    s = np.asarray(sums, np.float64).reshape(-1, 4).sum(0)
    if s[1] == 0 or s[3] == 0 or s[2] == 0:
        return float("nan")
    return float((s[0] / s[1]) / (s[2] / s[3]))


def robot_region_scores(pred: np.ndarray, ref: np.ndarray, masks: np.ndarray, silhouette: np.ndarray | None = None,
                        token_px: int = TOKEN_PX, still_below: float = STILL_BELOW_PX,
                        band: int = EDGE_BAND_PX) -> dict:
    """Per-frame robot-region values of ``pred`` against ``ref`` in ``masks`` (bool (T, H, W): where the real
    robot is; PSNR, SSIM and the near-robot seam score use it). ``silhouette``: the robot's own mask, whose
    outline is where the sharpness is measured and whose motion splits still from moving frames (default:
    ``masks``; pass the label itself when ``masks`` is a dilated label). JSON-able lists, pooled by
    ``pool_robot_region``; the ref's own seam sums ride along so each prediction carries its reference."""
    masks = _check_masks(masks, pred, "robot region")
    robot = masks if silhouette is None else _check_masks(silhouette, pred, "robot region silhouette")
    moving = moving_frames(robot, still_below)
    near = dilate(masks, token_px // 2)
    pe, n_edge = edge_peaks(pred, robot, band)
    re, _ = edge_peaks(ref, robot, band)
    return {"moving": moving.tolist(), "psnr": region_psnr(pred, ref, masks).tolist(),
            "ssim": region_ssim(pred, ref, masks).tolist(), "edge_pred": pe.tolist(), "edge_ref": re.tolist(),
            "edge_px": n_edge.tolist(), "seam": seam_sums(pred, token_px).tolist(),
            "seam_near": seam_sums(pred, token_px, near).tolist(), "seam_ref": seam_sums(ref, token_px).tolist(),
            "seam_near_ref": seam_sums(ref, token_px, near).tolist(), "robot_px": masks.sum(axis=(1, 2)).tolist(),
            "token_px": token_px, "still_below": still_below, "band": band}


def pool_robot_region(results: list[dict]) -> dict:
    """Robot-region scores of several ``robot_region_scores`` results, pooled over every frame:

    - ``psnr`` / ``ssim`` (and ``_still`` / ``_moving``): the mean of the per-frame values over the frames
      with robot pixels (PSNR inf if any frame is identical inside the mask);
    - ``sharpness`` (and ``_still`` / ``_moving``): the sum of the prediction's outline peaks over the real
      frames' sum on the same outline pixels (a ratio of pooled means: every outline pixel weighs the same);
    - ``seam`` / ``seam_near_robot`` and the real frames' ``seam_real`` / ``seam_near_robot_real``."""
    if not results:
        raise ValueError("pool_robot_region: no results")
    cat = {k: np.concatenate([np.asarray(r[k], np.float64) for r in results]) for k in FRAME_KEYS}
    seams = {k: np.concatenate([np.asarray(r[k], np.float64).reshape(-1, 4) for r in results]) for k in SEAM_KEYS}
    moving = cat["moving"].astype(bool)
    scored = ~np.isnan(cat["psnr"])  # frames with robot pixels
    out = {"frames": int(len(moving)), "frames_with_robot": int(scored.sum()),
           "frames_still": int((scored & ~moving).sum()), "frames_moving": int((scored & moving).sum())}
    for split, sel in (("", scored), ("_still", scored & ~moving), ("_moving", scored & moving)):
        ssim_sel = sel & ~np.isnan(cat["ssim"])
        ref = cat["edge_ref"][sel].sum()
        out[f"psnr{split}"] = _round(cat["psnr"][sel].mean(), 3) if sel.any() else None
        out[f"ssim{split}"] = _round(cat["ssim"][ssim_sel].mean(), 4) if ssim_sel.any() else None
        out[f"sharpness{split}"] = _round(cat["edge_pred"][sel].sum() / ref, 4) if ref > 0 else None
    out["outline_px"] = int(cat["edge_px"].sum())
    for key, name in (("seam", "seam"), ("seam_near", "seam_near_robot"), ("seam_ref", "seam_real"),
                      ("seam_near_ref", "seam_near_robot_real")):
        out[name] = _round(seam_score(seams[key]), 4)
    first = results[0]
    out["protocol"] = {"token_px": first["token_px"], "still_below_px_at_128": first["still_below"],
                       "edge_band_px": first["band"], "near_robot_px": first["token_px"] // 2}
    return out


FRAME_KEYS = ("moving", "psnr", "ssim", "edge_pred", "edge_ref", "edge_px")
SEAM_KEYS = ("seam", "seam_near", "seam_ref", "seam_near_ref")


def _round(x, nd):
    x = float(x)
    return round(x, nd) if np.isfinite(x) else x


def _check_masks(masks, frames, where: str) -> np.ndarray:
    masks = np.asarray(masks)
    if masks.dtype != bool or masks.shape != np.shape(frames)[:3]:
        raise ValueError(f"{where}: masks must be bool {np.shape(frames)[:3]} like the frames, got "
                         f"{masks.dtype} {masks.shape}")
    return masks
