"""Paired data for the translator from the lab: lab episodes replayed in the twin with the lab's TRUE camera.

    comsim lab pairs --out runs/lab_pairs [--push 20 --stack 10 --seed 0 --mode physics]

1. Records scripted lab episodes of each task into ``OUT/lab_<task>`` (``comsim.lab.record``; episode
   k of task j has the seed ``episode_seed(seed + j, k)``, so the same arguments give the same episodes).
2. Writes ``OUT/lab_<task>/true_calibration.json`` from the recording's hidden ``lab_truth.json`` (true
   T_cam_from_base, K, distortion): pairs without camera-calibration error. The colours are still matched
   by the twin from the first frames (``comsim.twin.colors``).
3. Replays every episode through the twin (``comsim.twin.replay.replay_dataset``, scored against the truth) into the paired dataset
   ``OUT/paired_<task>`` (``front`` = lab video, ``front_sim`` = twin, ``front_sim_seg`` = twin labels).
4. Writes ``OUT/pairs.json``: the paired datasets, FIRST the one whose last episodes the translator holds
   out (``data.val_episodes``), the settings, and the raw twin render's PSNR against the lab frames
   (per frame, then the mean; ``comsim.metrics.frame.psnr``).

Mode ``physics`` (default) drives the twin's servos with the recorded actions, so pushed objects move by
contact; ``kinematic`` sets the robot to the recorded joints frame by frame and leaves objects where they
were found. Every stage resumes: rerunning with the same arguments reuses what is already there.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from comsim.config import PANDA_CELL, PANDA_PUSH_CELL
from comsim.errors import InputError
from comsim.io.files import write_json
from comsim.io.keys import sim_key

MANIFEST = "pairs.json"


def true_calibration(real: Path) -> Path:
    """``real/true_calibration.json`` from the lab's hidden truth (only the lab has one)."""
    cam = json.loads((Path(real) / "lab_truth.json").read_text())["camera"]
    cal = {"T_cam_from_base": cam["T_cam_from_base"], "K": cam["K"], "width": cam["width"],
           "height": cam["height"], "dist": cam.get("dist_coeffs"), "converged": True,
           "source": "lab_truth.json (the lab's true camera: pairs without calibration error)"}
    return write_json(cal, Path(real) / "true_calibration.json", indent=1)


def sim_vs_real_psnr(paired: Path) -> float:
    """The raw twin render against the lab video: PSNR per frame, mean over all frames (dB)."""
    from comsim.io.lerobot import LeRobotDataset
    from comsim.metrics.frame import mean_psnr

    ds = LeRobotDataset(paired)
    cam = "front"
    return mean_psnr((ep.frames[sim_key(cam)], ep.frames[cam])
                     for ep in (ds.read_episode(e, cameras=[cam, sim_key(cam)]) for e in range(len(ds))))


def make_lab_pairs(out, tasks: dict[str, int], seed: int = 0, mode: str = "physics", twin: Path | None = None,
                   log=print) -> list[Path]:
    """``twin``: the twin spec of every task's replays; None: each task's own cell (push: the cell with the
    target sticker that the lab's push episodes show, ``panda_cell_push.yaml``; stack: ``panda_cell.yaml``)."""
    from comsim.lab.record import record_dataset
    from comsim.lab.twin_truth import replay_and_score

    bad = {t: n for t, n in tasks.items() if isinstance(n, bool) or not isinstance(n, int) or n < 0}
    if bad or not any(tasks.values()):
        raise InputError(None, "--push/--stack", "episode counts >= 0, not all 0", tasks)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paired, timings = [], {}
    for j, (task, n) in enumerate(tasks.items()):
        if n <= 0:
            continue
        t0 = time.perf_counter()
        real = record_dataset(task, episodes=n, out=out / f"lab_{task}", seed=seed + j)
        t1 = time.perf_counter()
        task_twin = twin or (PANDA_PUSH_CELL if task == "push" else PANDA_CELL)
        p = replay_and_score(real, task_twin, out / f"paired_{task}", mode=mode, calibration=true_calibration(real),
                           log=log)
        timings[task] = {"record_s": round(t1 - t0, 1), "replay_s": round(time.perf_counter() - t1, 1)}
        paired.append(Path(p))
    summary = {"paired": [str(p) for p in paired], "tasks": tasks, "seed": seed, "mode": mode,
               "calibration": "lab truth", "timings": timings,
               "sim_vs_real_psnr": {str(p): round(sim_vs_real_psnr(p), 2) for p in paired}}
    write_json(summary, out / MANIFEST, indent=1)
    log(json.dumps(summary))
    return paired
