"""Codecs: pixels <-> the latent space the translator works in.

- ``PixelCodec``: identity on videos in [-1, 1] (the tiny config trains in pixel space).
- ``DiffusersVAECodec``: a diffusers VAE, from a hub id or a local folder. An image VAE
  (``AutoencoderKL``) is applied frame by frame; a video VAE (``AutoencoderKLWan`` and
  friends) encodes whole clips and needs ``1 + k * temporal_factor`` frames. Latents are
  normalized with the VAE's ``latents_mean``/``latents_std`` when it has them, else with
  ``(z - shift_factor) * scaling_factor``.

Nothing is downloaded at import: a hub id is fetched only when a codec is built from it.
Videos are float ``(B, 3, T, H, W)`` in [-1, 1]; latents ``(B, C, t, h, w)``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from comsim.errors import ComSimError
from comsim.io.files import read_json_object
from comsim.io.paths import is_inside

VIDEO_VAE_CLASSES = ("AutoencoderKLWan", "AutoencoderKLCogVideoX", "AutoencoderKLLTXVideo", "AutoencoderKLCosmos",
                     "AutoencoderKLHunyuanVideo", "AutoencoderKLMochi")


class CodecError(ComSimError, ValueError):
    """A codec config or a saved codec folder is not usable."""


class PixelCodec:
    latent_channels = 3
    spatial_factor = 1
    temporal_factor = 1
    causal_first_frame = False

    def config(self) -> dict:
        return {"type": "pixel"}

    def check_frames(self, num_frames: int, where: str = "num_frames") -> None:
        if num_frames < 1:
            raise ValueError(f"{where} must be >= 1, got {num_frames}")

    def latent_size(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        self.check_frames(num_frames)
        return num_frames, height, width

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return video

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.clamp(-1, 1)

    def to(self, device=None, dtype=None):
        return self

    def save_pretrained(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "codec.json").write_text(json.dumps(self.config(), indent=2))


class DiffusersVAECodec:
    """A diffusers VAE as a codec.

    Args:
        pretrained: hub id (e.g. ``"stabilityai/sd-vae-ft-ema"``) or local folder.
        subfolder: e.g. ``"vae"`` inside a full pipeline repo.
        vae_class: the diffusers class name (``AutoencoderKL``, ``AutoencoderKLWan``, ...).
        sample_posterior: encode with a posterior sample (False: its mode, deterministic).
        frames_per_batch: image VAEs encode/decode this many frames at a time.
    """

    def __init__(self, pretrained: str, subfolder: str | None = None, vae_class: str = "AutoencoderKL",
                 sample_posterior: bool = False, frames_per_batch: int = 32, vae=None):
        import diffusers

        self.pretrained, self.subfolder, self.vae_class = pretrained, subfolder, vae_class
        self.sample_posterior, self.frames_per_batch = sample_posterior, frames_per_batch
        if vae is None:
            cls = getattr(diffusers, vae_class, None)
            if cls is None:
                raise ValueError(f"codec.vae_class={vae_class!r} is not a diffusers class")
            try:
                vae = cls.from_pretrained(pretrained, subfolder=subfolder)
            except (OSError, ValueError) as e:  # no such folder, no network for a hub id, a broken config
                first = (str(e).strip().splitlines() or [""])[0][:300]
                raise CodecError(f"codec.pretrained={pretrained!r}: the {vae_class} does not load ({first}); expected "
                                 "a diffusers VAE folder, or a hub id with the hub reachable") from None
        self.vae = vae.eval().requires_grad_(False)
        cfg = self.vae.config
        self.is_video = vae_class in VIDEO_VAE_CLASSES
        self.latent_channels = int(cfg.get("latent_channels", cfg.get("z_dim", 4)))
        if self.is_video:
            self.spatial_factor = int(getattr(self.vae, "spatial_compression_ratio", None)
                                      or cfg.get("scale_factor_spatial", 8))
            self.temporal_factor = int(getattr(self.vae, "temporal_compression_ratio", None)
                                       or cfg.get("scale_factor_temporal", 4))
        else:
            self.spatial_factor = 2 ** (len(cfg.block_out_channels) - 1)
            self.temporal_factor = 1
        self.causal_first_frame = self.is_video
        mean, std = cfg.get("latents_mean"), cfg.get("latents_std")
        if mean is not None and std is not None:
            self._mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1, 1)
            self._scale = 1.0 / torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1, 1)
        else:
            self._mean = torch.tensor(float(cfg.get("shift_factor") or 0.0)).view(1, 1, 1, 1, 1)
            self._scale = torch.tensor(float(cfg.get("scaling_factor") or 1.0)).view(1, 1, 1, 1, 1)

    def config(self) -> dict:
        return {"type": "diffusers_vae", "pretrained": self.pretrained, "subfolder": self.subfolder,
                "vae_class": self.vae_class, "sample_posterior": self.sample_posterior,
                "frames_per_batch": self.frames_per_batch}

    def to(self, device=None, dtype=None):
        self.vae.to(device=device, dtype=dtype)
        return self

    def check_frames(self, num_frames: int, where: str = "num_frames") -> None:
        r = self.temporal_factor
        if self.is_video and (num_frames - 1) % r:
            raise ValueError(f"{where}={num_frames}: the video VAE {self.vae_class} needs 1 + {r}*k frames "
                             f"(e.g. {1 + r * max(1, (num_frames - 1) // r)})")

    def latent_size(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        self.check_frames(num_frames)
        s = self.spatial_factor
        if height % s or width % s:
            raise ValueError(f"resolution {height}x{width} must be divisible by the VAE's spatial factor {s}")
        t = 1 + (num_frames - 1) // self.temporal_factor if self.is_video else num_frames
        return t, height // s, width // s

    def _normalize(self, z):
        return (z - self._mean.to(z)) * self._scale.to(z)

    def _denormalize(self, z):
        return z / self._scale.to(z) + self._mean.to(z)

    @torch.no_grad()
    def encode(self, video: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        B, _, T, H, W = video.shape
        self.check_frames(T, "video frames")
        p = next(self.vae.parameters())
        video = video.to(device=p.device, dtype=p.dtype)

        def enc(x):
            dist = self.vae.encode(x).latent_dist
            return dist.sample(generator) if self.sample_posterior else dist.mode()

        if self.is_video:
            z = torch.cat([enc(video[i:i + 1]) for i in range(B)])
        else:
            frames = video.permute(0, 2, 1, 3, 4).reshape(B * T, 3, H, W)
            z = torch.cat([enc(c) for c in frames.split(self.frames_per_batch)])
            z = z.view(B, T, *z.shape[1:]).permute(0, 2, 1, 3, 4)
        return self._normalize(z.float())

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        p = next(self.vae.parameters())
        z = self._denormalize(latents.float()).to(device=p.device, dtype=p.dtype)
        B, C, T, h, w = z.shape
        if self.is_video:
            x = torch.cat([self.vae.decode(z[i:i + 1]).sample for i in range(B)])
        else:
            frames = z.permute(0, 2, 1, 3, 4).reshape(B * T, C, h, w)
            x = torch.cat([self.vae.decode(c).sample for c in frames.split(self.frames_per_batch)])
            x = x.view(B, T, *x.shape[1:]).permute(0, 2, 1, 3, 4)
        return x.float().clamp(-1, 1)

    def save_pretrained(self, directory: str | Path) -> None:
        """Save the VAE weights next to ``codec.json`` so the folder loads offline."""
        directory = Path(directory)
        self.vae.save_pretrained(directory / "vae")
        cfg = dict(self.config(), pretrained="vae", subfolder=None, source=self.pretrained)
        (directory / "codec.json").write_text(json.dumps(cfg, indent=2))


def build_codec(cfg: dict, base_dir: str | Path | None = None):
    """Codec from its config dict; a relative ``pretrained`` is resolved against ``base_dir``."""
    cfg = dict(cfg)
    kind = cfg.pop("type", "pixel")
    cfg.pop("source", None)
    if kind == "pixel":
        return PixelCodec()
    if kind == "diffusers_vae":
        if not cfg.get("pretrained"):
            raise ValueError("codec.pretrained must name a hub id or a folder for type 'diffusers_vae'")
        if base_dir is not None and (Path(base_dir) / cfg["pretrained"]).exists():
            cfg["pretrained"] = str(Path(base_dir) / cfg["pretrained"])
        return DiffusersVAECodec(**cfg)
    raise ValueError(f"codec.type={kind!r}: expected 'pixel' or 'diffusers_vae'")


def load_codec(directory: str | Path, allow_download: bool | None = None):
    """The codec of a saved pipeline folder. Its codec.json must name a VAE inside the folder
    (``save_pretrained`` copies it in): a hub id there would be fetched, and run, on someone else's
    say-so. ``allow_download`` (default: the environment variable COMSIM_ALLOW_DOWNLOAD=1) lifts that."""
    directory = Path(directory)
    path = directory / "codec.json"
    if not path.is_file():
        raise CodecError(f"{path}: file not found (a translator folder has one; see save_pretrained)")
    cfg = read_json_object(path, CodecError)
    if allow_download is None:
        allow_download = os.environ.get("COMSIM_ALLOW_DOWNLOAD", "") == "1"
    pretrained = cfg.get("pretrained")
    if cfg.get("type") == "diffusers_vae" and isinstance(pretrained, str) and not allow_download:
        local = Path(pretrained) if Path(pretrained).is_absolute() else directory / pretrained
        if ".." in Path(pretrained).parts or not is_inside(local, directory) or not local.is_dir():
            raise CodecError(f"{path}: pretrained: expected a VAE folder inside {directory}, got {pretrained!r} "
                             "(a hub id or outside path is only fetched with --allow-download / COMSIM_ALLOW_DOWNLOAD=1)")
    try:
        return build_codec(cfg, base_dir=directory)
    except (TypeError, ValueError) as e:
        if isinstance(e, CodecError):
            raise
        raise CodecError(f"{path}: {e}") from e
