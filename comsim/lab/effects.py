"""What a real camera does to a clean render: the lab's sensor model.

Applied in this order, as in a real pipeline: lens (radial distortion, optical blur,
vignetting) -> sensor (white balance gain, noise) -> ISP (gamma-ish tone) -> codec
(JPEG-style compression). Every effect is seeded so a lab episode is reproducible.

Barrel distortion pulls content from outside the pinhole frame into the image corners, so
the clean render may be larger than the output (``render_K`` at ``render_size``: the same
camera with a margin); without one the corners are filled by replicating the border.
"""
from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass
class SensorLook:
    radial_k1: float = -0.08  # barrel distortion, OpenCV model (k1, k2) on normalized coords
    radial_k2: float = 0.01
    blur_sigma_px: float = 0.6
    vignetting: float = 0.35  # fraction of brightness lost at the corners
    white_balance: tuple[float, float, float] = (1.06, 1.0, 0.88)  # warm cast
    noise_std: float = 4.0  # gaussian read noise, in 0-255 units
    shot_noise: float = 0.6  # signal-dependent noise scale
    gamma: float = 0.92
    jpeg_quality: int = 70  # per-frame compression artefacts (the video codec adds its own)


def distortion_coeffs(look: SensorLook) -> np.ndarray:
    """OpenCV distortion vector (k1, k2, p1, p2, k3): what a user's intrinsics file would hold."""
    return np.array([look.radial_k1, look.radial_k2, 0.0, 0.0, 0.0], np.float64)


def _distortion_maps(K: np.ndarray, dist: np.ndarray, h: int, w: int,
                     render_K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # For each pixel of the distorted (real-looking) image, the pixel of the clean pinhole render
    # it shows: undistort the pixel's coordinates, then project with the render's K.
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    pts = np.stack([xs.ravel(), ys.ravel()], -1)[:, None, :]
    und = cv2.undistortPoints(pts, K, dist, P=render_K).reshape(h, w, 2)
    return und[..., 0].astype(np.float32), und[..., 1].astype(np.float32)


def _vignette(h: int, w: int, strength: float) -> np.ndarray:
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    r2 = ((xs - (w - 1) / 2) / (w / 2)) ** 2 + ((ys - (h - 1) / 2) / (h / 2)) ** 2
    return (1 - strength * np.clip(r2 / 2, 0, 1))[..., None].astype(np.float32)


def as_K3(K) -> np.ndarray:
    """3x3 K from (fx, fy, cx, cy) or a 3x3 matrix."""
    a = np.asarray(K, np.float64)
    if a.shape == (3, 3):
        return a
    fx, fy, cx, cy = a
    return np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1]], np.float64)


class SensorModel:
    """Apply a SensorLook to uint8 frames; precomputes maps for a given size.

    ``K`` (3x3 or fx, fy, cx, cy) and ``height`` x ``width`` describe the output camera;
    frames passed in are clean pinhole renders with ``render_K`` at ``render_size``
    (width, height), by default the output camera itself.
    """

    def __init__(self, look: SensorLook, K, height: int, width: int, render_K=None,
                 render_size: tuple[int, int] | None = None):
        self.look = look
        self.K = as_K3(K)
        self.render_K = self.K if render_K is None else as_K3(render_K)
        self.render_size = (width, height) if render_size is None else tuple(render_size)
        self.size = (width, height)
        self.dist = distortion_coeffs(look)
        self.map_x, self.map_y = _distortion_maps(self.K, self.dist, height, width, self.render_K)
        self.vignette = _vignette(height, width, look.vignetting)
        self.wb = np.asarray(look.white_balance, np.float32)

    def _check(self, frame: np.ndarray) -> None:
        if (frame.shape[1], frame.shape[0]) != self.render_size:
            raise ValueError(f"SensorModel: expected a {self.render_size[0]}x{self.render_size[1]} render, "
                             f"got {frame.shape[1]}x{frame.shape[0]}")

    def warp(self, frame: np.ndarray) -> np.ndarray:
        """Lens distortion only (bilinear): the geometry the camera records."""
        self._check(frame)
        return cv2.remap(frame, self.map_x, self.map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)

    def warp_labels(self, labels: np.ndarray) -> np.ndarray:
        """Lens distortion of a label image (nearest neighbour, labels stay labels)."""
        self._check(labels)
        out = cv2.remap(labels.astype(np.float32), self.map_x, self.map_y, cv2.INTER_NEAREST,
                        borderMode=cv2.BORDER_REPLICATE)
        return out.astype(labels.dtype)

    def __call__(self, frame: np.ndarray, rng: np.random.Generator, gain: float = 1.0,
                 white_balance: np.ndarray | None = None) -> np.ndarray:
        """``gain``: exposure on top of the look's; ``white_balance``: factors on its per-channel gains
        (an episode's exposure and colour cast, ``comsim.lab.realism``)."""
        lk = self.look
        img = self.warp(frame)
        if lk.blur_sigma_px > 0:
            img = cv2.GaussianBlur(img, (0, 0), lk.blur_sigma_px)
        wb = self.wb if white_balance is None else self.wb * np.asarray(white_balance, np.float32)
        x = img.astype(np.float32) * self.vignette * wb
        if gain != 1.0:
            x = x * np.float32(gain)
        noise_std = np.sqrt(lk.noise_std**2 + lk.shot_noise**2 * np.clip(x, 0, 255))
        x = x + rng.standard_normal(x.shape, dtype=np.float32) * noise_std
        x = 255.0 * (np.clip(x, 0, 255) / 255.0) ** lk.gamma
        out = np.clip(x + 0.5, 0, 255).astype(np.uint8)
        if lk.jpeg_quality < 100:
            ok, buf = cv2.imencode(".jpg", out[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, lk.jpeg_quality])
            out = cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1].copy()
        return out

    def distort_points(self, uv: np.ndarray) -> np.ndarray:
        """Where pinhole pixel coordinates of camera ``K`` (e.g. ``project_points``) land in the image."""
        uv = np.asarray(uv, np.float64).reshape(-1, 2)
        xn = cv2.undistortPoints(uv[:, None, :], self.K, None).reshape(-1, 2)  # K^-1 only
        obj = np.concatenate([xn, np.ones((len(xn), 1))], 1)
        out, _ = cv2.projectPoints(obj, np.zeros(3), np.zeros(3), self.K, self.dist)
        return out.reshape(-1, 2)
