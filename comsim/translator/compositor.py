"""No-network baselines for the translator: what a trained model has to beat.

Each is fit on the TRAINING pairs of a paired dataset (``<cam>`` the real video, ``<cam>_sim``
the twin's render, ``<cam>_sim_seg`` its labels) and applied to an Episode's twin render (and
labels), returning frames like the translator's (uint8 ``(T, H, W, 3)``):

- ``raw``: the twin's render itself (identity);
- ``global_color``: the twin's render through one affine colour map (3x4: ``real ~ A @ [r, g, b, 1]``),
  least squares over every training pixel;
- ``compositor``: the real background plate (per-pixel median of the training real frames where the
  twin shows its backdrop, label 0) wherever the twin shows backdrop, and one affine colour map per
  twin label (robot, each object) elsewhere. Plate pixels the training frames never showed as
  backdrop (always behind the robot's base) and labels never seen in training take the global map.
  Where the twin's replay followed a camera that moved (the paired dataset's ``camera_motion``), the plate
  moves with it, relative to the mean shift of the frames it was fit on (a factory episode: shift 0).

A translator is judged by its margin over the compositor, not over the raw render.

    base = fit_baseline("compositor", "runs/demo/paired", "front", episodes=[0, ..., 7])
    frames = base.apply(episode)                      # episode.frames: front_sim, front_sim_seg
    base.save("runs/demo/baselines/compositor"); base = load_baseline("runs/demo/baselines/compositor")

Saved as ``baseline.json`` (kind, camera, resolution, what it was fit on) + ``baseline.safetensors``
(the plate and the maps): nothing is unpickled.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from comsim.episode import Episode, resize_frames
from comsim.io.keys import seg_key, sim_key
from comsim.io.labels import labels_from_palette

KINDS = ("raw", "global_color", "compositor")
CONFIG_NAME, TENSORS_NAME = "baseline.json", "baseline.safetensors"
BACKGROUND = 0
MAX_LABELS = 16  # labels 0 (background), 1 (robot), 2 + k (object k); more than the palette holds
RIDGE = 1e-3  # on the normal equations: a label seen in a few flat-coloured pixels still gets a map
PLATE_FRAMES = 400  # training frames (evenly spaced) whose backdrop pixels give the plate's median
OBJECT_MIN_PIXELS = 4  # mean pixels per training frame of a label that is one of the twin's objects


def _design(rgb: np.ndarray) -> np.ndarray:
    """(N, 3) uint8 colours -> (N, 4) float64 [r, g, b, 1]."""
    x = rgb.reshape(-1, 3).astype(np.float64)
    return np.concatenate([x, np.ones((len(x), 1))], 1)


def _apply_map(A: np.ndarray, rgb: np.ndarray) -> np.ndarray:
    """Affine colour map A (3, 4) applied to uint8 colours (..., 3) -> uint8."""
    shape = rgb.shape
    out = _design(rgb) @ A.T
    return np.clip(out + 0.5, 0, 255).astype(np.uint8).reshape(shape)


class _NormalEquations:
    """Running X^T X and X^T Y of an affine colour fit (one per label), then the least-squares map."""

    def __init__(self, n: int):
        self.xtx = np.zeros((n, 4, 4))
        self.xty = np.zeros((n, 4, 3))
        self.count = np.zeros(n, np.int64)

    def add(self, i: int, sim: np.ndarray, real: np.ndarray) -> None:
        X, Y = _design(sim), real.reshape(-1, 3).astype(np.float64)
        self.xtx[i] += X.T @ X
        self.xty[i] += X.T @ Y
        self.count[i] += len(X)

    def solve(self, i: int) -> np.ndarray:
        """(3, 4) map; ridge-regularized toward the identity so that a nearly flat label stays sane."""
        prior = np.vstack([np.eye(3), np.zeros((1, 3))])  # identity: real = sim
        lam = RIDGE * max(self.count[i], 1) * np.diag([1.0, 1.0, 1.0, 1e-4])
        W = np.linalg.solve(self.xtx[i] + lam, self.xty[i] + lam @ prior)
        return np.ascontiguousarray(W.T)


@dataclass
class Baseline:
    """A fitted no-network baseline (``kind`` in KINDS); see the module doc."""
    kind: str
    camera: str
    resolution: tuple[int, int]  # (H, W) it was fit at and renders at
    global_map: np.ndarray = field(default_factory=lambda: np.hstack([np.eye(3), np.zeros((3, 1))]))
    label_maps: np.ndarray | None = None  # (MAX_LABELS, 3, 4) compositor only
    label_seen: np.ndarray | None = None  # (MAX_LABELS,) bool: the label had training pixels
    plate: np.ndarray | None = None  # (H, W, 3) uint8 real background plate
    plate_valid: np.ndarray | None = None  # (H, W) bool: some training frame showed backdrop there
    plate_shift_px: tuple[float, float] = (0.0, 0.0)  # the mean camera shift (x, y) of the plate's frames
    fit_info: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kind

    def apply(self, ep: Episode, camera_shift: np.ndarray | None = None) -> np.ndarray:
        """uint8 (T, H, W, 3) at ``resolution``: this baseline's guess of the real frames of ``ep``
        (which holds ``<cam>_sim`` and, for the compositor, ``<cam>_sim_seg``); ``camera_shift`` (T, 2) px:
        the camera's shift per frame as the twin rendered it (None: 0, the calibrated camera)."""
        return self.apply_frames(ep.frames[sim_key(self.camera)],
                                 ep.frames.get(seg_key(self.camera)) if self.kind == "compositor" else None,
                                 camera_shift)

    def plate_at(self, shift) -> tuple[np.ndarray, np.ndarray]:
        """(plate, valid) moved by ``shift`` (x, y) px minus the plate's own (bilinear; the border repeats)."""
        d = np.asarray(shift, np.float64) - np.asarray(self.plate_shift_px, np.float64)
        if not d.any():
            return self.plate, self.plate_valid
        import cv2

        M, size = np.float32([[1, 0, d[0]], [0, 1, d[1]]]), self.plate.shape[1::-1]
        return (cv2.warpAffine(self.plate, M, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE),
                cv2.warpAffine(self.plate_valid.astype(np.uint8), M, size, flags=cv2.INTER_NEAREST,
                               borderMode=cv2.BORDER_REPLICATE).astype(bool))

    def apply_frames(self, sim: np.ndarray, seg: np.ndarray | None = None,
                     camera_shift: np.ndarray | None = None) -> np.ndarray:
        sim = resize_frames(sim, self.resolution)
        if self.kind == "raw":
            return sim
        out = _apply_map(self.global_map, sim)
        if self.kind == "global_color":
            return out
        if seg is None:
            raise ValueError(f"compositor baseline: the episode has no {seg_key(self.camera)!r} labels")
        labels = labels_from_palette(seg, self.resolution)
        for lab in np.unique(labels):
            if lab == BACKGROUND or lab >= MAX_LABELS or not self.label_seen[lab]:
                continue
            m = labels == lab
            out[m] = _apply_map(self.label_maps[lab], sim[m])
        shifts = np.zeros((len(out), 2)) if camera_shift is None else np.asarray(camera_shift, np.float64)
        if shifts.shape != (len(out), 2):
            raise ValueError(f"compositor baseline: camera_shift: expected ({len(out)}, 2) px per frame, got "
                             f"{shifts.shape}")
        for k in range(len(out)):
            plate, valid = self.plate_at(shifts[k])
            bg = (labels[k] == BACKGROUND) & valid
            out[k][bg] = plate[bg]
        return out

    # ---------------------------------------------------------------- save / load

    def save(self, folder: str | Path) -> Path:
        from safetensors.numpy import save_file

        from comsim.io.files import atomic_output

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {"global_map": self.global_map.astype(np.float64)}
        if self.kind == "compositor":
            tensors.update(label_maps=self.label_maps.astype(np.float64), label_seen=self.label_seen.astype(np.uint8),
                           plate=self.plate.astype(np.uint8), plate_valid=self.plate_valid.astype(np.uint8))
        # safetensors writes an array's memory as it lies: C order first (a map is a transposed solve)
        tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        with atomic_output(folder / TENSORS_NAME) as tmp:
            save_file(tensors, str(tmp))
        cfg = {"format": "comsim.baseline/1", "kind": self.kind, "camera": self.camera,
               "resolution": list(self.resolution), "plate_shift_px": [float(v) for v in self.plate_shift_px],
               "fit": self.fit_info}
        with atomic_output(folder / CONFIG_NAME) as tmp:
            tmp.write_text(json.dumps(cfg, indent=1) + "\n")
        return folder


def load_baseline(folder: str | Path) -> Baseline:
    """A baseline written by ``Baseline.save`` (safetensors + json; nothing is unpickled)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no baseline here (written by Baseline.save)")
    cfg = json.loads(path.read_text())
    if cfg.get("format") != "comsim.baseline/1" or cfg.get("kind") not in KINDS:
        raise ValueError(f"{path}: field 'format'/'kind' is {cfg.get('format')!r}/{cfg.get('kind')!r}, expected "
                         f"'comsim.baseline/1' and one of {KINDS}")
    t = load_file(str(folder / TENSORS_NAME))
    b = Baseline(cfg["kind"], cfg["camera"], tuple(cfg["resolution"]), global_map=t["global_map"],
                 plate_shift_px=tuple(cfg.get("plate_shift_px", (0.0, 0.0))), fit_info=cfg.get("fit", {}))
    if b.kind == "compositor":
        b.label_maps, b.label_seen = t["label_maps"], t["label_seen"].astype(bool)
        b.plate, b.plate_valid = t["plate"], t["plate_valid"].astype(bool)
    return b


# ---------------------------------------------------------------- fitting


def fit_baselines(pairs, camera: str, resolution: tuple[int, int] | None = None,
                  plate_frames: int = PLATE_FRAMES) -> dict[str, Baseline]:
    """All three baselines from training pairs: ``pairs`` yields (real, sim, seg) uint8 videos (T, H, W, 3)
    (seg: the twin's palette labels) or (real, sim, seg, camera_shift (T, 2) px), e.g.
    ``training_pairs(dataset, camera, episodes)``.
    ``resolution``: (H, W) to fit and render at (default: the first pair's)."""
    normal = _NormalEquations(MAX_LABELS + 1)  # the last row: every pixel (the global map)
    reals, labels_kept, shifts_kept, n_frames = [], [], [], 0
    pairs = list(pairs)
    if not pairs:
        raise ValueError("fit_baselines: no training pairs")
    total = sum(len(p[0]) for p in pairs)
    stride = max(1, int(np.ceil(total / plate_frames)))
    for real, sim, seg, *shift in pairs:
        shift = np.asarray(shift[0], np.float64) if shift and shift[0] is not None else np.zeros((len(real), 2))
        res = tuple(resolution or real.shape[1:3])
        real, sim = resize_frames(real, res), resize_frames(sim, res)
        labels = labels_from_palette(seg, res)
        normal.add(MAX_LABELS, sim, real)
        for lab in np.unique(labels):
            if lab < MAX_LABELS:
                m = labels == lab
                normal.add(int(lab), sim[m], real[m])
        keep = [k for k in range(len(real)) if (n_frames + k) % stride == 0]
        reals.append(real[keep])
        labels_kept.append(labels[keep])
        shifts_kept.append(shift[keep])
        n_frames += len(real)
        resolution = res
    global_map = normal.solve(MAX_LABELS)
    seen = normal.count[:MAX_LABELS] > 0
    label_maps = np.stack([normal.solve(i) if seen[i] else global_map for i in range(MAX_LABELS)])
    real_kept, lab_kept = np.concatenate(reals), np.concatenate(labels_kept)
    plate, valid = background_plate(real_kept, lab_kept == BACKGROUND)
    info = {"frames": int(n_frames), "episodes": len(pairs), "plate_frames": int(len(real_kept)),
            "plate_coverage": round(float(valid.mean()), 4),
            "label_pixels": {int(i): int(normal.count[i]) for i in range(MAX_LABELS) if seen[i]},
            # the twin's objects: labels >= 2 seen on average in OBJECT_MIN_PIXELS a frame (a label decoded
            # from a few codec-blended edge pixels is not one)
            "object_labels": [i for i in range(2, MAX_LABELS) if normal.count[i] >= OBJECT_MIN_PIXELS * n_frames]}
    res = tuple(int(v) for v in resolution)
    return {"raw": Baseline("raw", camera, res, fit_info=info),
            "global_color": Baseline("global_color", camera, res, global_map=global_map, fit_info=info),
            "compositor": Baseline("compositor", camera, res, global_map=global_map, label_maps=label_maps,
                                   label_seen=seen, plate=plate, plate_valid=valid,
                                   plate_shift_px=tuple(float(v) for v in np.concatenate(shifts_kept).mean(0)),
                                   fit_info=info)}


def background_plate(real: np.ndarray, background: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel median of ``real`` (T, H, W, 3) over the frames where ``background`` (T, H, W) holds:
    (plate uint8 (H, W, 3), valid (H, W) bool: at least one such frame)."""
    import warnings

    x = real.astype(np.float32)
    x[~background] = np.nan
    valid = background.any(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: pixels never seen as backdrop
        med = np.nanmedian(x, axis=0)
    plate = np.where(valid[..., None], np.nan_to_num(med), 0)
    return np.clip(plate + 0.5, 0, 255).astype(np.uint8), valid


def training_pairs(dataset, camera: str, episodes):
    """(real, sim, seg, camera_shift) of ``episodes`` of a paired LeRobot dataset (path or LeRobotDataset):
    the videos, and the camera's shift per frame as the twin rendered it (``camera_shifts``; 0 if it did not move)."""
    from comsim.io.lerobot import LeRobotDataset
    from comsim.translator.data import camera_shifts

    ds = dataset if isinstance(dataset, LeRobotDataset) else LeRobotDataset(dataset)
    shifts = camera_shifts(ds.root)
    keys = [camera, sim_key(camera), seg_key(camera)]
    missing = [k for k in keys if k not in ds.camera_keys]
    if missing:
        raise ValueError(f"{ds.root}: the baselines need the videos {keys}; missing {missing}")
    for e in episodes:
        ep = ds.read_episode(e, cameras=keys)
        yield ep.frames[camera], ep.frames[sim_key(camera)], ep.frames[seg_key(camera)], shifts.get(e)


def fit_baseline(kind: str, dataset, camera: str, episodes, resolution: tuple[int, int] | None = None) -> Baseline:
    """One baseline (``kind`` in KINDS) fit on ``episodes`` of a paired dataset."""
    if kind not in KINDS:
        raise ValueError(f"baseline kind {kind!r}: expected one of {KINDS}")
    return fit_baselines(training_pairs(dataset, camera, episodes), camera, resolution)[kind]
