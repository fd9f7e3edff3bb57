"""Training windows from paired episodes: (real video, sim video, actions) of T frames.

``PairedWindowDataset`` reads from one or more LeRobot paired datasets (paths or
``comsim.io.lerobot.LeRobotDataset`` objects) or from in-memory ``Episode`` lists (tests,
synthetic data). Camera ``cam`` is the target, ``cam_sim`` the condition, and optional
``cam_sim_<control>`` keys (seg, depth) extra control channels. Actions are normalized
with ``ActionNormalizer`` (mean/std from meta/stats.json, or computed from episodes).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from comsim.episode import Episode, resize_frames
from comsim.io.keys import control_key, sim_key


# -- frames ---------------------------------------------------------------------------------
def video_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 (..., T, H, W, 3) -> float (..., 3, T, H, W) in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).float() / 127.5 - 1.0
    return x.movedim(-1, -4)


def tensor_to_video(x: torch.Tensor) -> np.ndarray:
    """float (..., 3, T, H, W) in [-1, 1] -> uint8 (..., T, H, W, 3)."""
    x = ((x.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.movedim(-4, -1).cpu().numpy()


# -- actions --------------------------------------------------------------------------------
@dataclass
class ActionNormalizer:
    """z-score normalization; ``std`` is floored so that a joint that never moved stays finite."""

    mean: np.ndarray
    std: np.ndarray
    min_std: float = 1e-2

    def __post_init__(self):
        self.mean = np.asarray(self.mean, np.float32).reshape(-1)
        self.std = np.maximum(np.asarray(self.std, np.float32).reshape(-1), self.min_std)
        if self.mean.shape != self.std.shape:
            raise ValueError(f"action stats: mean {self.mean.shape} and std {self.std.shape} differ in size")

    @property
    def dim(self) -> int:
        return len(self.mean)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        return ((np.asarray(actions, np.float32) - self.mean) / self.std).astype(np.float32)

    def denormalize(self, actions: np.ndarray) -> np.ndarray:
        return (np.asarray(actions, np.float32) * self.std + self.mean).astype(np.float32)

    def to_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "min_std": self.min_std}

    @classmethod
    def from_dict(cls, d: dict) -> "ActionNormalizer":
        return cls(d["mean"], d["std"], d.get("min_std", 1e-2))

    @classmethod
    def from_episodes(cls, episodes: list[Episode]) -> "ActionNormalizer":
        a = np.concatenate([e.action for e in episodes])
        return cls(a.mean(0), a.std(0))

    @classmethod
    def pooled(cls, parts: list[tuple[np.ndarray, np.ndarray, float]]) -> "ActionNormalizer":
        """Combine (mean, std, count) of several datasets into one mean/std."""
        n = sum(c for _, _, c in parts)
        mean = sum(np.asarray(m) * c for m, _, c in parts) / n
        var = sum((np.asarray(s) ** 2 + (np.asarray(m) - mean) ** 2) * c for m, s, c in parts) / n
        return cls(mean, np.sqrt(var))


# -- sources --------------------------------------------------------------------------------
# The twin's replay writes each episode's camera motion since the calibration stills here, in its paired dataset's
# folder (comsim.twin.replay.ALIGNMENT_FILE): "camera_motion" -> {episode: {"moved", "track_px" (n, 2) per frame}}.
ALIGNMENT_FILE = "twin_alignment.json"


def camera_shifts(root) -> dict[int, np.ndarray]:
    """{episode: (n, 2) px} the camera's image shift per frame as the twin rendered it, for the episodes of the
    paired dataset ``root`` whose camera moved (the replay follows those frame by frame); an episode not listed
    was rendered at the calibrated camera (shift 0). {} for a dataset without the replay's alignment file."""
    path = Path(root) / ALIGNMENT_FILE
    if not path.is_file():
        return {}
    try:
        motion = json.loads(path.read_text()).get("camera_motion") or {}
        return {int(e): np.asarray(m["track_px"], np.float32).reshape(-1, 2)
                for e, m in motion.items() if m and m.get("moved")}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        from comsim.errors import InputError

        raise InputError(str(path), "camera_motion", "{episode: {moved, track_px: [[x, y] per frame]}}",
                         f"unreadable ({err})") from None


class _EpisodeSource:
    """In-memory episodes behind the LeRobotDataset reading API used here."""

    def __init__(self, episodes: list[Episode], shifts: dict[int, np.ndarray] | None = None):
        self.episodes = list(episodes)
        self.fps = self.episodes[0].fps if self.episodes else 10.0
        self.camera_shifts = dict(shifts or {})

    def __len__(self):
        return len(self.episodes)

    def episode_length(self, i: int) -> int:
        return len(self.episodes[i])

    def read_window(self, i: int, start: int, length: int, cameras=None) -> Episode:
        e = self.episodes[i]
        cams = cameras or list(e.frames)
        missing = [c for c in cams if c not in e.frames]
        if missing:
            raise KeyError(f"episode {i} has no camera(s) {missing}; it has {sorted(e.frames)}")
        sl = slice(start, start + length)
        return Episode(frames={c: e.frames[c][sl] for c in cams}, action=e.action[sl], state=e.state[sl], fps=e.fps)

    def action_stats(self):
        a = np.concatenate([e.action for e in self.episodes])
        return a.mean(0), a.std(0), float(len(a))


def _open_source(src):
    if isinstance(src, (str, Path)):
        from comsim.io.lerobot import LeRobotDataset  # written by the io stage; imported only when needed

        ds = LeRobotDataset(src)
        ds._comsim_root = Path(src)
        ds.camera_shifts = camera_shifts(src)
        return ds
    if isinstance(src, (list, tuple)) and (len(src) == 0 or isinstance(src[0], Episode)):
        return _EpisodeSource(src)
    return src  # a LeRobotDataset-like object


def preload_source(src, cameras: list[str], resolution: tuple[int, int]):
    """``src`` (a LeRobot dataset path/object or Episodes) read once into memory, the ``cameras``
    resized to ``resolution``: windows are then slices, with no video decoding per item.
    Episode Lists stay as they are (already in memory)."""
    ds = _open_source(src)
    if isinstance(ds, _EpisodeSource):
        return ds
    eps = []
    for i in range(len(ds)):
        ep = ds.read_episode(i, cameras=cameras)
        eps.append(dataclasses.replace(ep, frames={k: resize_frames(v, resolution) for k, v in ep.frames.items()},
                                       extra={}))
    out = _EpisodeSource(eps, getattr(ds, "camera_shifts", None))
    out.fps = float(getattr(ds, "fps", out.fps))
    return out


def _source_stats(ds):
    if isinstance(ds, _EpisodeSource):
        return ds.action_stats()
    stats = getattr(ds, "stats", None)
    if stats is None:
        root = getattr(ds, "_comsim_root", None) or getattr(ds, "root", None)
        path = Path(root) / "meta" / "stats.json" if root is not None else None
        if path is None or not path.is_file():
            raise FileNotFoundError(f"no action statistics for dataset {root}: expected meta/stats.json with "
                                    "action mean/std")
        stats = json.loads(path.read_text())
    a = stats["action"]
    count = float(np.asarray(a.get("count", [1.0])).reshape(-1)[0])
    return np.asarray(a["mean"], np.float32), np.asarray(a["std"], np.float32), count


class PairedWindowDataset(torch.utils.data.Dataset):
    """Windows of ``num_frames`` frames: {"target": (3,T,H,W), "sim": (Cs,T,H,W), "actions": (T,A),
    "camera_shift": (T, 2) px (``camera_shifts``; 0 where the twin rendered at the calibrated camera)}.

    Args:
        sources: list of LeRobot dataset paths/objects, or ONE list of Episodes.
        camera: short camera name: target ``camera``, condition ``sim_key(camera)`` (``<camera>_sim``).
        num_frames: window length T (pixel frames).
        resolution: (H, W) the frames are resized to.
        normalizer: action normalization; None = pooled stats of the sources.
        episodes: restrict to these (source index, episode index) pairs (a split).
        stride: step between window starts.
        controls: extra control channels, read from ``control_key(camera, name)`` (``<camera>_sim_<name>``,
            e.g. "seg", "depth", "normal").
    """

    def __init__(self, sources, camera: str, num_frames: int, resolution: tuple[int, int],
                 normalizer: ActionNormalizer | None = None, episodes: list[tuple[int, int]] | None = None,
                 stride: int = 1, controls: tuple[str, ...] = ()):
        if isinstance(sources, (str, Path)) or (isinstance(sources, (list, tuple)) and sources
                                                 and isinstance(sources[0], Episode)):
            sources = [sources]
        self.sources = [_open_source(s) for s in sources]
        self.camera, self.num_frames, self.resolution = camera, num_frames, tuple(resolution)
        self.controls = tuple(controls)
        self.keys = [camera, sim_key(camera)] + [control_key(camera, c) for c in self.controls]
        for ds in self.sources:
            missing = [k for k in self.keys if k not in getattr(ds, "camera_keys", self.keys)]
            if missing:  # a sim-only or real-only dataset is not a pair
                from comsim.io.lerobot import DatasetError

                raise DatasetError(f"{getattr(ds, 'root', 'in-memory episodes')}/meta/info.json: expected the paired cameras {self.keys} (data.camera "
                                   f"{camera!r}, data.controls {list(self.controls)}), the dataset has {ds.camera_keys}")
        if normalizer is None:
            normalizer = ActionNormalizer.pooled([_source_stats(s) for s in self.sources])
        self.normalizer = normalizer
        if episodes is None:
            episodes = [(s, e) for s, ds in enumerate(self.sources) for e in range(len(ds))]
        self.episodes = list(episodes)
        self.index = []
        for s, e in self.episodes:
            L = self.sources[s].episode_length(e)
            if L < num_frames:
                continue  # too short for one window
            self.index += [(s, e, t) for t in range(0, L - num_frames + 1, stride)]
        if not self.index:
            from comsim.errors import InputError

            where = [str(getattr(ds, "root", "in-memory episodes")) for ds in self.sources]
            raise InputError(", ".join(where), "data.num_frames", f"episodes of at least {num_frames} frames",
                             "none as long")

    @property
    def sim_channels(self) -> int:
        return 3 * (1 + len(self.controls))

    def __len__(self):
        return len(self.index)

    def __getitem__(self, idx: int) -> dict:
        s, e, t = self.index[idx]
        ep = self.sources[s].read_window(e, t, self.num_frames, cameras=self.keys)
        if ep.action.shape[1] != self.normalizer.dim:
            raise ValueError(f"source {s} episode {e}: action_dim {ep.action.shape[1]}, the normalizer has "
                             f"{self.normalizer.dim}")
        vids = [video_to_tensor(resize_frames(ep.frames[k], self.resolution)) for k in self.keys]
        return {"target": vids[0], "sim": torch.cat(vids[1:]), "episode": torch.tensor([s, e, t]),
                "actions": torch.from_numpy(self.normalizer.normalize(ep.action)),
                "camera_shift": torch.from_numpy(self.window_shift(s, e, t))}

    def window_shift(self, s: int, e: int, t: int) -> np.ndarray:
        """(T, 2) px: the camera shift of frames t..t+T of episode e of source s (0 if it did not move)."""
        track = getattr(self.sources[s], "camera_shifts", {}).get(e)
        if track is None:
            return np.zeros((self.num_frames, 2), np.float32)
        if len(track) != self.sources[s].episode_length(e):
            from comsim.errors import InputError

            root = getattr(self.sources[s], "_comsim_root", "in-memory episodes")
            raise InputError(f"{root}/{ALIGNMENT_FILE}", f"camera_motion.{e}.track_px",
                             f"{self.sources[s].episode_length(e)} frames (the episode's length)", f"{len(track)}")
        return np.ascontiguousarray(track[t:t + self.num_frames], np.float32)


def split_episodes(dataset_sizes: list[int], val_episodes: int) -> tuple[list, list]:
    """Hold out the last ``val_episodes`` episodes of the first source for validation."""
    all_eps = [(s, e) for s, n in enumerate(dataset_sizes) for e in range(n)]
    if val_episodes <= 0:
        return all_eps, []
    if val_episodes >= dataset_sizes[0]:
        raise ValueError(f"data.val_episodes={val_episodes} leaves no training episode in the first source "
                         f"({dataset_sizes[0]} episodes)")
    val = [(0, e) for e in range(dataset_sizes[0] - val_episodes, dataset_sizes[0])]
    return [x for x in all_eps if x not in val], val


# -- latent cache ---------------------------------------------------------------------------
class LatentWindowDataset(torch.utils.data.Dataset):
    """Pre-encoded windows: the same items as PairedWindowDataset, in latent space."""

    def __init__(self, path: str | Path):
        from safetensors.torch import load_file

        self.tensors = load_file(str(path))

    def __len__(self):
        return len(self.tensors["target"])

    def __getitem__(self, idx):
        return {k: v[idx] for k, v in self.tensors.items()}


def build_latent_cache(dataset: PairedWindowDataset, codec, path: str | Path, batch_size: int = 8,
                       encode_sim=None) -> Path:
    """Encode every window of ``dataset`` once and save it as one safetensors file (atomically).

    ``encode_sim`` maps a pixel sim condition (B, Cs, T, H, W) to latents; default: codec on the
    first 3 channels, control channels pooled to the latent size.
    """
    from safetensors.torch import save_file

    path = Path(path)
    encode_sim = encode_sim or (lambda s: encode_condition(codec, s))
    out = {"target": [], "sim": [], "actions": [], "episode": []}
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
    for batch in loader:
        out["target"].append(codec.encode(batch["target"]).cpu())
        out["sim"].append(encode_sim(batch["sim"]).cpu())
        out["actions"].append(batch["actions"])
        out["episode"].append(batch["episode"])
    tensors = {k: torch.cat(v).contiguous() for k, v in out.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return path


def encode_condition(codec, sim: torch.Tensor) -> torch.Tensor:
    """Pixel sim condition (B, 3 + 3*n_controls, T, H, W) -> (B, C + 3*n_controls, t, h, w) latents."""
    z = codec.encode(sim[:, :3])
    if sim.shape[1] == 3:
        return z
    controls = F.interpolate(sim[:, 3:].to(z), size=tuple(z.shape[2:]), mode="area")
    return torch.cat([z, controls], dim=1)
