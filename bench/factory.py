"""Data factory and conversion throughput; optionally the scripted experts' success rates.

Measures, on this machine:
- generation: episodes/minute of `generate_dataset` with 1 and 2 worker processes (wall time
  including the workers' start-up), and the speed-up;
- conversion: frames/s of `convert_dataset` with the TINY translator (configs/translator/tiny.yaml:
  pixel space, dim 128, depth 4, 8 frames of 32x32, 20 steps, both guidance weights on). The
  model is RANDOMLY INITIALIZED: timing only, nothing about image quality;
- linearity: the time to translate one episode of L frames and one of 4L frames (a warm model,
  in-process, best of `--repeats`), and their ratio.
With ``--success N``: every built-in task's success rate on N in-distribution and N
out-of-distribution seeds (2 workers), with failures by reason.

The load average (other users of the machine) is reported: the speed-up means little on a
busy machine. Prints ONE JSON object as its last line.

    MUJOCO_GL=egl python bench/factory.py [--episodes 16] [--task stack] [--success 20]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from comsim.factory.generate import generate_dataset  # noqa: E402


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def bench_generation(task: str, episodes: int, tmp: Path) -> dict:
    out = {"task": task, "episodes": episodes, "load_before": load()}
    for workers in (1, 2):
        rep = generate_dataset(task, episodes, tmp / f"gen{workers}", workers=workers, seed=100, progress=False)
        out[f"eps_per_min_{workers}w"] = rep["episodes_per_minute"]
        out[f"success_{workers}w"] = rep["successes"]
    out["speedup_2w"] = round(out["eps_per_min_2w"] / out["eps_per_min_1w"], 3)
    out["frames_per_episode"] = round(rep["frames"] / rep["episodes"], 1)
    out["load_after"] = load()
    return out


def tiny_translator(path: Path) -> Path:
    """configs/translator/tiny.yaml's model, randomly initialized, saved as a pipeline folder."""
    import torch

    from comsim.translator.codec import PixelCodec
    from comsim.translator.data import ActionNormalizer
    from comsim.translator.training import build_model, load_train_config, make_pipeline

    torch.manual_seed(0)
    cfg = load_train_config(ROOT / "configs" / "translator" / "tiny.yaml")
    model = build_model(cfg, PixelCodec(), 8)
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().sum() == 0:  # AdaLN-Zero: make every branch do work
                p.normal_(0, 0.02)
    normalizer = ActionNormalizer(np.zeros(8), np.ones(8))
    return make_pipeline(cfg, model.eval(), PixelCodec(), normalizer, fps=10).save_pretrained(path)


def bench_conversion(sim: Path, tmp: Path, repeats: int, steps: int) -> dict:
    import torch

    from comsim.convert import convert_dataset, convert_episode
    from comsim.episode import Episode
    from comsim.io.lerobot import LeRobotDataset
    from comsim.translator.pipeline import TranslatorPipeline

    model = tiny_translator(tmp / "tiny")
    args = dict(w_action=1.0, w_sim=1.0, steps=steps, strength=1.0, seed=0)
    rep = convert_dataset(model, sim, tmp / "pseudo", progress=False, **args)  # 1 process, 1 thread
    out = {"translator": "configs/translator/tiny.yaml, random init (timing only)", "steps": steps,
           "threads": 1, "convert_frames_per_s": rep["frames_per_second"], "convert_frames": rep["frames_now"]}

    # Linearity: one episode of L frames vs one of 4L (4 episodes back to back), warm model.
    torch.set_num_threads(1)
    pipe = TranslatorPipeline.from_pretrained(model)
    ds = LeRobotDataset(sim)
    eps = [ds[i] for i in range(4)]
    L = min(len(e) for e in eps)
    short = eps[0]
    short = Episode(frames={"front_sim": short.frames["front_sim"][:L]}, action=short.action[:L],
                    state=short.state[:L], fps=short.fps, provenance=short.provenance)
    long = Episode(frames={"front_sim": np.concatenate([e.frames["front_sim"][:L] for e in eps])},
                   action=np.concatenate([e.action[:L] for e in eps]),
                   state=np.concatenate([e.state[:L] for e in eps]), fps=short.fps, provenance=short.provenance)
    g = {k: args[k] for k in ("w_action", "w_sim", "steps", "strength")}
    convert_episode(pipe, short, 0, 0, g, "h", "bench")  # warm-up
    times = {}
    for name, ep in (("L", short), ("4L", long)):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            convert_episode(pipe, ep, 0, 0, g, "h", "bench")
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    out.update({"L_frames": L, "time_L_s": round(times["L"], 3), "time_4L_s": round(times["4L"], 3),
                "ratio_4L_over_L": round(times["4L"] / times["L"], 3)})
    return out


def success_rates(n: int, tmp: Path) -> dict:
    tasks = sorted(p.stem for p in (ROOT / "configs" / "tasks").glob("*.yaml"))
    out = {}
    for task in tasks:
        for split in ("id", "ood"):
            rep = generate_dataset(task, n, tmp / f"{task}_{split}", workers=2, seed=1000, split=split,
                                   progress=False)
            out[f"{task}/{split}"] = {"success_rate": rep["success_rate"], "episodes": rep["episodes"],
                                      "failures_by_reason": rep["failures_by_reason"],
                                      "eps_per_min": rep["episodes_per_minute"]}
            print(task, split, json.dumps(out[f"{task}/{split}"]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="stack")
    ap.add_argument("--episodes", type=int, default=16, help="episodes per generation run")
    ap.add_argument("--repeats", type=int, default=3, help="timings per episode length (best is kept)")
    ap.add_argument("--steps", type=int, default=20, help="translator sampling steps")
    ap.add_argument("--success", type=int, default=0, help="also measure success rates on N seeds per task/split")
    ap.add_argument("--skip-speed", action="store_true", help="only the success rates")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_factory_"))
    result = {"machine_cpus": os.cpu_count()}
    try:
        if not a.skip_speed:
            result["generation"] = bench_generation(a.task, a.episodes, tmp)
            print(json.dumps(result["generation"]), flush=True)
            result["conversion"] = bench_conversion(tmp / "gen1", tmp, a.repeats, a.steps)
            print(json.dumps(result["conversion"]), flush=True)
        if a.success:
            result["success"] = success_rates(a.success, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
