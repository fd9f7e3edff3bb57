"""Segmentation labels and their video encoding, in one place: palette, encode, decode.

Labels (docs/CONTRACTS.md): 0 background, 1 robot, 2 + k the scene's object k. A label video
(``<cam>_sim_seg``) stores each label as a far-apart palette colour, so it survives H.264.

    rgb = seg_to_rgb(labels)                 # int (..., H, W) -> uint8 (..., H, W, 3)
    labels = rgb_to_seg(decoded_rgb)         # after lossy coding: one rule, used by twin, metrics, translator
    labels = labels_from_palette(video, size=(128, 128))   # a whole video, checked, resized nearest
"""
from __future__ import annotations

import numpy as np

BACKGROUND_LABEL = 0
ROBOT_LABEL = 1
FIRST_OBJECT_LABEL = 2

# the seg video's colour of label i (0 background, 1 robot, 2 + k object k)
SEG_PALETTE = np.array([[0, 0, 0], [255, 255, 255], [230, 40, 40], [40, 90, 230], [40, 200, 60], [230, 200, 30],
                        [200, 40, 200], [30, 200, 200], [240, 130, 20], [130, 70, 20]], np.uint8)
# RGB distance within which a decoded pixel is its palette colour for certain: in the lab's label videos the
# background and robot decode within 3 and 12 of theirs (99th percentile), while the blend along an edge lands
# 40-110 away from any colour (bench/fidelity.py RUN --decode-stats 3 measures it).
SEG_DECODE_TOLERANCE = 32
# Confident pixels a label needs to count as present: a lone pixel of a blended edge can land within the tolerance
# of a colour no object has (one in 1.5 million did in a workshop episode, and the whole video grew a phantom
# object along every edge); an object the fidelity metric scores covers at least 4.
SEG_MIN_PIXELS = 4


def seg_to_rgb(labels: np.ndarray) -> np.ndarray:
    """Labels as palette colours, uint8 (..., 3)."""
    return SEG_PALETTE[np.clip(labels, 0, len(SEG_PALETTE) - 1)]


def rgb_to_seg(img: np.ndarray) -> np.ndarray:
    """Inverse of ``seg_to_rgb`` after lossy coding: the nearest palette colour among the labels present.

    H.264 blends colours across label edges (4:2:0 chroma): red (230, 40, 40) next to black decodes
    as about (160, 66, 68), and white next to black as grey; both lie nearest to label 9's brown, so
    a plain nearest-colour decode would grow a phantom object along every cube and arm edge. A label
    is present only if ``SEG_MIN_PIXELS`` pixels of ``img`` (a frame or a whole video) decode within
    ``SEG_DECODE_TOLERANCE`` of its colour; every pixel then takes the nearest colour among the
    present labels and the background."""
    d = ((img[..., None, :].astype(np.int32) - SEG_PALETTE.astype(np.int32)) ** 2).sum(-1)
    nearest = d.argmin(-1)
    confident = d.min(-1) <= SEG_DECODE_TOLERANCE ** 2
    present = np.bincount(nearest[confident], minlength=len(SEG_PALETTE)) >= SEG_MIN_PIXELS
    present[BACKGROUND_LABEL] = True
    d[..., ~present] = np.iinfo(np.int32).max
    return d.argmin(-1).astype(np.int32)


def labels_from_palette(seg_frames: np.ndarray, size: tuple[int, int] | None = None) -> np.ndarray:
    """A label video (palette colours after lossy coding, uint8 (T, H, W, 3)) -> int labels (T, H, W),
    or (T, *size) at another ``size`` (nearest neighbour: a label is never blended with its neighbour's)."""
    seg = np.asarray(seg_frames)
    if seg.dtype != np.uint8 or seg.ndim != 4 or seg.shape[-1] != 3:
        raise ValueError(f"segmentation frames must be uint8 (T, H, W, 3) palette colours, got {seg.dtype} {seg.shape}")
    labels = rgb_to_seg(seg)
    H, W = labels.shape[1:]
    if size is None or (H, W) == tuple(size):
        return labels
    rows = (np.arange(size[0]) * H // size[0]).astype(int)
    cols = (np.arange(size[1]) * W // size[1]).astype(int)
    return labels[:, rows][:, :, cols]
