"""The base of every policy: normalisation, the closed loop, and a saved folder (LeRobot's PreTrainedPolicy).

A policy predicts a chunk of ``horizon`` absolute actions from its last ``n_obs_steps``
observations (``sample_actions``, the one method a policy must write beside its loss). The
base turns that into a closed loop (``select_action``: keep the observation history, re-plan
every ``n_action_steps`` frames, and either execute the plan's next actions or, with
``temporal_ensemble_coeff``, average the overlapping plans as ACT does) and saves / loads
it as a folder (``config.json`` + ``model.safetensors``, atomically).

Normalisation (LeRobot's for Diffusion Policy): actions and states min-max to [-1, 1] with
the training mixture's statistics, kept as buffers so that a saved policy reproduces its
actions exactly.
"""
from __future__ import annotations

import json
from abc import ABCMeta, abstractmethod
from collections import deque
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from comsim.config import from_dict
from comsim.episode import resize_frames
from comsim.io.files import atomic_output

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
STAT_RANGE_EPS = 1e-4  # a constant dimension is mapped to -1 instead of dividing by zero


class Policy(nn.Module, metaclass=ABCMeta):
    """Subclasses set ``type`` (the config's ``type:``) and ``config_class``, build their modules in
    ``__init__`` (then ``self.register_stats(...)``, ``self.reset()``) and write ``compute_loss`` and
    ``sample_actions``."""

    type: ClassVar[str]
    config_class: ClassVar[type]

    def __init__(self, config):
        super().__init__()
        self.config = config

    # -- normalisation
    def register_stats(self, action_dim: int, state_dim: int, stats: dict | None = None) -> None:
        for key, dim in (("action", action_dim), ("state", state_dim)):
            self.register_buffer(f"{key}_min", -torch.ones(dim))
            self.register_buffer(f"{key}_max", torch.ones(dim))
        if stats is not None:
            self.set_stats(stats)

    def set_stats(self, stats: dict) -> None:
        """``stats``: {"action": {"min", "max"}, "observation.state": {"min", "max"}}."""
        for key, name in (("action", "action"), ("state", "observation.state")):
            lo = torch.as_tensor(np.asarray(stats[name]["min"], np.float32)).reshape(-1)
            hi = torch.as_tensor(np.asarray(stats[name]["max"], np.float32)).reshape(-1)
            if lo.shape != getattr(self, f"{key}_min").shape:
                raise ValueError(f"stats[{name!r}] has {lo.numel()} dims, the policy expects "
                                 f"{getattr(self, f'{key}_min').numel()}")
            getattr(self, f"{key}_min").copy_(lo)
            getattr(self, f"{key}_max").copy_(hi)

    def _range(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = getattr(self, f"{key}_min"), getattr(self, f"{key}_max")
        return lo, (hi - lo).clamp_min(STAT_RANGE_EPS)

    def normalize(self, x: torch.Tensor, key: str) -> torch.Tensor:
        lo, rng = self._range(key)
        return (x - lo) / rng * 2 - 1

    def unnormalize(self, x: torch.Tensor, key: str) -> torch.Tensor:
        lo, rng = self._range(key)
        return (x + 1) / 2 * rng + lo

    # -- what a policy writes
    @abstractmethod
    def compute_loss(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """batch: images (B, n_obs, 3, H, W) uint8, state (B, n_obs, S), action (B, horizon, A), optional
        action_is_pad (B, horizon) -> the training loss."""

    @abstractmethod
    def sample_actions(self, images: torch.Tensor, state: torch.Tensor, generator: torch.Generator | None = None,
                       num_inference_steps: int | None = None) -> torch.Tensor:
        """images uint8 (B, n_obs, 3, H, W), state raw (B, n_obs, S) -> (B, horizon, A) unnormalised actions."""

    # -- closed loop
    def reset(self) -> None:
        """Forget the observation history and the pending plans (call at every episode start)."""
        self._obs: deque = deque(maxlen=self.config.n_obs_steps)
        self._actions: deque = deque()
        self._chunks: list[tuple[int, np.ndarray]] = []  # (frame the chunk's first action is for, chunk)
        self._frame = 0

    @torch.no_grad()
    def select_action(self, obs: dict, generator: torch.Generator | None = None,
                      num_inference_steps: int | None = None) -> np.ndarray:
        """obs {"image": uint8 (H, W, 3) at any size, "state": (S,)} -> action (A,) float32."""
        cfg = self.config
        image = torch.from_numpy(resize_frames(np.asarray(obs["image"]), cfg.image_size)).permute(2, 0, 1)
        state = torch.tensor(np.asarray(obs["state"], np.float32))  # a copy: obs arrays may be read-only
        if not self._obs:  # episode start: repeat the first observation (as LeRobot pads)
            self._obs.extend([(image, state)] * cfg.n_obs_steps)
        else:
            self._obs.append((image, state))
        t, start = self._frame, cfg.n_obs_steps - 1  # a chunk starts at the oldest observation
        self._frame += 1
        coeff = getattr(cfg, "temporal_ensemble_coeff", None)
        if coeff is None:  # execute n_action_steps of each plan, then re-plan
            if not self._actions:
                self._actions.extend(self._plan(generator, num_inference_steps)[start:start + cfg.n_action_steps])
            return self._actions.popleft().astype(np.float32)
        if t % cfg.n_action_steps == 0:
            self._chunks.append((t, self._plan(generator, num_inference_steps)[start:]))
        self._chunks = [(t0, c) for t0, c in self._chunks if t - t0 < len(c)]
        preds = np.stack([c[t - t0] for t0, c in self._chunks])  # oldest first
        w = np.exp(-coeff * np.arange(len(preds)))
        return (w[:, None] * preds).sum(0).astype(np.float32) / w.sum()

    def _plan(self, generator, num_inference_steps) -> np.ndarray:
        images = torch.stack([i for i, _ in self._obs])[None]
        states = torch.stack([s for _, s in self._obs])[None]
        was_training = self.training
        self.eval()
        chunk = self.sample_actions(images, states, generator, num_inference_steps)[0].cpu().numpy()
        self.train(was_training)
        return chunk

    # -- save / load
    def save_pretrained(self, path: str | Path, extra: dict | None = None) -> Path:
        """``path``/config.json + model.safetensors (weights and normalisation stats), atomically."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with atomic_output(path / WEIGHTS_NAME) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, str(tmp))
        with atomic_output(path / CONFIG_NAME) as tmp:
            tmp.write_text(json.dumps({"type": self.type, **self.config.to_dict(),
                                       **({"extra": extra} if extra else {})}, indent=2) + "\n")
        return path

    @classmethod
    def config_for_loading(cls, data: dict) -> dict:
        """The saved config's fields as the config class takes them (a subclass may adjust them)."""
        return data

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str = "cpu") -> "Policy":
        path = Path(path)
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (path / name).is_file():
                raise FileNotFoundError(f"{path / name}: not found (not a saved {cls.__name__} folder)")
        data = json.loads((path / CONFIG_NAME).read_text())
        data.pop("extra", None)
        kind = data.pop("type", cls.type)
        if kind != cls.type:
            raise ValueError(f"{path / CONFIG_NAME}: not a {cls.type} policy (type {kind!r})")
        policy = cls(from_dict(cls.config_class, cls.config_for_loading(data), str(path / CONFIG_NAME)))
        policy.load_state_dict(load_file(str(path / WEIGHTS_NAME), device=map_location))
        return policy.eval()
