"""Demo-derived generation (`comsim generate --from-demos`): yield per task and split, and speed.

Measures, on this machine:
- yield: the share of attempts whose episode passes the task's success check, for the lab's
  push (``lab_push``) and stack (``lab_stack``), in- and out-of-distribution layouts. The
  attempts are the first attempts of episodes 0..N-1 (``episode_seed(seed, k)``), run exactly as
  the generator runs them, physics only (the generator renders only the successes); failures
  by reason and per source demonstration;
- speed: ``generate_from_demos`` of ``--episodes`` episodes (default 200) of push, in-distribution,
  with the factory's control videos (seg, normal) and ``--workers`` processes (default 2): wall
  time, episodes per second, minutes per 200 episodes, and the CPU seconds used (the machine is
  shared: ``cores_used`` says how much of it the run got).

Source demonstrations: ``--paired-push`` / ``--paired-stack`` (paired datasets of `comsim twin
replay`), or ``--make-sources DIR``: record 10 lab demonstrations per task with calibration stills
and replay them in the twin (physics), as `comsim demo` does (~10 min of CPU on 2 cores).
Prints ONE JSON object as its last line.

    MUJOCO_GL=egl python bench/demo_derived.py --make-sources /tmp/demos [--attempts 100] [--episodes 200]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from comsim.config import PANDA_CELL, PANDA_PUSH_CELL
from comsim.episode import episode_seed
from comsim.factory.demo_derived import attempt, check_demos, generate_from_demos
from comsim.factory.expert import robot_only_scene

TASKS = {"push": ("lab_push", PANDA_PUSH_CELL), "stack": ("lab_stack", PANDA_CELL)}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def make_sources(root: Path, task: str, episodes: int) -> Path:
    """Lab demonstrations of ``task`` (with calibration stills) replayed in the twin: a paired dataset."""
    from comsim.lab.record import record_dataset
    from comsim.twin.replay import replay_dataset

    lab, paired = root / f"lab_{task}", root / f"paired_{task}"
    if not (paired / "meta" / "info.json").is_file():
        record_dataset(task, episodes=episodes, out=lab, seed=0)
        replay_dataset(real=lab, twin=TASKS[task][1], out=paired, mode="physics", workers=2)
    return paired


def yield_of(paired: Path, program_name: str, split: str, attempts: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        program, sources = check_demos(paired, program_name, split, Path(tmp))
        robot = robot_only_scene(program)
        reasons, per_source, ok = Counter(), Counter(), Counter()
        t0 = time.perf_counter()
        for k in range(attempts):
            _, summary = attempt(program, sources, robot, episode_seed(seed, k), split, render=False)
            reasons[summary["failure"] or "success"] += 1
            per_source[summary["source_episode"]] += 1
            ok[summary["source_episode"]] += summary["failure"] is None
        seconds = time.perf_counter() - t0
    return {"attempts": attempts, "successes": reasons.pop("success", 0),
            "success_rate": round(ok.total() / attempts, 4), "failures_by_reason": dict(sorted(reasons.items())),
            "per_source": {str(e): f"{ok[e]}/{per_source[e]}" for e in sorted(per_source)},
            "sources_used": len(sources.usable), "sources_excluded": sources.describe()["excluded"],
            "s_per_attempt_physics_only": round(seconds / attempts, 3)}


def speed(paired: Path, episodes: int, workers: int, out: Path, seed: int) -> dict:
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = time.process_time()
    load0 = load()
    t0 = time.perf_counter()
    rep = generate_from_demos(paired, episodes, out, workers=workers, seed=seed, controls=("seg", "normal"),
                              progress=False)
    wall = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + (kids.ru_utime - kids0.ru_utime) + (kids.ru_stime - kids0.ru_stime)
    return {"task": rep["task"], "split": rep["split"], "episodes": rep["episodes"], "workers": workers,
            "controls": ["seg", "normal"], "wall_s": round(wall, 1), "episodes_per_second": round(episodes / wall, 4),
            "minutes_per_200_episodes": round(200 * wall / episodes / 60, 2), "cpu_s": round(cpu, 1),
            "cpu_s_per_episode": round(cpu / episodes, 3), "cores_used": round(cpu / wall, 2),
            "attempts": rep["attempts"], "success_rate": rep["success_rate"],
            "failures_by_reason": rep["failures_by_reason"], "frames": rep["frames"],
            "load_before": load0, "load_after": load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paired-push", type=Path, default=None)
    ap.add_argument("--paired-stack", type=Path, default=None)
    ap.add_argument("--make-sources", type=Path, default=None, help="record + replay the source demos here")
    ap.add_argument("--demos", type=int, default=10, help="lab demonstrations per task with --make-sources")
    ap.add_argument("--attempts", type=int, default=100, help="attempts per task and split for the yield")
    ap.add_argument("--episodes", type=int, default=200, help="episodes of the speed run (0: no speed run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="keep the speed run's dataset here")
    a = ap.parse_args()
    paired = {"push": a.paired_push, "stack": a.paired_stack}
    for task in TASKS:
        if paired[task] is None and a.make_sources is not None:
            paired[task] = make_sources(a.make_sources, task, a.demos)
    result: dict = {"machine_cpus": os.cpu_count(), "load_start": load(), "yield": {}}
    for task, (program, _) in TASKS.items():
        if paired[task] is None:
            continue
        result["yield"][program] = {}
        for split in ("id", "ood"):
            y = yield_of(paired[task], program, split, a.attempts, a.seed)
            result["yield"][program][split] = y
            print(json.dumps({program: {split: y}}), flush=True)
    if a.episodes and paired["push"] is not None:
        tmp = Path(tempfile.mkdtemp(prefix="bench_demo_derived_"))
        try:
            out = a.keep if a.keep is not None else tmp / "push_id"
            result["speed"] = speed(paired["push"], a.episodes, a.workers, out, a.seed)
            print(json.dumps(result["speed"]), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    result["load_end"] = load()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
