"""A CPU policy: keypoints of a fixed crop of the frame -> MLP -> action chunk, trained with L1.

    obs image (B, n_obs, 3, H, W) uint8 ─► crop ─┬► conv stack (GroupNorm) ─► spatial softmax ─┐
                                                 └► 1x1 colour convs ─► standardise ─► softmax ─┤
    obs state (B, n_obs, S) ─► min-max to [-1, 1] ─────────────────────────────────────────────┴► MLP ─► (B, horizon, A)

The Diffusion Policy (``model.py``) is the GPU default; on two CPU cores it does not learn
the push task in minutes. This policy is the deterministic half of ACT (Zhao et al. 2023)
on the vision stack of Levine et al. (2016): a regression of a whole action chunk with an
L1 loss, and at run time a new chunk every ``n_action_steps`` frames whose overlapping
predictions are averaged (temporal ensembling, weights ``exp(-m * age_rank)``, oldest
first, as ACT does). One forward pass per chunk instead of ten denoising passes, and no
noise to learn.

Vision. A fixed camera sees the table in a fixed place, so the policy looks at a fixed
``crop`` of it at full resolution (the lab's 5-px cube stays 5 px) and positions are
absolute: no random shift by default. Two keypoint sets join: the conv stack's (where the
arm and the scene's parts are) and a per-pixel colour branch's, 1x1 convolutions whose
maps are standardised over the pixels before a spatial softmax with a learned gain, so that
a few pixels of one colour (the cube) take a keypoint whatever the convs' scale. Measured on
the lab push task (validation seeds): neither set alone learns in a few thousand steps;
together they do, and the standardised colour maps are what puts a keypoint on the cube.

Normalisation, the closed loop (with ``temporal_ensemble_coeff``) and saving are
``comsim.policy.base.Policy``'s, as for the Diffusion Policy: the rollout and the experiment
run either policy.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from comsim.config import ConfigError
from comsim.policy.base import Policy
from comsim.policy.model import SpatialSoftmax


@dataclass
class KeypointConfig:
    # -- inputs / outputs
    state_dim: int = 8
    action_dim: int = 8
    n_obs_steps: int = 1  # observations the policy sees (1: the current frame)
    horizon: int = 16  # actions predicted per chunk, starting at the oldest observation
    n_action_steps: int = 1  # frames between chunks (1: a new chunk every frame, ensembled)
    temporal_ensemble_coeff: float | None = 0.01  # ACT's m; null: execute n_action_steps of each chunk as is
    image_size: tuple[int, int] = (128, 128)  # (H, W): the lab camera's and the translator's resolution
    # (top, left, height, width) of the part of the frame the policy looks at, in image_size
    # pixels: the table and what stands on it. A fixed camera sees the workspace in a fixed
    # place, so cropping to it keeps the cube at full resolution and cuts the conv cost.
    crop: tuple[int, int, int, int] | None = None
    shift: int = 0  # px of random shift in training (0: none; positions are absolute for a fixed camera)
    # -- vision: conv stack, GroupNorm, spatial softmax
    channels: tuple[int, ...] = (16, 32, 32, 64)
    strides: tuple[int, ...] = (2, 2, 1, 1)  # the first conv is 5x5, the others 3x3
    num_keypoints: int = 32  # from the conv stack (0: no conv stack)
    # keypoints of a per-pixel colour branch at the input's full resolution (1x1 convs, then a
    # spatial softmax with a learned gain): it can only say where a colour is, not memorise
    # a scene, and it sees a 5-px cube whole (0: no colour branch)
    pixel_keypoints: int = 0
    pixel_hidden: int = 16
    # the colour maps' softmax temperature: each map is standardised over its pixels, then
    # multiplied by a learned gain starting here. A few cube pixels among thousands win only if
    # they stand out by several spreads of the map; standardising makes that independent of the
    # convs' scale, so the keypoint is sharp from the first step (raw maps stay diffuse on the lab
    # push task: peak attention ~0.001 after 3000 steps).
    pixel_gain: float = 3.0
    # -- head
    use_state: bool = True  # the measured joint positions join the keypoints
    hidden_dim: int = 256
    mlp_layers: int = 2
    dropout: float = 0.0

    def __post_init__(self):
        self.image_size = tuple(self.image_size)
        self.channels, self.strides = tuple(self.channels), tuple(self.strides)
        if self.crop is not None:
            self.crop = tuple(int(v) for v in self.crop)
            t, l, h, w = self.crop if len(self.crop) == 4 else (-1,) * 4
            if len(self.crop) != 4 or t < 0 or l < 0 or h < 8 or w < 8 or t + h > self.image_size[0] \
                    or l + w > self.image_size[1]:
                raise ConfigError(f"policy.crop: expected [top, left, height, width] inside image_size "
                                  f"{list(self.image_size)} (height, width >= 8), got {list(self.crop)}")
        if self.n_obs_steps < 1 or self.horizon < 1 or self.n_action_steps < 1:
            raise ConfigError("policy: n_obs_steps, horizon and n_action_steps must be >= 1")
        if self.n_action_steps > self.horizon - self.n_obs_steps + 1:
            raise ConfigError(f"policy.n_action_steps: {self.n_action_steps} > horizon - n_obs_steps + 1 = "
                              f"{self.horizon - self.n_obs_steps + 1} (the actions after the current step)")
        if len(self.channels) != len(self.strides) or (self.num_keypoints and not self.channels):
            raise ConfigError(f"policy.channels {self.channels} and policy.strides {self.strides}: "
                              "expected two lists of the same non-zero length")
        if self.num_keypoints < 0 or self.pixel_keypoints < 0 or self.num_keypoints + self.pixel_keypoints == 0:
            raise ConfigError(f"policy.num_keypoints ({self.num_keypoints}) and policy.pixel_keypoints "
                              f"({self.pixel_keypoints}): expected >= 0 and at least one keypoint")
        if any(c % 8 for c in self.channels):
            raise ConfigError(f"policy.channels: expected multiples of 8 (GroupNorm groups of 8), got {self.channels}")
        if self.temporal_ensemble_coeff is not None and self.temporal_ensemble_coeff < 0:
            raise ConfigError(f"policy.temporal_ensemble_coeff: expected >= 0 or null, got "
                              f"{self.temporal_ensemble_coeff}")
        if not self.pixel_gain > 0:
            raise ConfigError(f"policy.pixel_gain: expected > 0, got {self.pixel_gain}")
        if self.shift < 0 or self.mlp_layers < 1 or not 0 <= self.dropout < 1:
            raise ConfigError("policy: shift >= 0, mlp_layers >= 1 and dropout in [0, 1) expected")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self, num_inference_steps: int | None = None) -> str:
        ens = (f"temporal ensembling m={self.temporal_ensemble_coeff:g}" if self.temporal_ensemble_coeff is not None
               else f"{self.n_action_steps} actions per chunk")
        crop = f", crop {self.crop[2]}x{self.crop[3]} at ({self.crop[0]}, {self.crop[1]})" if self.crop else ""
        colour = f" + {self.pixel_keypoints} colour keypoints" if self.pixel_keypoints else ""
        if self.pixel_keypoints:
            colour += f" (standardised maps, gain {self.pixel_gain:g})"
        return (f"keypoint policy (CNN {list(self.channels)}, {self.num_keypoints} spatial-softmax keypoints{colour}, "
                f"{self.image_size[0]}x{self.image_size[1]} images{crop}, L1 on chunks of {self.horizon}, {ens})")


class KeypointEncoder(nn.Module):
    """uint8-range image in [-1, 1] (B, 3, H, W) -> keypoint coordinates (B, 2K)."""

    def __init__(self, cfg: KeypointConfig):
        super().__init__()
        H, W = input_shape(cfg)
        self.net = self.pool = self.pixel = self.pixel_pool = None
        if cfg.num_keypoints:
            layers, cin = [], 3
            for i, (c, s) in enumerate(zip(cfg.channels, cfg.strides)):
                k = 5 if i == 0 else 3
                layers += [nn.Conv2d(cin, c, k, s, k // 2), nn.GroupNorm(c // 8, c), nn.ReLU(inplace=True)]
                cin = c
            self.net = nn.Sequential(*layers)
            with torch.no_grad():
                fmap = self.net(torch.zeros(1, 3, H, W))
            self.pool = SpatialSoftmax(cin, fmap.shape[2], fmap.shape[3], cfg.num_keypoints)
        if cfg.pixel_keypoints:
            self.pixel = nn.Sequential(nn.Conv2d(3, cfg.pixel_hidden, 1), nn.ReLU(inplace=True))
            self.pixel_pool = SpatialSoftmax(cfg.pixel_hidden, H, W, cfg.pixel_keypoints)
            # softmax over thousands of pixels: a gain lets a few pixels of one colour win
            self.pixel_log_gain = nn.Parameter(torch.tensor(math.log(cfg.pixel_gain)))
        self.feature_dim = 2 * (cfg.num_keypoints + cfg.pixel_keypoints)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = []
        if self.net is not None:
            feats.append(self.pool(self.net(x)))
        if self.pixel is not None:
            # Compiled, the colour branch's 1x1 convolutions (few channels, many pixels) run faster
            # channels-last on the CPU (a 1-thread training step 102 vs 118 ms); eagerly, slower (154 vs 144).
            # The same function either way.
            colour = self.pixel(x.contiguous(memory_format=torch.channels_last) if torch.compiler.is_compiling() else x)
            feats.append(self.pixel_pool(colour, gain=self.pixel_log_gain.exp(), standardise=True))
        return torch.cat(feats, dim=-1)


def input_shape(cfg: KeypointConfig) -> tuple[int, int]:
    return tuple(cfg.crop[2:]) if cfg.crop is not None else tuple(cfg.image_size)


def random_shift(x: torch.Tensor, pad: int, generator: torch.Generator | None) -> torch.Tensor:
    """(N, C, H, W): each image shifted by up to ``pad`` px (replicate padding, then a crop)."""
    if pad <= 0:
        return x
    n, _, H, W = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    off = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator, device="cpu").tolist()
    return torch.stack([padded[i, :, t:t + H, l:l + W] for i, (t, l) in enumerate(off)])


class KeypointPolicy(Policy):
    """Keypoints of a fixed crop -> MLP -> a chunk of ``horizon`` actions (L1); see the module docstring."""
    type = "keypoint"
    config_class = KeypointConfig

    def __init__(self, cfg: KeypointConfig, stats: dict[str, dict[str, np.ndarray]] | None = None):
        super().__init__(cfg)
        self.encoder = KeypointEncoder(cfg)
        d_in = (self.encoder.feature_dim + (cfg.state_dim if cfg.use_state else 0)) * cfg.n_obs_steps
        layers = []
        for _ in range(cfg.mlp_layers):
            layers += [nn.Linear(d_in, cfg.hidden_dim), nn.ReLU(inplace=True)]
            if cfg.dropout:
                layers.append(nn.Dropout(cfg.dropout))
            d_in = cfg.hidden_dim
        layers.append(nn.Linear(d_in, cfg.horizon * cfg.action_dim))
        self.head = nn.Sequential(*layers)
        self.register_stats(cfg.action_dim, cfg.state_dim, stats)
        self.reset()

    # -- model
    def forward(self, images: torch.Tensor, state: torch.Tensor, generator: torch.Generator | None = None):
        """images uint8 (B, n_obs, 3, H, W), state raw (B, n_obs, S) -> normalised chunk (B, horizon, A)."""
        cfg = self.config
        B, n = images.shape[:2]
        x = images.flatten(0, 1)
        if cfg.crop is not None:  # before the float conversion: only the crop is converted
            t, l, h, w = cfg.crop
            x = x[..., t:t + h, l:l + w]
        x = x.float() / 127.5 - 1.0
        if self.training:
            x = random_shift(x, cfg.shift, generator)
        feats = [self.encoder(x).reshape(B, n, -1)]
        if cfg.use_state:
            feats.append(self.normalize(state, "state"))
        return self.head(torch.cat(feats, dim=-1).flatten(1)).reshape(B, cfg.horizon, cfg.action_dim)

    def compute_loss(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """L1 between the predicted and demonstrated chunks (normalised), padding masked out."""
        cfg = self.config
        dev = self.action_min.device
        action = batch["action"].to(dev)
        if action.shape[1:] != (cfg.horizon, cfg.action_dim):
            raise ValueError(f"batch['action'] must be (B, {cfg.horizon}, {cfg.action_dim}), got {tuple(action.shape)}")
        pred = self(batch["images"].to(dev), batch["state"].to(dev), generator)
        loss = (pred - self.normalize(action, "action")).abs()
        if "action_is_pad" in batch:
            keep = (~batch["action_is_pad"].to(dev)).unsqueeze(-1).float()
            return (loss * keep).sum() / (keep.sum() * cfg.action_dim).clamp_min(1)
        return loss.mean()

    @torch.no_grad()
    def sample_actions(self, images: torch.Tensor, state: torch.Tensor, generator=None,
                       num_inference_steps: int | None = None) -> torch.Tensor:
        """(B, horizon, A) unnormalised actions (deterministic; the extra arguments are the
        Diffusion Policy's, accepted so callers need not tell the two apart)."""
        dev = self.action_min.device
        return self.unnormalize(self(images.to(dev), state.to(dev)), "action")
