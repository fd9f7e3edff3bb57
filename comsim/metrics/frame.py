"""Paired frame metrics: PSNR, SSIM, LPIPS between predicted and reference uint8 frames.

All take uint8 ``(T, H, W, 3)`` arrays of equal shape and return one value per frame
(float64 ``(T,)``); an episode's score is the mean over its frames.

- PSNR: ``10 log10(255^2 / MSE)`` over all pixels and channels of a frame (what
  ``skimage.metrics.peak_signal_noise_ratio(data_range=255)`` computes); identical frames
  give ``inf``.
- SSIM: Wang et al. (2004) with an 11x11 Gaussian window (sigma 1.5, truncated at 3.5
  sigma), K1 = 0.01, K2 = 0.03, L = 255, population (not sample) statistics, computed per
  RGB channel and averaged over the channels and the window positions that lie fully
  inside the image. This is ``skimage.metrics.structural_similarity(gaussian_weights=True,
  sigma=1.5, use_sample_covariance=False, data_range=255, channel_axis=-1)``.
- LPIPS (Zhang et al. 2018): the ``lpips`` package's network, fed frames mapped to [-1, 1]
  as ``lpips.im2tensor`` does. ``load_lpips`` never downloads unless asked: the package
  ships its linear layers, but the AlexNet/VGG trunk comes from torchvision's checkpoint
  cache (``$TORCH_HOME/hub/checkpoints``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from comsim.metrics.frechet import MetricUnavailable

SSIM_SIGMA = 1.5
SSIM_TRUNCATE = 3.5  # scipy.ndimage.gaussian_filter's default: radius int(3.5 * 1.5 + 0.5) = 5 -> 11x11
SSIM_K1, SSIM_K2 = 0.01, 0.03
DATA_RANGE = 255.0


def check_pair(pred: np.ndarray, ref: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    pred, ref = np.asarray(pred), np.asarray(ref)
    for name, x in (("pred", pred), ("ref", ref)):
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"{where}: {name} frames must be uint8 (T, H, W, 3), got {x.dtype} {x.shape}")
    if pred.shape != ref.shape:
        raise ValueError(f"{where}: pred frames {pred.shape} and ref frames {ref.shape} differ in shape")
    return pred, ref


def psnr(pred: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-frame PSNR in dB (inf where the frames are identical)."""
    pred, ref = check_pair(pred, ref, "psnr")
    mse = ((pred.astype(np.float64) - ref.astype(np.float64)) ** 2).reshape(len(pred), -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        return 10 * np.log10(DATA_RANGE**2 / mse)


def mean_psnr(pairs) -> float:
    """PSNR of a set of clips: per frame, then the mean over every frame of every (pred, ref) pair
    (a clip counts by its frames). The definition behind every PSNR that ComSim reports."""
    return float(np.mean(np.concatenate([psnr(pred, ref) for pred, ref in pairs])))


def gaussian_window(sigma: float = SSIM_SIGMA, truncate: float = SSIM_TRUNCATE) -> np.ndarray:
    """Normalized 1-D Gaussian taps, as scipy.ndimage.gaussian_filter builds them."""
    radius = int(truncate * sigma + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-0.5 * (x / sigma) ** 2)
    return w / w.sum()


def ssim_map(pred: np.ndarray, ref: np.ndarray, batch: int = 16) -> np.ndarray:
    """Per-pixel SSIM (see the module doc) averaged over the RGB channels, float64 (T, H - 10, W - 10): the
    window positions that lie fully inside the image, entry (i, j) centred on pixel (i + 5, j + 5)."""
    pred, ref = check_pair(pred, ref, "ssim")
    g = torch.from_numpy(gaussian_window())
    k = g.numel()
    if min(pred.shape[1:3]) < k:
        raise ValueError(f"ssim: frames must be at least {k}x{k} pixels, got {pred.shape[1]}x{pred.shape[2]}")
    wx, wy = g.view(1, 1, 1, k), g.view(1, 1, k, 1)

    def blur(x):  # separable Gaussian, 'valid' positions only: (N, 1, H, W) -> (N, 1, H-k+1, W-k+1)
        return F.conv2d(F.conv2d(x, wx), wy)

    c1, c2 = (SSIM_K1 * DATA_RANGE) ** 2, (SSIM_K2 * DATA_RANGE) ** 2
    out = []
    for i in range(0, len(pred), batch):
        # channels become separate images: (B, H, W, 3) -> (B * 3, 1, H, W)
        x = torch.from_numpy(pred[i:i + batch]).double().permute(0, 3, 1, 2).reshape(-1, 1, *pred.shape[1:3])
        y = torch.from_numpy(ref[i:i + batch]).double().permute(0, 3, 1, 2).reshape(-1, 1, *pred.shape[1:3])
        mx, my = blur(x), blur(y)
        vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        out.append(s.reshape(-1, 3, *s.shape[-2:]).mean(dim=1))
    return torch.cat(out).numpy()


def ssim(pred: np.ndarray, ref: np.ndarray, batch: int = 16) -> np.ndarray:
    """Per-frame SSIM (see the module doc), computed in float64: the mean of ``ssim_map``."""
    return ssim_map(pred, ref, batch).mean(axis=(1, 2))


# ----------------------------------------------------------------------------- LPIPS


def _trunk_checkpoint(net: str) -> tuple[Path, str]:
    """Where torchvision caches the trunk that lpips.LPIPS(net=...) loads, and its URL."""
    from torchvision import models

    weights = {"alex": models.AlexNet_Weights.IMAGENET1K_V1, "vgg": models.VGG16_Weights.IMAGENET1K_V1,
               "squeeze": models.SqueezeNet1_1_Weights.IMAGENET1K_V1}
    if net not in weights:
        raise ValueError(f"LPIPS: net must be one of {sorted(weights)}, got {net!r}")
    url = weights[net].url
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name, url


def load_lpips(net: str = "alex", allow_download: bool = False, device: str | torch.device = "cpu"):
    """The lpips package's LPIPS model (v0.1, ``lpips.LPIPS(net=net)``) in eval mode.

    Its linear layers ship with the package. The ImageNet trunk is torchvision's checkpoint
    in ``$TORCH_HOME/hub/checkpoints``, read here with ``torch.load(weights_only=True)``
    (torchvision's own loader unpickles it). A missing trunk raises ``MetricUnavailable``
    naming the file to place, unless ``allow_download``."""
    try:
        import lpips
    except ImportError as e:
        raise MetricUnavailable("LPIPS: the lpips package is not installed (`pip install lpips`)") from e
    path, url = _trunk_checkpoint(net)
    if not path.is_file():
        if not allow_download:
            raise MetricUnavailable(f"LPIPS: {path}: file not found (the {net} trunk LPIPS needs; place {url} "
                                    "there, or allow the download)")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(url, str(path), progress=True)
    model = lpips.LPIPS(net=net, pnet_rand=True, verbose=False)  # trunk built empty, linear layers loaded
    trunk = torch.load(path, map_location="cpu", weights_only=True)
    # lpips splits torchvision's `features` into slices that keep the layer indices as names.
    where = {int(i): f"{slice_name}.{i}" for slice_name, sl in model.net.named_children() for i in sl._modules}
    state = {}
    for key, value in trunk.items():
        part, idx, param = key.split(".", 2) if key.count(".") >= 2 else (key, "", "")
        if part == "features" and idx.isdigit() and int(idx) in where:
            state[f"{where[int(idx)]}.{param}"] = value
    missing, _ = model.net.load_state_dict(state, strict=False)
    if missing or not state:
        raise ValueError(f"{path}: not a torchvision {net} checkpoint (LPIPS trunk parameters missing: "
                         f"{missing[:4] or 'all'})")
    return model.eval().to(device)


@torch.inference_mode()
def lpips_distance(pred: np.ndarray, ref: np.ndarray, model, batch: int = 16) -> np.ndarray:
    """Per-frame LPIPS distance with an ``lpips.LPIPS`` model (frames mapped to [-1, 1])."""
    pred, ref = check_pair(pred, ref, "lpips")
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(pred), batch):
        x, y = (torch.from_numpy(a[i:i + batch]).to(device).permute(0, 3, 1, 2).float() / (DATA_RANGE / 2) - 1
                for a in (pred, ref))
        out.append(model(x, y).reshape(-1).double().cpu())
    return torch.cat(out).numpy()
