"""Which pixels of an object show its body colour and which a print on it (a label, a logo, a checker).

A printed cube is one colour in the twin, so its colour must be fitted on the pixels that show the body,
not the print (``colors.estimate_colors``' ``body``). Per face the camera sees (``localize.face_coverage``),
the pixels wholly on that face and not hidden by the arm are split in two by colour (2-means in RGB). Where
the two groups lie further apart than ``PRINT_SPLIT`` (0-255 units; a plain face's shading, noise and codec
spread its pixels less: under 35 for 96-100% of them on the three lab cells), the group that shows the
object's own colour less (its chromaticity shifted less from the still towards the object's nominal colour,
``localize.colour_shift``) is the print. The print's coverage is its share of those pixels.

At 128 px a print finer than a pixel (a 5 cm cube's logo or lettered label seen from 1.5 m) mixes with the
body in every pixel: the face reads paler as a whole and no pixel shows the body alone, so nothing is found
here and the colour fit takes the mixture.
"""
from __future__ import annotations

import numpy as np

from comsim.sim.spec import ObjectSpec
from comsim.twin.localize import EvidenceMaps, colour_shift, face_coverage, silhouette_window

FACE_MIN = 0.75  # a pixel belongs to one face when that face covers this much of it
PRINT_SPLIT = 70.0  # RGB distance (0-255) between a face's two colour groups that makes one of them a print
SPLIT_ROUNDS = 10


def _two_groups(rgb: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Labels (0/1) of a 2-means split of the pixels ``rgb`` (n, 3), started from the pixels first and last in
    ``order`` (deterministic)."""
    centres = rgb[[order[0], order[-1]]].astype(np.float64)
    labels = np.zeros(len(rgb), int)
    for _ in range(SPLIT_ROUNDS):
        labels = np.argmin(((rgb[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
        new = np.stack([rgb[labels == k].mean(0) if (labels == k).any() else centres[k] for k in (0, 1)])
        if np.allclose(new, centres):
            break
        centres = new
    return labels


def body_pixels(maps: EvidenceMaps, obj: ObjectSpec, pose, K, T, rgb) -> dict | None:
    """The pixels of ``obj`` at ``pose`` (x, y, yaw) in the frame of ``maps`` (with a registered still) that
    show its body colour, and what a print covers: {"body" (H, W) bool, "print_coverage" (share of the face
    pixels that show a print), "face_pixels", "print_pixels"}. ``rgb``: the object's nominal colour (0-1).
    None without a still or when no pixel lies wholly on one face."""
    H, W = maps.img.shape[:2]
    win = silhouette_window(obj, pose, K, T, W, H)
    if win is None or maps.background is None:
        return None
    x0, y0, x1, y1 = win
    img = maps.img[y0:y1, x0:x1].astype(np.float64)
    along, _ = colour_shift(maps.img[y0:y1, x0:x1], rgb, maps.background[y0:y1, x0:x1])
    free = maps.free[y0:y1, x0:x1]
    body = np.zeros((H, W), bool)
    face_px = print_px = 0
    for cov in face_coverage(obj, pose, K, T, win):
        on = (cov >= FACE_MIN) & free
        n = int(on.sum())
        if n == 0:
            continue
        face_px += n
        keep = on.copy()
        if n >= 2:
            px, al = img[on], along[on]
            labels = _two_groups(px, np.argsort(al, kind="stable"))
            if labels.min() != labels.max():
                centres = [px[labels == k].mean(0) for k in (0, 1)]
                if np.linalg.norm(centres[0] - centres[1]) > PRINT_SPLIT:
                    ink = int(np.argmin([al[labels == k].mean() for k in (0, 1)]))
                    idx = np.flatnonzero(on.ravel())[labels == ink]
                    keep.ravel()[idx] = False
                    print_px += len(idx)
        body[y0:y1, x0:x1] |= keep
    if face_px == 0:
        return None
    return {"body": body, "print_coverage": print_px / face_px, "face_pixels": face_px, "print_pixels": print_px}
