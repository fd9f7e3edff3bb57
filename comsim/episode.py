"""Episode: one demonstration as the whole pipeline sees it.

Frames per camera are uint8 ``(T, H, W, 3)``; ``action`` holds absolute targets
(7 arm joint positions + gripper command in [0, 1], 1 = open) at video rate and
``state`` the measured joint positions (7 arm joints + gripper opening in metres).
Provenance travels with the episode so that real and generated data are never
silently merged.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SOURCES = ("real", "lab", "sim", "pseudo_real")


@dataclass
class Provenance:
    source: str = "sim"  # real | lab | sim | pseudo_real
    task: str = ""
    seed: int | None = None
    twin_spec_hash: str | None = None
    translator_hash: str | None = None
    guidance: dict[str, float] | None = None  # e.g. {"w_action": 1.5, "w_sim": 2.0}
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"Provenance.source must be one of {SOURCES}, got {self.source!r}")

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "Provenance":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass
class Episode:
    frames: dict[str, np.ndarray]  # camera key (e.g. "front", "front_sim") -> uint8 (T, H, W, 3)
    action: np.ndarray  # float32 (T, A)
    state: np.ndarray  # float32 (T, S)
    fps: float = 10.0
    timestamps: np.ndarray | None = None  # float32 (T,), seconds from the episode start
    task: str = ""
    success: bool | None = None
    provenance: Provenance = field(default_factory=Provenance)
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # other per-frame arrays (T, ...)

    def __post_init__(self):
        self.action = np.asarray(self.action, dtype=np.float32)
        self.state = np.asarray(self.state, dtype=np.float32)
        if self.timestamps is None:
            self.timestamps = (np.arange(len(self.action)) / self.fps).astype(np.float32)
        self.validate()

    def __len__(self) -> int:
        return len(self.action)

    def validate(self) -> None:
        T = len(self.action)
        if self.action.ndim != 2:
            raise ValueError(f"Episode.action must be (T, A), got shape {self.action.shape}")
        if self.state.ndim != 2 or len(self.state) != T:
            raise ValueError(f"Episode.state must be (T={T}, S), got shape {self.state.shape}")
        if len(self.timestamps) != T:
            raise ValueError(f"Episode.timestamps must have length {T}, got {len(self.timestamps)}")
        for cam, f in self.frames.items():
            if f.dtype != np.uint8 or f.ndim != 4 or f.shape[-1] != 3 or len(f) != T:
                raise ValueError(
                    f"Episode.frames[{cam!r}] must be uint8 (T={T}, H, W, 3), got {f.dtype} {f.shape}")
        for k, v in self.extra.items():
            if len(v) != T:
                raise ValueError(f"Episode.extra[{k!r}] must have length {T}, got {len(v)}")


def hash_dict(d: dict) -> str:
    """Short stable hash of a JSON-able dict (twin specs, configs)."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def episode_seed(seed: int, index: int, *streams: int) -> int:
    """Seed of episode ``index`` of a run started with ``seed`` (lab recordings, factory episodes and their
    retries, conversions): a SeedSequence of the integers, so neighbouring runs and episodes draw
    independent streams, and an episode's seed does not depend on which process or shard made it."""
    return int(np.random.SeedSequence([int(seed), int(index), *(int(s) for s in streams)]).generate_state(1)[0])


def check_seed(seed, field: str = "--seed") -> int:
    """A run's base seed as ``episode_seed`` takes it: a whole number >= 0 (a SeedSequence refuses
    negative ones, which would otherwise fail only at the first episode, after the run's files are made)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        from comsim.errors import InputError

        raise InputError(None, field, "a whole number >= 0", seed)
    return int(seed)


def resize_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 (..., H, W, 3) -> uint8 (..., h, w, 3) for ``size`` = (h, w): area averaging when shrinking
    (OpenCV INTER_AREA), bilinear when enlarging; the frames themselves when the size is already right."""
    import cv2

    h, w = (int(v) for v in size)
    frames = np.asarray(frames)
    if frames.shape[-3:-1] == (h, w):
        return np.ascontiguousarray(frames)
    shrink = h <= frames.shape[-3] and w <= frames.shape[-2]
    mode = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    flat = frames.reshape(-1, *frames.shape[-3:])
    out = np.stack([cv2.resize(np.ascontiguousarray(f), (w, h), interpolation=mode) for f in flat])
    return out.reshape(*frames.shape[:-3], h, w, frames.shape[-1])
