"""Random training windows read from a LeRobot dataset's mp4s: PyAV (what the library uses) against decord.

The same seeded windows (episode, start, 8 frames) are decoded by both readers from the same files;
reported: windows/s of each, and the largest difference between their frames (grey levels). PyAV opens
the file and seeks to the keyframe before each window (``comsim.io.video.read_video``); decord keeps one
``VideoReader`` per file open and calls ``get_batch``, its fastest use. decord is not a dependency
of ComSim (`pip install decord` to run the comparison; measured: docs/results/2026-12-06-house-refactor.md).

    MUJOCO_GL=egl .venv/bin/python bench/video_read.py                 # makes a 10-episode lab recording
    .venv/bin/python bench/video_read.py --dataset runs/demo/paired --windows 300

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from comsim.io.lerobot import LeRobotDataset
from comsim.io.video import read_video


def windows(ds: LeRobotDataset, n: int, length: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        e = int(rng.integers(len(ds)))
        out.append((e, int(rng.integers(ds.episode_length(e) - length + 1))))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=None, help="a LeRobot dataset (default: record 10 lab push episodes)")
    ap.add_argument("--camera", default=None, help="camera key (default: the dataset's first)")
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.dataset is None:
        from comsim.lab.record import record_dataset
        a.dataset = record_dataset("push", 10, Path(tempfile.mkdtemp(prefix="bench_video_")) / "lab", seed=0,
                                   calibration_stills=0)
    ds = LeRobotDataset(a.dataset)
    cam = a.camera or ds.camera_keys[0]
    todo = windows(ds, a.windows, a.length, a.seed)
    where = [ds.video_location(e, cam) for e, _ in todo]  # (mp4 path, the episode's first frame in it)

    t = time.perf_counter()
    pyav = [read_video(path, first + s, a.length, fps=ds.fps) for (path, first), (_, s) in zip(where, todo)]
    t_pyav = time.perf_counter() - t

    try:
        import decord
    except ImportError:
        result = {"bench": "video_read", "dataset": str(a.dataset), "camera": cam, "windows": a.windows,
                  "pyav_windows_per_s": round(a.windows / t_pyav, 1), "decord": "not installed (pip install decord)"}
        print(json.dumps(result))
        return result
    readers: dict[str, decord.VideoReader] = {}
    t = time.perf_counter()
    dec = []
    for (path, first), (_, s) in zip(where, todo):
        vr = readers.get(str(path)) or readers.setdefault(str(path), decord.VideoReader(str(path), ctx=decord.cpu(0),
                                                                                         num_threads=1))
        dec.append(vr.get_batch(list(range(first + s, first + s + a.length))).asnumpy())
    t_decord = time.perf_counter() - t
    diff = max(int(np.abs(x.astype(int) - y).max()) for x, y in zip(pyav, dec))
    result = {"bench": "video_read", "dataset": str(a.dataset), "camera": cam, "windows": a.windows,
              "frames_per_window": a.length, "pyav_windows_per_s": round(a.windows / t_pyav, 1),
              "decord_windows_per_s": round(a.windows / t_decord, 1),
              "decord_over_pyav": round(t_pyav / t_decord, 2), "max_frame_difference": diff}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
