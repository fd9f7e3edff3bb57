"""LeRobotDataset v3.0 on disk: a crash-safe, resumable writer and a reader (v3.0 and v2.1).

Layout written (the LeRobot v3.0 one, so LeRobot can train on it directly):

    meta/info.json                       features, fps, counts, path templates
    meta/stats.json                      min/max/mean/std/count per feature
    meta/tasks.parquet                   task string (index "task") -> task_index
    meta/episodes/chunk-000/file-000.parquet
                                         one row per episode: length, tasks, where its rows
                                         and video frames live, + our success / provenance
    data/chunk-XXX/file-YYY.parquet      frames of `episodes_per_file` episodes,
                                         one parquet row group per episode
    videos/observation.images.<cam>/chunk-XXX/file-YYY.mp4
                                         the same episodes back to back; episode e starts
                                         at `videos/<key>/from_timestamp` of its row

How writing stays crash-safe: `add_episode` encodes one episode into a hidden temporary
folder and renames it to `.staging/episode_XXXXXX/` (a rename is atomic: the episode is
either fully there or not at all). `close()` joins the staged episodes, sorted by index,
into the multi-episode files (videos are remuxed, not re-encoded), writes every file under
a temporary name then renames it, writes `meta/info.json` last, and removes `.staging/`.
Reopening with `resume=True` sees what is finished; several processes may stage
episodes into one root at once (`add_episode(ep, episode_index=k)`), one `close()` joins
them. Files contain no wall-clock data and encoding is single-threaded, so the same
episodes give byte-identical files however the writing was interrupted or split.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from comsim.episode import Episode, Provenance
from comsim.errors import ComSimError, InputError
from comsim.io.files import atomic_output, out_of_space_is, write_json
from comsim.io.lock import is_lock_file
from comsim.io import paths
from comsim.io.video import (DEFAULT_CRF, DEFAULT_GOP, PIX_FMTS, concat_videos, read_video,
                             video_info, write_video)

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNKS_SIZE = 1000  # files per chunk folder (LeRobot's default)
IMAGE_PREFIX = "observation.images."
STAGING = ".staging"
# Columns every LeRobot frame has; the writer fills them in.
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
IMAGE_STATS_FRAMES = 10  # frames per episode sampled for the image statistics


def dataset_complete(root: str | Path) -> bool:
    """True when ``root`` holds a finished dataset: ``close()`` writes meta/info.json last, so its
    presence says every episode and file before it is complete."""
    return (Path(root) / "meta" / "info.json").is_file()


_FINGERPRINTS: dict[tuple, str] = {}


def dataset_fingerprint(root: str | Path) -> str:
    """sha256 of a finished dataset's content (every file under meta/, data/ and videos/, with its relative
    path): two folders with the same fingerprint hold the same episodes, whatever their path or age. Cached
    per process on (path, info.json's size and modification time)."""
    root = Path(root)
    info = root / "meta" / "info.json"
    if not info.is_file():
        raise DatasetError(f"{root}: not a finished LeRobot dataset (no meta/info.json)")
    st = info.stat()
    key = (str(root.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FINGERPRINTS:
        h = hashlib.sha256()
        for part in ("meta", "data", "videos"):
            for p in sorted((root / part).rglob("*")):
                if p.is_file() and not p.name.startswith("."):
                    h.update(p.relative_to(root).as_posix().encode() + b"\0")
                    with open(p, "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):
                            h.update(block)
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


class DatasetError(ComSimError, ValueError):
    """A dataset on disk (or an episode written to it) is not what the format says."""


def safe_name(name, file, field) -> str:
    try:
        return paths.safe_name(name, file, field)
    except InputError as e:
        raise DatasetError(str(e)) from None


def contained(root, relative, file, field) -> Path:
    try:
        return paths.contained(root, relative, file, field)
    except InputError as e:
        raise DatasetError(str(e)) from None


# ----------------------------------------------------------------------------- columns


def _to_arrow(x: np.ndarray) -> pa.Array:
    """(T,) -> plain column; (T, d1, d2, ...) -> nested fixed-size lists (LeRobot's layout)."""
    x = np.ascontiguousarray(x)
    arr = pa.array(x.reshape(-1))
    for d in reversed(x.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, d)
    return arr


def _from_arrow(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    n, shape = len(col), []
    while pa.types.is_fixed_size_list(col.type):
        shape.append(col.type.list_size)
        col = col.flatten()  # respects slicing, unlike .values
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):  # variable lists (foreign files)
        return np.array(col.to_pylist())
    return col.to_numpy(zero_copy_only=False).reshape(n, *shape)


def _episode_columns(ep: Episode) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """The per-frame arrays of an episode under their feature keys, and their feature specs."""
    cols = {"action": ep.action, "observation.state": ep.state}
    for key in sorted(ep.extra):
        v = np.asarray(ep.extra[key])
        if key in cols or key in DEFAULT_FEATURES or key.startswith(IMAGE_PREFIX) or "/" in key:
            raise DatasetError(f"Episode.extra[{key!r}]: name clashes with a standard feature or contains '/'")
        if v.dtype.kind not in "biuf":
            raise DatasetError(f"Episode.extra[{key!r}]: only numeric/bool arrays can be stored, got {v.dtype}")
        cols[key] = v
    feats = {k: {"dtype": str(v.dtype), "shape": list(v.shape[1:]) or [1], "names": None} for k, v in cols.items()}
    for cam in sorted(ep.frames):
        _, H, W, _ = ep.frames[cam].shape
        safe_name(IMAGE_PREFIX + cam, None, "Episode.frames (camera name, used as a file name)")
        feats[IMAGE_PREFIX + cam] = {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]}
    return cols, feats


def _check_features(expected: dict, got: dict, where: str) -> None:
    for key in expected:
        if key not in got:
            raise DatasetError(f"{where}: missing field {key!r} (the dataset has it, dtype "
                               f"{expected[key]['dtype']}, shape {tuple(expected[key]['shape'])})")
    for key, g in got.items():
        if key not in expected:
            raise DatasetError(f"{where}: field {key!r} is not one of the dataset's features {sorted(expected)}")
        e = expected[key]
        if g["dtype"] != e["dtype"] or list(g["shape"]) != list(e["shape"]):
            raise DatasetError(f"{where}: field {key!r} has dtype {g['dtype']} shape {tuple(g['shape'])}, "
                               f"expected dtype {e['dtype']} shape {tuple(e['shape'])}")


class _Stats:
    """min/max/mean/std over rows, mergeable across episodes in a fixed order (Chan et al.)."""

    def __init__(self, d: dict | None = None):
        d = d or {}
        self.n, self.count = d.get("n", 0), d.get("count", 0)
        self.mean, self.m2, self.min, self.max = (
            np.asarray(d[k], np.float64) if k in d else None for k in ("mean", "m2", "min", "max"))

    def update(self, x: np.ndarray, count: int | None = None) -> "_Stats":
        x = np.asarray(x, np.float64)
        mean = x.mean(0)
        other = _Stats({"n": len(x), "count": len(x) if count is None else count, "mean": mean,
                        "m2": ((x - mean) ** 2).sum(0), "min": x.min(0), "max": x.max(0)})
        return self.merge(other)

    def merge(self, o: "_Stats") -> "_Stats":
        if self.n == 0:
            self.__dict__.update(o.__dict__)
            return self
        n = self.n + o.n
        delta = o.mean - self.mean
        self.mean = self.mean + delta * (o.n / n)
        self.m2 = self.m2 + o.m2 + delta**2 * (self.n * o.n / n)
        self.min, self.max = np.minimum(self.min, o.min), np.maximum(self.max, o.max)
        self.n, self.count = n, self.count + o.count
        return self

    def state(self) -> dict:
        arrays = {k: getattr(self, k).tolist() for k in ("mean", "m2", "min", "max")}
        return {"n": self.n, "count": self.count, **arrays}

    def to_json(self, shape: tuple) -> dict:
        out = {"min": self.min, "max": self.max, "mean": self.mean, "std": np.sqrt(self.m2 / self.n)}
        out = {k: v.reshape(shape).tolist() for k, v in out.items()}
        return {**out, "count": [self.count]}


def _image_stats(frames: np.ndarray) -> _Stats:
    """Per-channel stats in [0, 1] over up to IMAGE_STATS_FRAMES evenly spaced frames."""
    pick = np.unique(np.linspace(0, len(frames) - 1, min(IMAGE_STATS_FRAMES, len(frames))).round().astype(int))
    return _Stats().update(frames[pick].reshape(-1, 3) / 255.0, count=len(pick))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_parquet(table: pa.Table, path: Path) -> None:
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp, compression="snappy")


# ----------------------------------------------------------------------------- writer


def _staged(root: Path) -> dict[int, Path]:
    staging = root / STAGING
    if not staging.is_dir():
        return {}
    return {int(p.name.split("_")[1]): p for p in staging.iterdir() if p.is_dir() and p.name.startswith("episode_")}


def _consolidated(root: Path) -> set[int]:
    info = root / "meta" / "info.json"
    return set(range(json.loads(info.read_text())["total_episodes"])) if info.is_file() else set()


def finished_episodes(root: str | Path) -> set[int]:
    """Episode indices safely on disk in ``root`` (staged, or in the closed dataset); touches nothing."""
    return set(_staged(Path(root))) | _consolidated(Path(root))


def check_resumable(root: str | Path, episodes: int, verb: str) -> None:
    """A run of ``episodes`` episodes may resume in ``root``: a closed dataset there has that many, and no
    episode beyond them is staged. Otherwise OutputFolderError (checked before the run writes anything)."""
    root = Path(root)
    done = _consolidated(root)
    if done and len(done) != episodes:
        raise paths.OutputFolderError(f"{root}: holds a finished dataset of {len(done)} episodes, asked for "
                                      f"{episodes}; appending is not supported, {verb} into a new folder")
    beyond = sorted(i for i in _staged(root) if i >= episodes)
    if beyond:
        raise paths.OutputFolderError(f"{root}: episodes {beyond} are already staged but --episodes is {episodes}; "
                                      f"rerun with --episodes {max(beyond) + 1} or use a new folder")


class DatasetWriter:
    """Write Episodes as a LeRobot v3.0 dataset; see the module docstring for the guarantees.

    ``fps`` must be a whole number (LeRobot stores it as an int and looks video frames up
    at ``timestamp = frame_index / fps``). The first episode fixes the features (action and
    state sizes, camera names and sizes, extra arrays); later ones must match.
    """

    def __init__(self, root: str | Path, fps: float, robot_type: str | None = "panda",
                 episodes_per_file: int = 50, resume: bool = False, crf: int = DEFAULT_CRF,
                 gop: int = DEFAULT_GOP, pix_fmt: str = "yuv420p", chunks_size: int = CHUNKS_SIZE):
        self.root = Path(root)
        if not float(fps).is_integer() or fps <= 0:
            raise DatasetError(f"{self.root}: fps must be a positive whole number for LeRobot, got {fps}")
        if pix_fmt not in PIX_FMTS:
            raise DatasetError(f"{self.root}: pix_fmt must be one of {PIX_FMTS}, got {pix_fmt!r}")
        if episodes_per_file < 1:
            raise DatasetError(f"{self.root}: episodes_per_file must be >= 1, got {episodes_per_file}")
        self.fps, self.robot_type = int(fps), robot_type
        self.episodes_per_file, self.chunks_size = episodes_per_file, chunks_size
        self.crf, self.gop, self.pix_fmt = crf, gop, pix_fmt
        self.staging = self.root / STAGING
        self.features: dict | None = None  # fixed by the first episode (or by staged ones)
        self._closed = False
        if not resume and self.root.exists() and any(not is_lock_file(p.name) for p in self.root.iterdir()):
            raise DatasetError(f"{self.root}: folder is not empty (a dataset or a partial one is there); "
                               "pass resume=True to continue it, or choose an empty folder")
        self.root.mkdir(parents=True, exist_ok=True)
        contained(self.root, STAGING, self.root, "staging folder")  # a symlinked .staging would write elsewhere

    # -- what is on disk
    def _staged(self) -> dict[int, Path]:
        return _staged(self.root)

    def _consolidated(self) -> set[int]:
        return _consolidated(self.root)

    @property
    def finished_episodes(self) -> set[int]:
        """Episode indices that are safely on disk (staged or already consolidated)."""
        return finished_episodes(self.root)

    # -- writing
    def add_episode(self, ep: Episode, episode_index: int | None = None) -> int:
        """Stage one episode atomically; returns its index. Parallel writers pass ``episode_index``."""
        if self._closed:
            raise DatasetError(f"{self.root}: writer is closed")
        done = self.finished_episodes
        idx = max(done, default=-1) + 1 if episode_index is None else int(episode_index)
        where = f"{self.root}: episode {idx}"
        if idx < 0:
            raise DatasetError(f"{where}: episode_index must be >= 0")
        if idx in done:
            raise DatasetError(f"{where} is already written (see finished_episodes)")
        if self._consolidated():
            raise DatasetError(f"{self.root}: the dataset is already closed; appending episodes to a closed "
                               "dataset is not supported, write them to a new folder")
        ep.validate()
        if abs(ep.fps - self.fps) > 1e-6:
            raise DatasetError(f"{where}: field 'fps' is {ep.fps}, expected {self.fps}")
        T = len(ep)
        if T == 0:
            raise DatasetError(f"{where}: episode has no frames")
        expected_t = np.arange(T) / self.fps
        if np.abs(ep.timestamps.astype(np.float64) - expected_t).max() > 1e-4:
            raise DatasetError(f"{where}: field 'timestamp' must be frame_index / fps (LeRobot finds video "
                               "frames by timestamp); resample the episode to a constant rate first")
        cols, feats = _episode_columns(ep)
        for key, v in cols.items():  # a NaN target or state would train and replay into garbage
            if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                bad = np.nonzero(~np.isfinite(v.reshape(T, -1)).all(1))[0]
                raise DatasetError(f"{where}: field {key!r}: expected finite numbers, got NaN/inf at frames "
                                   f"{bad[:5].tolist()}{'...' if len(bad) > 5 else ''}")
        if self.features is None:
            staged = self._staged()
            if staged:
                self.features = json.loads((staged[min(staged)] / "meta.json").read_text())["features"]
        if self.features is not None:
            _check_features(self.features, feats, where)
        for cam, f in ep.frames.items():
            if f.shape[1] % 2 or f.shape[2] % 2:
                raise DatasetError(f"{where}: field {IMAGE_PREFIX + cam!r} has frames of {f.shape[1]}x{f.shape[2]}; "
                                   "H.264 needs an even height and width (crop or pad by one pixel)")

        # Everything goes to a hidden temporary folder first; the rename below publishes it.
        tmp = self.staging / f".tmp-episode_{idx:06d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with out_of_space_is(f"{where}: staging it"):
                self._stage(ep, idx, T, cols, feats, tmp, where)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        if self.features is None:
            self.features = feats
        return idx

    def _stage(self, ep: Episode, idx: int, T: int, cols: dict, feats: dict, tmp: Path, where: str) -> None:
        """Write episode ``idx`` into the hidden folder ``tmp``, then rename it into ``.staging``."""
        tmp.mkdir(parents=True)  # also creates .staging/
        arrays = {k: _to_arrow(v) for k, v in cols.items()}
        arrays["timestamp"] = pa.array((np.arange(T) / self.fps).astype(np.float32))
        arrays["frame_index"] = pa.array(np.arange(T, dtype=np.int64))
        pq.write_table(pa.table(arrays), tmp / "data.parquet", compression="snappy")
        image_stats = {}
        for cam in sorted(ep.frames):
            key = IMAGE_PREFIX + cam
            write_video(tmp / f"{key}.mp4", ep.frames[cam], self.fps, crf=self.crf, gop=self.gop,
                        pix_fmt=self.pix_fmt)
            image_stats[key] = _image_stats(ep.frames[cam]).state()
        meta = {"episode_index": idx, "length": T, "fps": self.fps, "task": ep.task or ep.provenance.task,
                "success": None if ep.success is None else bool(ep.success),
                "provenance": ep.provenance.to_dict(), "features": feats, "image_stats": image_stats}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        for p in tmp.iterdir():
            _fsync(p)
        try:
            os.rename(tmp, self.staging / f"episode_{idx:06d}")
        except OSError as e:  # another process staged the same index meanwhile
            raise DatasetError(f"{where} was staged concurrently by another writer") from e
        _fsync(self.staging)

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On an exception the staged episodes stay for resume=True; nothing half-made is published.
        if exc_type is None:
            self.close()

    def close(self) -> None:
        """Join all staged episodes (from every process) into the v3.0 files. Run it once,
        after all writers have finished adding episodes. On a full disk the staged episodes stay
        (and no meta/info.json is written): a later close() with space finishes the job."""
        with out_of_space_is(f"{self.root}: joining the staged episodes"):
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        staged = self._staged()
        if self._consolidated():  # closed before (maybe crashed while cleaning up)
            new = sorted(set(staged) - self._consolidated())
            if new:
                raise DatasetError(f"{self.root}: episodes {new} were staged after the dataset was closed; "
                                   "appending to a closed dataset is not supported")
            shutil.rmtree(self.staging, ignore_errors=True)
            self._closed = True
            return
        if not staged:
            self._closed = True
            return
        for folder in ("data", "videos", "meta"):  # temporaries of a close() that was killed
            for p in (self.root / folder).glob("**/.*.tmp-*"):
                p.unlink()
        indices = sorted(staged)
        missing = sorted(set(range(indices[-1] + 1)) - set(indices))
        if missing:
            raise DatasetError(f"{self.root}: episodes {missing} are missing; LeRobot needs episodes 0..N-1 "
                               f"(staged: {indices}). Write them (resume=True), then close again")
        metas = [json.loads((staged[i] / "meta.json").read_text()) for i in indices]
        features = metas[0]["features"]
        for m in metas:
            _check_features(features, m["features"], f"{staged[m['episode_index']]}")
            if m["fps"] != self.fps:
                raise DatasetError(f"{staged[m['episode_index']]}: field 'fps' is {m['fps']}, expected {self.fps}")
        video_keys = [k for k, f in features.items() if f["dtype"] == "video"]
        tasks = list(dict.fromkeys(m["task"] for m in metas))  # order of first appearance
        task_index = {t: i for i, t in enumerate(tasks)}

        rows: list[dict] = []
        stats: dict[str, _Stats] = {}
        index = 0
        starts = range(0, len(indices), self.episodes_per_file)
        for g in tqdm(starts, desc=f"consolidating {self.root.name}", unit="file", disable=len(starts) < 4):
            group = indices[g: g + self.episodes_per_file]
            chunk_i, file_i = divmod(g // self.episodes_per_file, self.chunks_size)
            loc = {"chunk_index": chunk_i, "file_index": file_i}
            # Data: one row group per episode, so a reader can fetch one episode cheaply.
            with atomic_output(self._out(DATA_PATH.format(**loc))) as tmp:
                writer = None
                for i in group:
                    m = metas[i]
                    L = m["length"]
                    t = pq.read_table(staged[i] / "data.parquet")
                    if t.num_rows != L:
                        raise DatasetError(f"{staged[i] / 'data.parquet'}: {t.num_rows} rows, expected {L}")
                    t = (t.append_column("episode_index", pa.array(np.full(L, i, np.int64)))
                          .append_column("index", pa.array(np.arange(index, index + L, dtype=np.int64)))
                          .append_column("task_index", pa.array(np.full(L, task_index[m["task"]], np.int64))))
                    t = t.select([k for k in features if k not in video_keys] + list(DEFAULT_FEATURES))
                    for name in t.column_names:
                        x = _from_arrow(t[name])
                        stats.setdefault(name, _Stats()).update(x.reshape(L, -1))
                    writer = writer or pq.ParquetWriter(tmp, t.schema, compression="snappy")
                    writer.write_table(t)
                    rows.append({"episode_index": i, "tasks": [m["task"]], "length": L,
                                 "data/chunk_index": chunk_i, "data/file_index": file_i,
                                 "dataset_from_index": index, "dataset_to_index": index + L})
                    index += L
                writer.close()
            # Videos: the staged mp4s back to back, packets copied (no second generation loss).
            for key in video_keys:
                files = [staged[i] / f"{key}.mp4" for i in group]
                counts = concat_videos(files, self._out(VIDEO_PATH.format(video_key=key, **loc)), self.fps)
                start = 0
                for i, f, n in zip(group, files, counts):
                    if n != metas[i]["length"]:
                        raise DatasetError(f"{f}: {n} video frames, expected {metas[i]['length']}")
                    rows[i].update({f"videos/{key}/chunk_index": chunk_i, f"videos/{key}/file_index": file_i,
                                    f"videos/{key}/from_timestamp": start / self.fps,
                                    f"videos/{key}/to_timestamp": (start + n) / self.fps})
                    start += n
        for r, m in zip(rows, metas):
            r.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, "success": m["success"],
                      "provenance": json.dumps(m["provenance"], sort_keys=True, default=str)})
            for key in video_keys:
                stats.setdefault(key, _Stats()).merge(_Stats(m["image_stats"][key]))

        # Metadata; info.json goes last: a dataset without it is not a dataset.
        meta = self.root / "meta"
        _write_parquet(pa.Table.from_pylist(rows, schema=self._episodes_schema(video_keys)),
                       self._out(EPISODES_PATH.format(chunk_index=0, file_index=0)))
        tasks_df = pd.DataFrame({"task_index": np.arange(len(tasks), dtype=np.int64)},
                                index=pd.Index(tasks, name="task"))
        _write_parquet(pa.Table.from_pandas(tasks_df), meta / "tasks.parquet")
        all_features = {**features, **DEFAULT_FEATURES}
        stats_json = {k: s.to_json((3, 1, 1) if k in video_keys else tuple(all_features[k]["shape"]))
                      for k, s in stats.items()}
        write_json(stats_json, meta / "stats.json", indent=4)
        write_json(self._info(features, video_keys, len(indices), index, len(tasks)), meta / "info.json", indent=4)
        shutil.rmtree(self.staging)
        self._closed = True

    def _out(self, relative: str) -> Path:
        # Feature keys name folders: a symlinked folder must not carry the files out of the dataset.
        return contained(self.root, relative, self.root, "output file")

    @staticmethod
    def _episodes_schema(video_keys: list[str]) -> pa.Schema:
        i64, f64 = pa.int64(), pa.float64()
        fields = [("episode_index", i64), ("tasks", pa.list_(pa.string())), ("length", i64),
                  ("data/chunk_index", i64), ("data/file_index", i64),
                  ("dataset_from_index", i64), ("dataset_to_index", i64)]
        for key in video_keys:
            fields += [(f"videos/{key}/chunk_index", i64), (f"videos/{key}/file_index", i64),
                       (f"videos/{key}/from_timestamp", f64), (f"videos/{key}/to_timestamp", f64)]
        fields += [("meta/episodes/chunk_index", i64), ("meta/episodes/file_index", i64),
                   ("success", pa.bool_()), ("provenance", pa.string())]
        return pa.schema(fields)

    def _info(self, features: dict, video_keys: list[str], n_episodes: int, n_frames: int, n_tasks: int) -> dict:
        features = json.loads(json.dumps(features))
        for key in video_keys:
            H, W, _ = features[key]["shape"]
            features[key]["info"] = {"video.height": H, "video.width": W, "video.codec": "h264",
                                     "video.pix_fmt": self.pix_fmt, "video.is_depth_map": False,
                                     "video.fps": self.fps, "video.channels": 3, "has_audio": False}
        return {
            "codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
            "total_episodes": n_episodes, "total_frames": n_frames, "total_tasks": n_tasks,
            "chunks_size": self.chunks_size, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
            "fps": self.fps, "splits": {"train": f"0:{n_episodes}"},
            "data_path": DATA_PATH, "video_path": VIDEO_PATH if video_keys else None,
            "features": {**features, **DEFAULT_FEATURES},
        }


def write_dataset(root: str | Path, episodes, fps: float, resume: bool = False, **kwargs) -> Path:
    """Write an iterable of Episodes (index = position) and close. With ``resume=True``,
    positions already finished are skipped."""
    with DatasetWriter(root, fps, resume=resume, **kwargs) as w:
        done = w.finished_episodes
        for i, ep in enumerate(episodes):
            if i not in done:
                w.add_episode(ep, episode_index=i)
    return Path(root)


# ----------------------------------------------------------------------------- reader



def _open_parquet(path: Path, opener, episodes: str):
    """``opener(path)`` (pq.read_metadata, pq.ParquetFile); a missing or unreadable file is a DatasetError naming
    it and the ``episodes`` it holds."""
    if not path.is_file():
        raise DatasetError(f"{path}: data file not found ({episodes})")
    try:
        return opener(path)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]})") from None

class LeRobotDataset:
    """Read a LeRobot dataset (v3.0, or v2.0/v2.1) one episode or window at a time.

    ``ds[i]`` is episode ``i`` (LeRobot's own class indexes frames). Only the rows and video
    frames asked for are read: the parquet row groups that hold them and the video from the
    keyframe before the window. ``default_source`` is the
    provenance source given to episodes that carry no provenance (datasets not written
    by comsim).
    """

    def __init__(self, root: str | Path, default_source: str = "real"):
        self.root = Path(root)
        info_path = self.root / "meta" / "info.json"
        if not info_path.is_file():
            raise DatasetError(f"{info_path}: file not found (not a LeRobot dataset, or its writer never closed)")
        try:
            self.info = json.loads(info_path.read_text())
            self.fps = self.info["fps"]
            self.features = self.info["features"]
            self.version = self.info["codebase_version"]
            bad = [k for k, f in self.features.items() if not isinstance(f, dict) or "dtype" not in f]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise DatasetError(f"{info_path}: not a valid LeRobot info.json ({e!r})") from e
        if bad:
            raise DatasetError(f"{info_path}: features {bad}: expected a mapping with a 'dtype'")
        if isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not 0 < self.fps < 10_000:
            raise DatasetError(f"{info_path}: fps: expected a positive number of frames/s, got {self.fps!r}")
        if not isinstance(self.version, str):
            raise DatasetError(f"{info_path}: codebase_version: expected a string like 'v3.0', got {self.version!r}")
        self.default_source = default_source
        for key, f in self.features.items():
            if f["dtype"] == "video":  # video keys become folder and file names
                safe_name(key, info_path, f"features[{key!r}]")
                vfps = (f.get("info") or {}).get("video.fps") if isinstance(f.get("info"), dict) else None
                if isinstance(vfps, (int, float)) and abs(vfps - self.fps) > 1e-6:  # else: a frame-count puzzle later
                    raise DatasetError(f"{info_path}: fps: expected the videos' rate {vfps} (features[{key!r}]."
                                       f"info.video.fps), got {self.fps}")
            if f["dtype"] == "image":
                raise DatasetError(f"{info_path}: feature {key!r} stores images inside parquet (dtype 'image'); "
                                   "only mp4 video features are supported")
        self._video_keys = {(k[len(IMAGE_PREFIX):] if k.startswith(IMAGE_PREFIX) else k): k
                            for k, f in self.features.items() if f["dtype"] == "video"}
        self.camera_keys = list(self._video_keys)
        if self.version.startswith("v3"):
            self._episodes = self._load_v3()
        elif self.version in ("v2.0", "v2.1"):
            self._episodes = self._load_v2()
        else:
            raise DatasetError(f"{info_path}: codebase_version {self.version!r} is not supported (v2.x, v3.x)")
        self.num_frames = sum(e["length"] for e in self._episodes)

    # -- index loading: every file named by the index must exist and agree with it
    def _load_v3(self) -> list[dict]:
        ep_dir = self.root / "meta" / "episodes"
        files = sorted(ep_dir.glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.root / EPISODES_PATH.format(chunk_index=0, file_index=0)}: file not found "
                               "(the episodes index of a v3.0 dataset)")
        tables = []
        for f in files:
            try:
                cols = [c for c in pq.read_schema(f).names if not c.startswith("stats/")]
                tables.append(pq.read_table(f, columns=cols))
            except (pa.ArrowException, OSError) as e:
                raise DatasetError(f"{f}: not a readable parquet file ({str(e).splitlines()[0]})") from None
        try:
            table = pa.concat_tables(tables, promote_options="default")
        except pa.ArrowException as e:
            raise DatasetError(f"{ep_dir}: episodes index files do not agree ({str(e).splitlines()[0]})") from None
        required = ["episode_index", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index",
                    "data/file_index"] + [f"videos/{k}/{c}" for k in self._video_keys.values()
                                          for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        missing = [c for c in required if c not in table.column_names]
        if missing:
            raise DatasetError(f"{ep_dir}: episodes index lacks column(s) {missing}")
        rows = table.to_pylist()
        rows.sort(key=lambda r: r["episode_index"])
        self._check_index(rows, ep_dir)
        by_file: dict[Path, list[dict]] = {}
        for r in rows:
            r["data_path"] = self._path("data_path", chunk_index=r["data/chunk_index"],
                                        file_index=r["data/file_index"])
            by_file.setdefault(r["data_path"], []).append(r)
            r["videos"] = {}
            for key in self._video_keys.values():
                path = self._path("video_path", video_key=key, chunk_index=r[f"videos/{key}/chunk_index"],
                                  file_index=r[f"videos/{key}/file_index"])
                start = round(r[f"videos/{key}/from_timestamp"] * self.fps)
                n = round(r[f"videos/{key}/to_timestamp"] * self.fps) - start
                if n != r["length"]:
                    raise DatasetError(f"{ep_dir}: episode {r['episode_index']} spans {n} frames of {path} "
                                       f"(from/to_timestamp) but has length {r['length']}")
                r["videos"][key] = (path, start)
        for path, eps in by_file.items():
            meta = _open_parquet(path, pq.read_metadata, f"episodes {[e['episode_index'] for e in eps]}")
            rows_in_file = meta.num_rows
            self._check_columns(path, meta.schema.to_arrow_schema())
            expected = sum(e["length"] for e in eps)
            if rows_in_file != expected:
                raise DatasetError(f"{path}: {rows_in_file} rows, but the episodes index puts "
                                   f"{expected} frames in it (episodes {[e['episode_index'] for e in eps]})")
            first = min(e["dataset_from_index"] for e in eps)
            for e in eps:
                e["data_row"] = e["dataset_from_index"] - first
        needed: dict[Path, int] = {}
        for r in rows:
            for path, start in r["videos"].values():
                needed[path] = max(needed.get(path, 0), start + r["length"])
        for path, n in needed.items():
            if not path.is_file():
                raise DatasetError(f"{path}: video file not found")
            have = video_info(path)["num_frames"]
            if 0 < have < n:  # 0 = the container does not say; checked when decoding
                raise DatasetError(f"{path}: {have} video frames, but the episodes index needs {n}")
        self._video_frames_needed = needed
        return rows

    def _load_v2(self) -> list[dict]:
        ep_path = self.root / "meta" / "episodes.jsonl"
        if not ep_path.is_file():
            raise DatasetError(f"{ep_path}: file not found (the episodes index of a v2.x dataset)")
        try:
            rows = [json.loads(line) for line in ep_path.read_text().splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise DatasetError(f"{ep_path}: not valid JSON lines ({e})") from None
        rows.sort(key=lambda r: r["episode_index"])
        start = 0
        for r in rows:
            r["dataset_from_index"], r["dataset_to_index"] = start, start + r["length"]
            start += r["length"]
        self._check_index(rows, ep_path)
        chunks = self.info.get("chunks_size", CHUNKS_SIZE)
        for r in rows:
            e = r["episode_index"]
            r["data_path"] = self._path("data_path", episode_chunk=e // chunks, episode_index=e)
            r["data_row"] = None  # one file per episode: the whole file
            r["videos"] = {key: (self._path("video_path", episode_chunk=e // chunks, video_key=key, episode_index=e), 0)
                           for key in self._video_keys.values()}
            for path in [r["data_path"], *(p for p, _ in r["videos"].values())]:
                if not path.is_file():
                    raise DatasetError(f"{path}: file not found (episode {e})")
            try:
                self._check_columns(r["data_path"], pq.read_schema(r["data_path"]))
            except (pa.ArrowException, OSError) as err:
                raise DatasetError(f"{r['data_path']}: not a readable parquet file ({str(err).splitlines()[0]})") from None
        self._video_frames_needed = {p: r["length"] for r in rows for p, _ in r["videos"].values()}
        return rows

    def _check_columns(self, path: Path, schema: pa.Schema) -> None:
        """The data file holds each numeric feature of info.json with its number of values per frame, so a
        command that reads it all finds a mismatch when it opens the dataset, not half way through."""
        for key, f in self.features.items():
            if f["dtype"] in ("video", "image", "string") or key in DEFAULT_FEATURES:
                continue
            if key not in schema.names:
                raise DatasetError(f"{path}: no column {key!r}, which meta/info.json lists as a feature")
            t, n = schema.field(key).type, 1
            while pa.types.is_fixed_size_list(t):
                n, t = n * t.list_size, t.value_type
            if pa.types.is_list(t) or pa.types.is_large_list(t):  # variable lists (foreign files): sizes unknown here
                continue
            want = int(np.prod(f.get("shape") or [1]))
            if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) or n != want:
                raise DatasetError(f"{path}: column {key!r} holds {n} {t} value(s) per frame; meta/info.json says "
                                   f"dtype {f['dtype']} shape {f.get('shape')}")

    def _path(self, template: str, **fields) -> Path:
        """A file named by info.json's ``data_path`` / ``video_path`` template, kept inside the dataset."""
        info_path = self.root / "meta" / "info.json"
        t = self.info.get(template)
        if not isinstance(t, str):
            raise DatasetError(f"{info_path}: {template}: expected a path template string, got {t!r}")
        try:
            rel = t.format(**fields)
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise DatasetError(f"{info_path}: {template}: expected a template with fields {sorted(fields)}, "
                               f"got {t!r} ({e!r})") from None
        return contained(self.root, rel, info_path, template)

    def _check_index(self, rows: list[dict], where: Path) -> None:
        got = [r["episode_index"] for r in rows]
        if got != list(range(len(rows))):
            shown = f"{got[:10]}{'...' if len(got) > 10 else ''}"
            raise DatasetError(f"{where}: episode indices must be 0..N-1, got {shown}")
        if len(rows) != self.info.get("total_episodes", len(rows)):
            raise DatasetError(f"{where}: {len(rows)} episodes, but meta/info.json says {self.info['total_episodes']}")
        for r in rows:
            if r["dataset_to_index"] - r["dataset_from_index"] != r["length"]:
                raise DatasetError(f"{where}: episode {r['episode_index']} has length {r['length']} but "
                                   f"dataset_from/to_index {r['dataset_from_index']}..{r['dataset_to_index']}")

    # -- public API
    def __len__(self) -> int:
        return len(self._episodes)

    def __getitem__(self, i: int) -> Episode:
        return self.read_episode(i)

    def __repr__(self) -> str:
        return (f"LeRobotDataset({str(self.root)!r}, {self.version}, episodes={len(self)}, "
                f"frames={self.num_frames}, fps={self.fps}, cameras={self.camera_keys})")

    def episode_length(self, i: int) -> int:
        return self._row(i)["length"]

    def episode_info(self, i: int) -> dict:
        """Episode metadata without reading frames: tasks, length, success, provenance."""
        r = self._row(i)
        return {"episode_index": i, "length": r["length"], "tasks": list(r.get("tasks") or []),
                "success": r.get("success"), "provenance": self._provenance(r)}

    def read_episode(self, i: int, cameras: list[str] | None = None) -> Episode:
        return self.read_window(i, 0, self.episode_length(i), cameras)

    def read_columns(self, i: int, names: list[str]) -> dict[str, np.ndarray]:
        """Non-video columns of episode ``i`` (those of ``names`` the dataset has), no video decoded."""
        r = self._row(i)
        table = self._read_rows(r, 0, r["length"])
        return {n: _from_arrow(table[n]).reshape(r["length"], -1) for n in names if n in table.column_names}

    def check_finite(self, names: tuple[str, ...] = ("action", "observation.state")) -> None:
        """DatasetError naming the data file, field and frames when ``names`` hold NaN or inf."""
        for i in range(len(self)):
            for name, x in self.read_columns(i, list(names)).items():
                if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
                    bad = np.nonzero(~np.isfinite(x).all(1))[0]
                    raise DatasetError(f"{self._row(i)['data_path']}: episode {i}: field {name!r}: expected "
                                       f"finite numbers, got NaN/inf at frames {bad[:5].tolist()}")

    def video_location(self, i: int, camera: str) -> tuple[Path, int]:
        """Where episode ``i`` of ``camera`` (a short name or feature key) lies: its mp4 and its first frame there."""
        (cam,) = self._cameras([camera])
        path, first = self._row(i)["videos"][self._video_keys[cam]]
        return Path(path), int(first)
    def check_videos(self) -> None:
        """Decode every video file once: a file that is corrupt or ends early raises a DatasetError naming it
        (opening the dataset reads only the headers). Commands that will read every frame call it before
        they write anything."""
        from comsim.io.video import count_frames

        for path, n in self._video_frames_needed.items():
            have = count_frames(path)
            if have < n:
                raise DatasetError(f"{path}: {have} decodable video frames, but the episodes index needs {n} "
                                   "(the file is truncated or corrupt)")

    def read_window(self, i: int, start: int, length: int, cameras: list[str] | None = None) -> Episode:
        """Frames ``[start, start + length)`` of episode ``i`` as an Episode (timestamps kept
        relative to the episode start). ``cameras``: short names or feature keys; None = all."""
        r = self._row(i)
        if start < 0 or length < 1 or start + length > r["length"]:
            raise ValueError(f"{self.root}: window [{start}, {start + length}) is outside episode {i} "
                             f"(length {r['length']})")
        table = self._read_rows(r, start, length)
        cols = {name: _from_arrow(table[name]) for name in table.column_names}
        frames = {}
        for cam in self._cameras(cameras):
            path, first = r["videos"][self._video_keys[cam]]
            try:
                fr = read_video(path, first + start, length, fps=self.fps)
            except FileNotFoundError as e:
                raise DatasetError(str(e)) from e
            if len(fr) != length:
                raise DatasetError(f"{path}: episode {i} frames {start}..{start + length} needed, "
                                   f"the file ended after {len(fr)} of them")
            frames[cam] = fr
        action = cols.pop("action", np.zeros((length, 0), np.float32))
        state = cols.pop("observation.state", np.zeros((length, 0), np.float32))
        timestamps = cols.pop("timestamp", None)
        for k in ("frame_index", "episode_index", "index", "task_index"):
            cols.pop(k, None)
        prov = self._provenance(r)
        return Episode(frames=frames, action=action.reshape(length, -1), state=state.reshape(length, -1),
                       fps=float(self.fps), timestamps=timestamps, task=(r.get("tasks") or [""])[0],
                       success=r.get("success"),
                       provenance=prov, extra=cols)

    # -- helpers
    def _row(self, i: int) -> dict:
        if not 0 <= i < len(self._episodes):
            raise IndexError(f"{self.root}: episode {i} out of range (dataset has {len(self._episodes)})")
        return self._episodes[i]

    def _cameras(self, cameras: list[str] | None) -> list[str]:
        if cameras is None:
            return self.camera_keys
        names = []
        for c in cameras:
            name = c[len(IMAGE_PREFIX):] if c.startswith(IMAGE_PREFIX) and c not in self._video_keys else c
            if name not in self._video_keys:
                raise DatasetError(f"{self.root}: no camera {c!r}; cameras are {self.camera_keys}")
            names.append(name)
        return names

    def _provenance(self, r: dict) -> Provenance:
        task = (r.get("tasks") or [""])[0]
        if r.get("provenance"):
            return Provenance.from_dict(json.loads(r["provenance"]))
        return Provenance(source=self.default_source, task=task, extra={"provenance": "not recorded"})

    def _read_rows(self, r: dict, start: int, length: int) -> pa.Table:
        """The parquet rows of frames [start, start+length) of one episode, reading only
        the row groups that hold them."""
        path, i = r["data_path"], r["episode_index"]
        pf = _open_parquet(path, pq.ParquetFile, f"episode {i}")
        with pf:
            if r["data_row"] is None:  # v2: the file is the episode
                if pf.metadata.num_rows != r["length"]:
                    raise DatasetError(f"{path}: {pf.metadata.num_rows} rows, but episode {i} has length {r['length']}")
                first_row = start
            else:
                first_row = r["data_row"] + start
            groups, pos, group_start = [], 0, None
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if pos < first_row + length and pos + n > first_row:
                    groups.append(g)
                    group_start = pos if group_start is None else group_start
                pos += n
            try:
                table = pf.read_row_groups(groups).slice(first_row - group_start, length)
            except (pa.ArrowException, OSError) as e:
                raise DatasetError(f"{path}: episode {i}: parquet rows unreadable ({str(e).splitlines()[0]})") from None
        ok = table.num_rows == length
        if ok and "episode_index" in table.column_names:
            ok = bool(np.all(_from_arrow(table["episode_index"]) == i))
        if ok and "frame_index" in table.column_names:
            ok = bool(np.array_equal(_from_arrow(table["frame_index"]), np.arange(start, start + length)))
        if not ok:
            raise DatasetError(f"{path}: rows for episode {i} frames {start}..{start + length} are not where the "
                               "episodes index says (episode_index/frame_index columns disagree)")
        return table
