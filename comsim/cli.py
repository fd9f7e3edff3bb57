"""The `comsim` command: parses arguments and calls the library, nothing more.

Imports are done inside each command so `comsim --help` is instant and a command only
pays for the stages it uses.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _lab_record(a):
    from comsim.lab.record import record_dataset

    out = record_dataset(task=a.task, episodes=a.episodes, out=Path(a.out), seed=a.seed,
                         cell=a.cell, fps=a.fps, resume=not a.no_resume)
    print(out)


def _twin_calibrate(a):
    from comsim.twin.calibrate import calibrate_folder

    result = calibrate_folder(Path(a.folder), robot=a.robot, out=Path(a.out), time_budget_s=a.time_budget)
    print(json.dumps({k: result[k] for k in ("mean_iou", "converged", "outlier_frames") if k in result}))


def _twin_replay(a):
    from comsim.twin.replay import replay_dataset

    print(replay_dataset(real=Path(a.real), twin=Path(a.twin), out=Path(a.out), mode=a.mode,
                         calibration=Path(a.calibration) if a.calibration else None))


def _demo(a):
    from comsim.demo import run_demo

    print(run_demo(Path(a.out), profile="full" if a.full else "small"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="comsim", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    lab = sub.add_parser("lab", help="the reality stand-in").add_subparsers(dest="lab_command", required=True)
    r = lab.add_parser("record", help="record scripted teleoperation episodes as a LeRobotDataset")
    r.add_argument("--task", required=True, help="push | stack")
    r.add_argument("--episodes", type=int, default=10)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--cell", default=None, help="lab cell YAML (default: the built-in lab)")
    r.add_argument("--fps", type=int, default=None, help="frames/s (default: the cell's, 10)")
    r.add_argument("--no-resume", action="store_true", help="refuse to continue an interrupted recording")
    r.set_defaults(func=_lab_record)

    twin = sub.add_parser("twin", help="digital twin: calibrate and replay").add_subparsers(
        dest="twin_command", required=True)
    c = twin.add_parser("calibrate", help="camera pose from robot silhouettes")
    c.add_argument("folder", help="folder with color/, mask/, qpos/, K.txt (see docs)")
    c.add_argument("--robot", default="panda")
    c.add_argument("--out", required=True)
    c.add_argument("--time-budget", type=float, default=540.0, help="seconds")
    c.set_defaults(func=_twin_calibrate)
    rp = twin.add_parser("replay", help="replay real actions in the twin -> paired dataset")
    rp.add_argument("--real", required=True)
    rp.add_argument("--twin", required=True, help="twin scene YAML")
    rp.add_argument("--out", required=True)
    rp.add_argument("--mode", choices=["physics", "kinematic"], default="physics")
    rp.add_argument("--calibration", default=None, help="calibration.json (default: align from the data)")
    rp.set_defaults(func=_twin_replay)

    d = sub.add_parser("demo", help="run the main job on the built-in lab")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--full", action="store_true", help="the full-size experiment")
    d.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:  # our errors name the file and field: show them plainly
        print(f"comsim: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
