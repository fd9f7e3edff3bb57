"""Object appearance: crops around each twin object, scored against the real crops.

Frame metrics average over the whole image, where the backdrop dominates; a 5 cm cube covers
a few dozen of 16384 pixels at 128x128. Here each object the twin shows (label >= 2, at least
``min_pixels`` pixels) gets a ``size`` x ``size`` crop centred on its label centroid in that
frame (moved inside the image at the borders), cut from the predicted and the real frame alike:

- PSNR per crop (data range 255), then the mean over crops;
- LPIPS per crop (the ``lpips`` package's network), with both crops upsampled bilinearly to
  ``lpips_size`` pixels first: AlexNet's pooling needs inputs of about 32 px and more.

The labels are the twin's (decoded from ``<cam>_sim_seg``): the crop is where the twin put the
object, so a prediction that moves or loses the object scores low.
"""
from __future__ import annotations

import numpy as np

from comsim.metrics.frame import psnr

CROP_PX = 16
LPIPS_PX = 64
MIN_PIXELS = 4
FIRST_OBJECT_LABEL = 2  # 0 background, 1 robot, 2 + k object k


def object_crops(frames: np.ndarray, labels: np.ndarray, size: int = CROP_PX, min_pixels: int = MIN_PIXELS,
                 objects=None) -> list[tuple[int, int, int, int]]:
    """Where the crops are: [(frame, label, top, left)] for every visible object of every frame.
    ``objects``: the labels to crop (default: every label >= 2; pass the twin's objects' labels where
    known, so that a label decoded from codec-blended edges is never taken for an object)."""
    T, H, W = labels.shape
    if frames.shape[:3] != (T, H, W):
        raise ValueError(f"object crops: frames {frames.shape[:3]} and labels {labels.shape} differ")
    if size > min(H, W):
        raise ValueError(f"object crops: crop size {size} exceeds the {H}x{W} frames")
    boxes = []
    for t in range(T):
        for lab in np.unique(labels[t]):
            if lab < FIRST_OBJECT_LABEL or (objects is not None and lab not in objects):
                continue
            ys, xs = np.nonzero(labels[t] == lab)
            if len(ys) < min_pixels:
                continue
            top = int(np.clip(round(ys.mean()) - size // 2, 0, H - size))
            left = int(np.clip(round(xs.mean()) - size // 2, 0, W - size))
            boxes.append((t, int(lab), top, left))
    return boxes


def _cut(frames: np.ndarray, boxes, size: int) -> np.ndarray:
    return np.stack([frames[t, y:y + size, x:x + size] for t, _, y, x in boxes]) if boxes else \
        np.zeros((0, size, size, 3), np.uint8)


def object_crop_scores(pred: np.ndarray, ref: np.ndarray, labels: np.ndarray, lpips_model=None,
                       size: int = CROP_PX, lpips_size: int = LPIPS_PX, min_pixels: int = MIN_PIXELS,
                       objects=None) -> dict:
    """Crop scores of ``pred`` against ``ref`` (uint8 (T, H, W, 3)) around the objects of ``labels``
    (int (T, H, W), the twin's). ``lpips_model``: an ``lpips.LPIPS`` (``comsim.metrics.load_lpips``), or
    None for PSNR only; ``objects``: as ``object_crops``. Returns per-crop values too (``psnr_per_crop``,
    ``lpips_per_crop``, ``crops``) so that several episodes pool by crop (``pool_crop_scores``)."""
    boxes = object_crops(pred, labels, size, min_pixels, objects)
    if pred.shape != ref.shape:
        raise ValueError(f"object crops: pred {pred.shape} and ref {ref.shape} differ")
    p, r = _cut(pred, boxes, size), _cut(ref, boxes, size)
    out = {"crops": [[t, lab] for t, lab, _, _ in boxes], "psnr_per_crop": psnr(p, r).tolist() if boxes else []}
    if lpips_model is not None:
        from comsim.episode import resize_frames
        from comsim.metrics.frame import lpips_distance

        out["lpips_per_crop"] = (lpips_distance(resize_frames(p, (lpips_size, lpips_size)),
                                                resize_frames(r, (lpips_size, lpips_size)), lpips_model).tolist()
                                 if boxes else [])
    return out


def pool_crop_scores(results: list[dict], size: int = CROP_PX) -> dict:
    """Mean PSNR (and LPIPS) over every crop of several ``object_crop_scores`` results, and per object
    label. A crop identical to its reference (infinite PSNR) is left out of the PSNR mean and counted."""
    labels = np.array([c[1] for r in results for c in r["crops"]], np.int64)
    out = {"crop_px": size, "crops": int(len(labels))}
    for metric in ("psnr", "lpips"):
        key = f"{metric}_per_crop"
        if not results or not all(key in r for r in results):
            continue
        vals = np.array([v for r in results for v in r[key]], np.float64)
        keep = np.isfinite(vals)
        if metric == "psnr":
            out["identical_crops"] = int((~keep).sum())
        out[metric] = round(float(vals[keep].mean()), 4) if keep.any() else None
        out[f"{metric}_per_label"] = {int(lab): round(float(vals[keep & (labels == lab)].mean()), 4)
                                      for lab in np.unique(labels[keep])}
    return out
