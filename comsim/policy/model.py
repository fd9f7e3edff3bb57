"""Image-based Diffusion Policy (Chi et al. 2023), laid out like LeRobot's.

    obs images (B, n_obs, 3, H, W) uint8 ─► ResNet-18 (GroupNorm) ─► spatial softmax keypoints ─┐
    obs state  (B, n_obs, S)  ─► min-max to [-1, 1] ───────────────────────────────────────────┴► global cond
    noisy action chunk (B, horizon, A) + timestep + global cond ─► conditional 1D U-Net (FiLM) ─► noise

Training: DDPM noise prediction (``compute_loss``). Inference: DDIM (``sample_actions``),
deterministic for a given ``torch.Generator``. Closed loop (``select_action``): keep the
last ``n_obs_steps`` observations, predict ``horizon`` actions, execute ``n_action_steps``
of them (starting at the current step), then re-plan.

Normalisation, the closed loop and saving are ``comsim.policy.base.Policy``'s. Images: uint8 ->
[-1, 1] after a resize to ``image_size`` (``comsim.episode.resize_frames``, as the data).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from diffusers import DDIMScheduler, DDPMScheduler
from safetensors.torch import load_file
from torchvision.models.resnet import BasicBlock

from comsim.config import ConfigError, from_dict
from comsim.policy.base import Policy

@dataclass
class DiffusionConfig:
    # -- inputs / outputs
    state_dim: int = 8
    action_dim: int = 8
    n_obs_steps: int = 2  # observations the policy sees (current + previous)
    horizon: int = 16  # actions predicted per denoising
    n_action_steps: int = 8  # actions executed before re-planning
    image_size: tuple[int, int] = (96, 96)  # (H, W): frames are resized (area) to this first
    crop_shape: tuple[int, int] | None = (84, 84)  # random crop in training, centre crop at inference
    # -- vision: ResNet-18 topology, GroupNorm instead of BatchNorm, spatial softmax keypoints
    backbone_width: int = 64  # 64 = torchvision's ResNet-18; smaller = same topology, thinner
    pretrained_backbone: str | None = None  # local torchvision resnet18 state dict (.pth/.safetensors); never downloaded
    backbone_stages: int = 4  # residual stages kept (4 = all, stride 32; 3 = stride 16 for small images)
    use_group_norm: bool = True
    spatial_softmax_num_keypoints: int = 32
    # -- conditional 1D U-Net
    down_dims: tuple[int, ...] = (512, 1024, 2048)
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    use_film_scale_modulation: bool = True
    # -- noise: DDPM in training, DDIM at inference (diffusers schedulers)
    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: str = "epsilon"  # epsilon | sample
    clip_sample: bool = True
    clip_sample_range: float = 1.0
    num_inference_steps: int = 10
    do_mask_loss_for_padding: bool = False

    def __post_init__(self):
        self.image_size = tuple(self.image_size)
        self.crop_shape = tuple(self.crop_shape) if self.crop_shape is not None else None
        self.down_dims = tuple(self.down_dims)
        if self.n_obs_steps < 1 or self.horizon < 1 or self.n_action_steps < 1:
            raise ConfigError("policy: n_obs_steps, horizon and n_action_steps must be >= 1")
        if self.n_action_steps > self.horizon - self.n_obs_steps + 1:
            raise ConfigError(f"policy.n_action_steps: {self.n_action_steps} > horizon - n_obs_steps + 1 = "
                              f"{self.horizon - self.n_obs_steps + 1} (the actions after the current step)")
        factor = 2 ** (len(self.down_dims) - 1)
        if self.horizon % factor:
            raise ConfigError(f"policy.horizon: {self.horizon} must be divisible by 2^(len(down_dims)-1) = {factor}")
        if self.crop_shape is not None and any(c > s for c, s in zip(self.crop_shape, self.image_size)):
            raise ConfigError(f"policy.crop_shape {self.crop_shape} is larger than image_size {self.image_size}")
        if self.backbone_width < 16 or self.backbone_width % 16:
            raise ConfigError(f"policy.backbone_width: expected a multiple of 16 (GroupNorm groups of 16 "
                              f"channels), got {self.backbone_width}")
        if not 1 <= self.backbone_stages <= 4:
            raise ConfigError(f"policy.backbone_stages: expected 1..4, got {self.backbone_stages}")
        if any(d % self.n_groups for d in self.down_dims):
            raise ConfigError(f"policy.down_dims {self.down_dims} must be divisible by n_groups {self.n_groups}")
        if self.prediction_type not in ("epsilon", "sample"):
            raise ConfigError(f"policy.prediction_type: expected epsilon|sample, got {self.prediction_type!r}")
        if not 1 <= self.num_inference_steps <= self.num_train_timesteps:
            raise ConfigError(f"policy.num_inference_steps: expected 1..{self.num_train_timesteps}, "
                              f"got {self.num_inference_steps}")

    @property
    def input_shape(self) -> tuple[int, int]:
        return self.crop_shape or self.image_size

    def describe(self, num_inference_steps: int | None = None) -> str:
        return (f"Diffusion Policy (ResNet-18 width {self.backbone_width}, {self.image_size[0]}x{self.image_size[1]} "
                f"images, U-Net {list(self.down_dims)}, DDIM {num_inference_steps or self.num_inference_steps} steps)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Smaller variants for CPUs. Any field can still be overridden on top of a preset.
PRESETS: dict[str, dict] = {
    "default": {},  # LeRobot's sizes: ResNet-18 at 84x84 crops, U-Net (512, 1024, 2048)
    "small": {"image_size": (96, 96), "crop_shape": (84, 84), "backbone_width": 32, "backbone_stages": 3,
              "spatial_softmax_num_keypoints": 32, "down_dims": (128, 256, 512), "diffusion_step_embed_dim": 64},
    "tiny": {"image_size": (64, 64), "crop_shape": (56, 56), "backbone_width": 16, "backbone_stages": 3,
             "spatial_softmax_num_keypoints": 16, "down_dims": (32, 64, 128), "diffusion_step_embed_dim": 32},
}


def diffusion_config(data: dict | None = None, where: str = "policy") -> DiffusionConfig:
    """A DiffusionConfig from a YAML mapping; ``preset: tiny|small|default`` fills the rest."""
    data = dict(data or {})
    data.pop("type", None)
    preset = data.pop("preset", "default")
    if preset not in PRESETS:
        raise ConfigError(f"{where}.preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    return from_dict(DiffusionConfig, {**PRESETS[preset], **data}, where)



# ----------------------------------------------------------------------------- vision


def resnet18_gn(width: int = 64, group_norm: bool = True, stages: int = 4) -> nn.Module:
    """torchvision's ResNet-18 (weights=None) with GroupNorm (groups of 16 channels), optionally
    thinner (``width`` channels in the first stage; 64 = the standard network) or cut after
    ``stages`` residual stages (4 = all: stride 32; 3: stride 16, a finer map for small images)."""
    norm = (lambda c: nn.GroupNorm(c // 16, c)) if group_norm else nn.BatchNorm2d
    net = torchvision.models.resnet18(weights=None, norm_layer=norm)
    if width != 64:  # same topology, thinner: rebuild the stem and stages with torchvision's own builder
        net.inplanes = width
        net.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        net.bn1 = norm(width)
        net.layer1 = net._make_layer(BasicBlock, width, 2)
        net.layer2 = net._make_layer(BasicBlock, width * 2, 2, stride=2)
        net.layer3 = net._make_layer(BasicBlock, width * 4, 2, stride=2)
        net.layer4 = net._make_layer(BasicBlock, width * 8, 2, stride=2)
    return nn.Sequential(*list(net.children())[:4 + stages])  # stem + stages; no avgpool/fc: a feature map


class SpatialSoftmax(nn.Module):
    """Feature map (B, C, H, W) -> expected image coordinates of ``num_kp`` learned keypoints (B, 2K)."""

    def __init__(self, channels: int, height: int, width: int, num_kp: int):
        super().__init__()
        self.keypoints = nn.Conv2d(channels, num_kp, kernel_size=1)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.register_buffer("pos_grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1), persistent=False)

    def forward(self, x: torch.Tensor, gain: torch.Tensor | float = 1.0, standardise: bool = False) -> torch.Tensor:
        logits = self.keypoints(x).flatten(2)  # (B, K, H*W)
        if standardise:  # each map in units of its own spread over the pixels
            logits = (logits - logits.mean(-1, keepdim=True)) / (logits.std(-1, keepdim=True) + 1e-5)
        attn = F.softmax(gain * logits, dim=-1)
        return (attn @ self.pos_grid).flatten(1)  # (B, K*2)


class RgbEncoder(nn.Module):
    """Crop -> ResNet-18 (GroupNorm) -> spatial softmax -> linear + ReLU."""

    def __init__(self, cfg: DiffusionConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = resnet18_gn(cfg.backbone_width, cfg.use_group_norm, cfg.backbone_stages)
        if cfg.pretrained_backbone:
            _load_backbone(self.backbone, cfg.pretrained_backbone, cfg.backbone_width)
        with torch.no_grad():
            fmap = self.backbone(torch.zeros(1, 3, *cfg.input_shape))
        self.pool = SpatialSoftmax(fmap.shape[1], fmap.shape[2], fmap.shape[3], cfg.spatial_softmax_num_keypoints)
        self.feature_dim = cfg.spatial_softmax_num_keypoints * 2
        self.out = nn.Linear(self.feature_dim, self.feature_dim)

    def crop(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.cfg.crop_shape is None:
            return x
        ch, cw = self.cfg.crop_shape
        H, W = x.shape[-2:]
        if self.training:  # one random crop per image (LeRobot: torchvision RandomCrop per batch element)
            n = x.shape[0]
            top = torch.randint(0, H - ch + 1, (n,), generator=generator, device="cpu").tolist()
            left = torch.randint(0, W - cw + 1, (n,), generator=generator, device="cpu").tolist()
            return torch.stack([x[i, :, t:t + ch, l:l + cw] for i, (t, l) in enumerate(zip(top, left))])
        t, l = (H - ch) // 2, (W - cw) // 2
        return x[..., t:t + ch, l:l + cw]

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        x = self.crop(x, generator)
        return F.relu(self.out(self.pool(self.backbone(x))))


def _load_backbone(backbone: nn.Module, path: str, width: int) -> None:
    if width != 64:
        raise ValueError(f"policy.pretrained_backbone needs backbone_width 64 (torchvision's ResNet-18), got {width}")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"policy.pretrained_backbone: {p} not found (weights are never downloaded)")
    sd = load_file(str(p)) if p.suffix == ".safetensors" else torch.load(p, map_location="cpu", weights_only=True)
    # torchvision keys (conv1, bn1, layer1...) -> Sequential indices; BatchNorm stats are dropped (GroupNorm here).
    names = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]
    mapped = {}
    for k, v in sd.items():
        head = k.split(".")[0]
        if head in names and "running_" not in k and "num_batches" not in k:
            mapped[f"{names.index(head)}.{k.split('.', 1)[1]}"] = v
    backbone.load_state_dict(mapped, strict=False)


# ----------------------------------------------------------------------------- U-Net


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        emb = t.float()[:, None] * freqs[None]
        return torch.cat([emb.sin(), emb.cos()], dim=-1)


class Conv1dBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, groups: int):
        super().__init__(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), nn.GroupNorm(groups, cout), nn.Mish())


class ResidualBlock1d(nn.Module):
    """Two conv blocks; the condition modulates the first one's output with FiLM (scale and bias)."""

    def __init__(self, cin: int, cout: int, cond_dim: int, kernel: int, groups: int, film_scale: bool):
        super().__init__()
        self.cout, self.film_scale = cout, film_scale
        self.conv1 = Conv1dBlock(cin, cout, kernel, groups)
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, cout * 2 if film_scale else cout))
        self.conv2 = Conv1dBlock(cout, cout, kernel, groups)
        self.residual = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x)
        c = self.cond_encoder(cond).unsqueeze(-1)
        h = h * c[:, :self.cout] + c[:, self.cout:] if self.film_scale else h + c
        return self.conv2(h) + self.residual(x)


class ConditionalUnet1d(nn.Module):
    """1D U-Net over the action horizon, FiLM-conditioned on (timestep embedding, global cond)."""

    def __init__(self, cfg: DiffusionConfig, global_cond_dim: int):
        super().__init__()
        d = cfg.diffusion_step_embed_dim
        self.step_encoder = nn.Sequential(SinusoidalPosEmb(d), nn.Linear(d, d * 4), nn.Mish(), nn.Linear(d * 4, d))
        cond = d + global_cond_dim
        kw = dict(cond_dim=cond, kernel=cfg.kernel_size, groups=cfg.n_groups, film_scale=cfg.use_film_scale_modulation)
        dims = [cfg.action_dim, *cfg.down_dims]
        pairs = list(zip(dims[:-1], dims[1:]))
        self.down = nn.ModuleList()
        for i, (cin, cout) in enumerate(pairs):
            last = i == len(pairs) - 1
            self.down.append(nn.ModuleList([ResidualBlock1d(cin, cout, **kw), ResidualBlock1d(cout, cout, **kw),
                                            nn.Conv1d(cout, cout, 3, 2, 1) if not last else nn.Identity()]))
        mid = cfg.down_dims[-1]
        self.mid = nn.ModuleList([ResidualBlock1d(mid, mid, **kw), ResidualBlock1d(mid, mid, **kw)])
        self.up = nn.ModuleList()
        for cin, cout in reversed(pairs[1:]):  # as many upsamplings as downsamplings (LeRobot's layout)
            self.up.append(nn.ModuleList([ResidualBlock1d(cout * 2, cin, **kw), ResidualBlock1d(cin, cin, **kw),
                                          nn.ConvTranspose1d(cin, cin, 4, 2, 1)]))
        self.final = nn.Sequential(Conv1dBlock(cfg.down_dims[0], cfg.down_dims[0], cfg.kernel_size, cfg.n_groups),
                                   nn.Conv1d(cfg.down_dims[0], cfg.action_dim, 1))

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        """x (B, T, A) -> (B, T, A)."""
        x = x.transpose(1, 2)
        cond = torch.cat([self.step_encoder(timestep), global_cond], dim=-1)
        skips = []
        for res1, res2, down in self.down:
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = down(x)
        for res in self.mid:
            x = res(x, cond)
        for res1, res2, up in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = up(res2(res1(x, cond), cond))
        return self.final(x).transpose(1, 2)


# ----------------------------------------------------------------------------- policy


class DiffusionPolicy(Policy):
    """ResNet-18 keypoints + state -> a conditional 1D U-Net denoising a chunk of actions (DDPM, DDIM)."""
    type = "diffusion"
    config_class = DiffusionConfig

    def __init__(self, cfg: DiffusionConfig, stats: dict[str, dict[str, np.ndarray]] | None = None):
        """``stats``: {"action": {"min", "max"}, "observation.state": {"min", "max"}} of the training data."""
        super().__init__(cfg)
        self.rgb_encoder = RgbEncoder(cfg)
        global_cond_dim = (self.rgb_encoder.feature_dim + cfg.state_dim) * cfg.n_obs_steps
        self.unet = ConditionalUnet1d(cfg, global_cond_dim)
        self.register_stats(cfg.action_dim, cfg.state_dim, stats)
        sched = dict(num_train_timesteps=cfg.num_train_timesteps, beta_start=cfg.beta_start, beta_end=cfg.beta_end,
                     beta_schedule=cfg.beta_schedule, clip_sample=cfg.clip_sample,
                     clip_sample_range=cfg.clip_sample_range, prediction_type=cfg.prediction_type)
        self.noise_scheduler = DDPMScheduler(**sched)
        self.sampler = DDIMScheduler(**sched)
        self.reset()

    # -- normalisation
    # -- conditioning
    def global_cond(self, images: torch.Tensor, state: torch.Tensor, generator=None) -> torch.Tensor:
        """images uint8 (B, n_obs, 3, H, W) at image_size; state raw (B, n_obs, S) -> (B, D)."""
        B, n = images.shape[:2]
        x = images.flatten(0, 1).float() / 127.5 - 1.0
        feats = self.rgb_encoder(x, generator).reshape(B, n, -1)
        return torch.cat([self.normalize(state, "state"), feats], dim=-1).flatten(1)

    # -- training
    def compute_loss(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """batch: images (B, n_obs, 3, H, W) uint8, state (B, n_obs, S), action (B, horizon, A),
        optional action_is_pad (B, horizon). DDPM epsilon (or sample) regression."""
        cfg = self.config
        dev = self.action_min.device
        images, state, action = batch["images"].to(dev), batch["state"].to(dev), batch["action"].to(dev)
        if action.shape[1:] != (cfg.horizon, cfg.action_dim):
            raise ValueError(f"batch['action'] must be (B, {cfg.horizon}, {cfg.action_dim}), got {tuple(action.shape)}")
        cond = self.global_cond(images, state, generator)
        x0 = self.normalize(action, "action")
        noise = torch.randn(x0.shape, generator=generator, device="cpu").to(dev)
        t = torch.randint(0, cfg.num_train_timesteps, (x0.shape[0],), generator=generator, device="cpu").to(dev)
        pred = self.unet(self.noise_scheduler.add_noise(x0, noise, t), t, cond)
        target = noise if cfg.prediction_type == "epsilon" else x0
        loss = F.mse_loss(pred, target, reduction="none")
        if cfg.do_mask_loss_for_padding and "action_is_pad" in batch:
            keep = ~batch["action_is_pad"].to(dev)
            loss = loss * keep.unsqueeze(-1)
            return loss.sum() / (keep.sum() * cfg.action_dim).clamp_min(1)
        return loss.mean()

    # -- inference
    @torch.no_grad()
    def sample_actions(self, images: torch.Tensor, state: torch.Tensor,
                       generator: torch.Generator | None = None, num_inference_steps: int | None = None) -> torch.Tensor:
        """DDIM: (B, horizon, A) unnormalised actions. Same generator state -> same actions."""
        cfg = self.config
        dev = self.action_min.device
        cond = self.global_cond(images.to(dev), state.to(dev))
        x = torch.randn((images.shape[0], cfg.horizon, cfg.action_dim), generator=generator, device="cpu").to(dev)
        self.sampler.set_timesteps(num_inference_steps or cfg.num_inference_steps)
        for t in self.sampler.timesteps:
            ts = torch.full((x.shape[0],), int(t), dtype=torch.long, device=dev)
            x = self.sampler.step(self.unet(x, ts, cond), t, x).prev_sample
        return self.unnormalize(x, "action")

    @classmethod
    def config_for_loading(cls, data: dict) -> dict:
        return {**data, "pretrained_backbone": None}  # the saved weights hold the backbone
