"""Training data of a policy: a mixture of LeRobot datasets with an explicit synthetic fraction.

    data = MixtureDataset(MixtureConfig(sources=[SourceConfig("runs/lab_push", max_episodes=10),
                                                 SourceConfig("runs/pseudo_real_push")],
                                        synthetic_fraction=0.5), policy_cfg, cache_dir="runs/cache")
    batch = data.sample(64, np.random.default_rng([seed, step]))
    data.sampled_fraction   # the synthetic share actually drawn so far (logged by the trainer)

Every episode goes to one of two pools by its provenance: real (``real``, ``lab``) or
synthetic (``sim``, ``pseudo_real``). Each draw takes the synthetic pool with probability
``synthetic_fraction`` (None: proportional to frames), then a source of that pool by
weight, then a frame uniformly; the sample is the window around it (LeRobot's
``delta_timestamps``: ``n_obs_steps`` observations ending at the frame, ``horizon``
actions starting with the oldest observation, edges padded by repetition and flagged in
``action_is_pad``). Datasets stay separate on disk: the mixture exists only here.

Frames of the chosen camera are decoded once, resized to the policy's ``image_size`` and
kept in memory, or in ``cache_dir`` as memory-mapped ``.npy`` files shared by runs.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from comsim.config import ConfigError
from comsim.io.lerobot import DatasetError, LeRobotDataset, dataset_fingerprint
from comsim.io.files import atomic_output
from comsim.episode import resize_frames
from comsim.policy.config import REAL_SOURCES, MixtureConfig, SourceConfig
from comsim.policy.model import DiffusionConfig

POOLS = ("real", "synthetic")


@dataclass
class _Part:
    """The episodes of one source that fall in one pool, loaded."""
    path: str
    camera: str
    pool: str
    weight: float
    episodes: list[int]
    seeds: list[int | None]
    provenance: list[str]  # provenance sources present (e.g. ["lab"], ["pseudo_real"])
    frames: np.ndarray  # uint8 (N, h, w, 3), maybe memory-mapped
    action: np.ndarray  # float32 (N, A)
    state: np.ndarray  # float32 (N, S)
    ep_start: np.ndarray  # int64 (N,): first row of the row's episode
    ep_end: np.ndarray  # int64 (N,): one past its last row

    def summary(self) -> dict:
        return {"path": self.path, "camera": self.camera, "pool": self.pool, "provenance": self.provenance,
                "episodes": len(self.episodes),
                "frames": len(self.action), "weight": self.weight}


def pool_of(source: str) -> str:
    return "real" if source in REAL_SOURCES else "synthetic"


class MixtureDataset:
    def __init__(self, mix: MixtureConfig, policy: DiffusionConfig, cache_dir: str | Path | None = None,
                 where: str = "data"):
        if not mix.sources:
            raise ConfigError(f"{where}.sources: the mixture is empty")
        self.cfg, self.policy, self.where = mix, policy, where
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.parts: list[_Part] = []
        for i, src in enumerate(mix.sources):
            self.parts += self._load_source(src, f"{where}.sources[{i}]")
        self.pools = {p: [part for part in self.parts if part.pool == p] for p in POOLS}
        frames = {p: sum(len(part.action) for part in self.pools[p]) for p in POOLS}
        f = mix.synthetic_fraction
        if f is None:
            f = frames["synthetic"] / (frames["real"] + frames["synthetic"])
        if f > 0 and not self.pools["synthetic"]:
            raise ConfigError(f"{where}.synthetic_fraction is {f:g} but no source holds synthetic (sim / pseudo_real) "
                              f"episodes: {[s.dataset for s in mix.sources]}")
        if f < 1 and not self.pools["real"]:
            raise ConfigError(f"{where}.synthetic_fraction is {f:g} but no source holds real (real / lab) episodes: "
                              f"{[s.dataset for s in mix.sources]}; use synthetic_fraction: 1.0 for synthetic only")
        self.synthetic_fraction = float(f)
        self.drawn = {p: 0 for p in POOLS}
        dims = {(p.action.shape[1], p.state.shape[1]) for p in self.parts}
        if dims != {(policy.action_dim, policy.state_dim)}:
            raise ConfigError(f"{where}: action/state sizes {sorted(dims)} of the sources do not match "
                              f"policy.action_dim={policy.action_dim}, policy.state_dim={policy.state_dim}")

    # -- loading
    def _load_source(self, src: SourceConfig, where: str) -> list[_Part]:
        try:
            ds = LeRobotDataset(src.dataset)
        except DatasetError as e:
            raise ConfigError(f"{where}.dataset: {e}") from None
        if src.camera not in ds.camera_keys:
            raise ConfigError(f"{where}.camera: {src.dataset} has no camera {src.camera!r} (it has {ds.camera_keys}); "
                              "a sim dataset's render is usually '<cam>_sim'")
        n = len(ds) if src.max_episodes is None else min(len(ds), src.max_episodes)
        if src.max_episodes is not None and len(ds) < src.max_episodes:
            raise ConfigError(f"{where}.max_episodes: {src.dataset} holds only {len(ds)} episodes, "
                              f"{src.max_episodes} asked")
        by_pool: dict[str, list[tuple[int, int | None, str]]] = {p: [] for p in POOLS}
        for e in range(n):
            prov = ds.episode_info(e)["provenance"]
            pool = pool_of(prov.source)
            if src.role != "auto" and src.role != pool:
                raise ConfigError(f"{where}.role: {src.role!r}, but episode {e} of {src.dataset} has provenance "
                                  f"source {prov.source!r} ({pool}); real and synthetic data are never relabelled")
            by_pool[pool].append((e, prov.seed, prov.source))
        frames, action, state, lengths = self._read(ds, src.camera, list(range(n)))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        parts = []
        for pool, eps in by_pool.items():
            if not eps:
                continue
            idx = [e for e, _, _ in eps]
            rows = np.concatenate([np.arange(starts[e], starts[e] + lengths[e]) for e in idx])
            lens = np.array([lengths[e] for e in idx])
            new_start = np.repeat(np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
            whole = len(idx) == n  # the common case: no copy of the (memory-mapped) frames
            parts.append(_Part(path=str(src.dataset), camera=src.camera, pool=pool,
                               weight=float(src.weight if src.weight is not None else len(rows)),
                               episodes=idx, seeds=[s for _, s, _ in eps], provenance=sorted({k for _, _, k in eps}),
                               frames=frames if whole else frames[rows], action=action[rows], state=state[rows],
                               ep_start=new_start.astype(np.int64), ep_end=(new_start + np.repeat(lens, lens)).astype(np.int64)))
        return parts

    def _read(self, ds: LeRobotDataset, camera: str, episodes: list[int]):
        """Actions, states, episode lengths and resized frames of ``episodes`` (frames cached)."""
        size = tuple(self.policy.image_size)
        actions, states, lengths = [], [], []
        for e in episodes:
            ep = ds.read_episode(e, cameras=[])  # parquet only
            actions.append(ep.action)
            states.append(ep.state)
            lengths.append(len(ep))
        action, state = np.concatenate(actions), np.concatenate(states)
        cache = self._cache_path(ds, camera, size, len(episodes))
        if cache is not None and cache.is_file():
            frames = np.load(cache, mmap_mode="r")
            if frames.shape == (len(action), *size, 3):
                return frames, action, state, np.array(lengths)
        frames = np.empty((len(action), *size, 3), np.uint8)
        row = 0
        for e in tqdm(episodes, desc=f"decode {Path(ds.root).name}/{camera}", unit="episode", leave=False):
            fr = ds.read_episode(e, cameras=[camera]).frames[camera]
            frames[row:row + len(fr)] = resize_frames(fr, size)
            row += len(fr)
        if cache is not None:
            with atomic_output(cache) as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, frames)
            frames = np.load(cache, mmap_mode="r")
        return frames, action, state, np.array(lengths)

    def _cache_path(self, ds: LeRobotDataset, camera: str, size, n: int) -> Path | None:
        if self.cache_dir is None:
            return None
        key = json.dumps([dataset_fingerprint(ds.root), camera, list(size), n])  # content, not path: never stale
        return self.cache_dir / f"{Path(ds.root).name}-{camera}-{size[0]}x{size[1]}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.npy"

    # -- facts
    def __len__(self) -> int:
        return sum(len(p.action) for p in self.parts)

    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        """min/max of actions and states over every frame of the mixture (for min-max to [-1, 1])."""
        a = np.concatenate([p.action for p in self.parts])
        s = np.concatenate([p.state for p in self.parts])
        return {"action": {"min": a.min(0), "max": a.max(0)}, "observation.state": {"min": s.min(0), "max": s.max(0)}}

    def episode_seeds(self) -> set[int]:
        return {s for p in self.parts for s in p.seeds if s is not None}

    @property
    def sampled_fraction(self) -> float | None:
        n = sum(self.drawn.values())
        return self.drawn["synthetic"] / n if n else None

    def summary(self) -> dict:
        return {"synthetic_fraction": self.synthetic_fraction,
                "synthetic_fraction_requested": self.cfg.synthetic_fraction,
                "sampled_fraction": self.sampled_fraction, "drawn": dict(self.drawn),
                "parts": [p.summary() for p in self.parts]}

    # -- sampling
    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """A batch of windows: images uint8 (B, n_obs, 3, h, w), state (B, n_obs, S),
        action (B, horizon, A), action_is_pad (B, horizon), is_synthetic (B,)."""
        cfg = self.policy
        synthetic = rng.random(batch_size) < self.synthetic_fraction
        obs_off = np.arange(cfg.n_obs_steps) - (cfg.n_obs_steps - 1)
        act_off = np.arange(cfg.horizon) - (cfg.n_obs_steps - 1)
        images, states, actions, pads = [], [], [], []
        for syn in synthetic:
            pool = self.pools["synthetic" if syn else "real"]
            w = np.array([p.weight for p in pool])
            part = pool[rng.choice(len(pool), p=w / w.sum())] if len(pool) > 1 else pool[0]
            r = int(rng.integers(len(part.action)))
            lo, hi = part.ep_start[r], part.ep_end[r]
            o = np.clip(r + obs_off, lo, hi - 1)
            a = r + act_off
            pads.append((a < lo) | (a >= hi))
            a = np.clip(a, lo, hi - 1)
            images.append(np.asarray(part.frames[o]))
            states.append(part.state[o])
            actions.append(part.action[a])
        self.drawn["synthetic"] += int(synthetic.sum())
        self.drawn["real"] += int((~synthetic).sum())
        return {"images": torch.from_numpy(np.stack(images)).permute(0, 1, 4, 2, 3).contiguous(),
                "state": torch.from_numpy(np.stack(states)), "action": torch.from_numpy(np.stack(actions)),
                "action_is_pad": torch.from_numpy(np.stack(pads)), "is_synthetic": torch.from_numpy(synthetic)}
