"""Overlay PNGs the twin writes: silhouette outlines on real frames (written atomically)."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from comsim.io.files import write_png  # noqa: F401  (callers import it from here too)


def outline(mask: np.ndarray, thickness: int = 1) -> np.ndarray:
    """Boundary pixels of a boolean mask."""
    m = mask.astype(np.uint8)
    k = np.ones((2 * thickness + 1, 2 * thickness + 1), np.uint8)
    return (m > 0) & (cv2.erode(m, k) == 0)


def overlay_image(image: np.ndarray, rendered: np.ndarray, observed: np.ndarray | None = None,
                  label: str = "") -> np.ndarray:
    """The frame with the rendered silhouette's outline (green) and the observed mask's (magenta)."""
    img = image.copy()
    t = max(1, img.shape[1] // 320)
    if observed is not None:
        img[outline(observed, t)] = (255, 0, 255)
    img[outline(rendered, t)] = (0, 255, 0)
    if label:
        scale = max(0.35, img.shape[1] / 1280)
        org = (4, int(18 * scale / 0.5))
        cv2.putText(img, label, org, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 3, cv2.LINE_AA)
        cv2.putText(img, label, org, cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 1, cv2.LINE_AA)
    return img


def write_overlay(path, image, rendered, observed=None, label: str = "") -> Path:
    return write_png(path, overlay_image(image, rendered, observed, label))
