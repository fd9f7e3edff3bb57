"""Twin alignment + physics replay against the lab's hidden truth.

Records N scripted lab episodes, replays them in the twin starting from the twin spec's
nominal camera (configs/twin/panda_cell.yaml: 7.8 cm / 5.8 deg from the lab's true pose),
with the camera calibrated from the episodes' own frames, and prints the alignment
report's summary (camera error, robot IoU vs the true masks, object errors, replayed
object trajectory errors) as ONE JSON object on the last line.

    MUJOCO_GL=egl nice python bench/twin_lab.py [--task push] [--episodes 10] [--out runs/bench_twin]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from comsim.config import PANDA_CELL
from comsim.lab.record import record_dataset
from comsim.lab.twin_truth import replay_and_score


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="push")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mode", default="physics", choices=["physics", "kinematic"])
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--no-refine", action="store_true", help="objects' initial poses from the first frame only")
    a = ap.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="bench_twin_"))
    t0 = time.perf_counter()
    real = record_dataset(a.task, episodes=a.episodes, out=out / "lab", seed=a.seed)
    t1 = time.perf_counter()
    paired = replay_and_score(real, PANDA_CELL, out / "paired", mode=a.mode, refine=not a.no_refine,
                            log=lambda s: print(s, flush=True))
    t2 = time.perf_counter()
    rep = json.loads((paired / "alignment_report.json").read_text())
    al = json.loads((paired / "twin_alignment.json").read_text())
    eps = rep["episodes"]
    summary = {**rep["summary"], "task": a.task, "episodes": a.episodes, "mode": a.mode,
               "calibration_mean_iou_vs_derived_masks": al["calibration"]["mean_iou"],
               "calibration_seconds": al["calibration"].get("seconds"),
               "per_episode_object_trajectory_error_m_max": [max(e["object_trajectory_error_m_max"].values())
                                                              for e in eps],
               "refine": not a.no_refine,
               "record_seconds": round(t1 - t0, 1), "align_replay_report_seconds": round(t2 - t1, 1),
               "paired": str(paired)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
