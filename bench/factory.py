"""Data factory and conversion throughput; optionally the scripted experts' success rates.

Measures, on this machine:
- generation: episodes/minute of `generate_dataset` with 1 and 2 worker processes (wall time
  including the workers' start-up), and the speed-up;
- conversion: frames/s of `convert_dataset` (1 and ``--convert-workers`` processes) with the lab
  translator's architecture (``--translator``, default configs/translator/tiny_lab.yaml: pixel space,
  16x16 patches, 8 frames of 128x128) and its own sampling settings (steps, overlap, guidance weights: with
  both weights non-zero the composed guidance evaluates all three branches), and the minutes that 200
  episodes of 100 frames would take; the factory records the control videos the translator reads;
  ``--precision bf16`` converts under autocast;
  The model is RANDOMLY INITIALIZED unless ``--model`` names a trained one: timing only;
- linearity: the time to translate one episode of L frames and one of 4L frames (a warm model,
  in-process, best of `--repeats`, alternating), and their ratio in wall and in CPU time. The
  translator works in overlapping windows (8 frames, stride 4): ~(T - 4) / 4 windows, so the
  ratio approaches 4 from above as L grows (19 vs 76 windows for L = 77: exactly 4).
With ``--success N``: every built-in task's success rate on N in-distribution and N
out-of-distribution seeds (2 workers), with failures by reason.

The load average (other users of the machine) is reported: the speed-up means little on a
busy machine. Prints ONE JSON object as its last line.

    MUJOCO_GL=egl python bench/factory.py [--episodes 32] [--task stack] [--success 30]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from comsim.config import CONFIGS
from comsim.factory.generate import generate_dataset
from comsim.factory.program import TASKS_DIR
from comsim.io.keys import control_key, sim_key


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def bench_generation(task: str, episodes: int, tmp: Path, controls: tuple[str, ...] = ()) -> dict:
    """Wall-clock episodes/minute with 1 and 2 workers, and the CPU time they used.

    ``cores_used`` = CPU seconds / wall seconds: how much of the machine the run actually got.
    On a shared machine with the kernel's autogroup scheduling, a session's processes share ONE
    fair slice while other sessions are busy, so two workers may get ~1 core between them;
    ``cpu_s_per_episode`` then shows whether a worker itself got any slower.
    """
    import resource

    out = {"task": task, "episodes": episodes, "controls": list(controls), "load_before": load()}
    for workers in (1, 2):
        cpu0, kids0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        rep = generate_dataset(task, episodes, tmp / f"gen{workers}", workers=workers, seed=100, progress=False,
                               controls=controls)
        wall = time.perf_counter() - t0
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = time.process_time() - cpu0 + (kids.ru_utime - kids0.ru_utime) + (kids.ru_stime - kids0.ru_stime)
        out[f"eps_per_min_{workers}w"] = rep["episodes_per_minute"]
        out[f"success_{workers}w"] = rep["successes"]
        out[f"cpu_s_per_episode_{workers}w"] = round(cpu / episodes, 3)
        out[f"cores_used_{workers}w"] = round(cpu / wall, 2)
    out["speedup_2w"] = round(out["eps_per_min_2w"] / out["eps_per_min_1w"], 3)
    out["frames_per_episode"] = round(rep["frames"] / rep["episodes"], 1)
    out["load_after"] = load()
    return out


def tiny_translator(path: Path, config: Path) -> Path:
    """The model of translator ``config``, randomly initialized, saved as a pipeline folder."""
    import torch

    from comsim.translator.codec import PixelCodec
    from comsim.translator.data import ActionNormalizer
    from comsim.translator.training import build_model, load_train_config, make_pipeline

    torch.manual_seed(0)
    cfg = load_train_config(config)
    model = build_model(cfg, PixelCodec(), 8)
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().sum() == 0:  # AdaLN-Zero: make every branch do work
                p.normal_(0, 0.02)
    normalizer = ActionNormalizer(np.zeros(8), np.ones(8))
    return make_pipeline(cfg, model.eval(), PixelCodec(), normalizer, fps=10).save_pretrained(path)


def translator_controls(config: Path, model: Path | None) -> tuple[str, ...]:
    """The control videos (``<cam>_sim_<name>``) the timed translator reads: the factory records them too."""
    from comsim.translator.training import load_train_config

    if model is not None:
        return tuple(json.loads((Path(model) / "translator.json").read_text()).get("controls", ()))
    return tuple(load_train_config(config).data.controls)


def _subset(sim: Path, n: int, out: Path) -> Path:
    """The first ``n`` episodes of a dataset, as a dataset of their own."""
    from comsim.io.lerobot import LeRobotDataset, write_dataset

    ds = LeRobotDataset(sim)
    return write_dataset(out, (ds[i] for i in range(min(n, len(ds)))), fps=ds.fps)


def bench_conversion(sim: Path, tmp: Path, episodes: int, steps: int | None, lin_steps: int, repeats: int,
                     config: Path, model: Path | None, workers: int, precision: str = "fp32") -> dict:
    import torch

    from comsim.convert import convert_dataset, convert_episode
    from comsim.episode import Episode
    from comsim.io.lerobot import LeRobotDataset
    from comsim.translator.pipeline import TranslatorPipeline, sampling_defaults
    from comsim.translator.sampling import SamplingParams

    model = model or tiny_translator(tmp / "tiny", config)
    sampling = SamplingParams(num_steps=steps).resolved(sampling_defaults(model))
    small = _subset(sim, episodes, tmp / "sim_subset")
    args = dict(sampling=sampling, seed=0, precision=precision)
    meta = TranslatorPipeline.from_pretrained(model).info()
    out = {"translator": str(model) if model != tmp / "tiny" else f"{config}, random init (timing only)",
           "resolution": meta["resolution"], "steps": sampling.num_steps, "w_action": sampling.w_action,
           "w_sim": sampling.w_sim,
           "precision": precision,
           "load": load()}
    for n in sorted({1, workers}):
        rep = convert_dataset(model, small, tmp / f"pseudo-{n}", progress=False, workers=n, **args)
        out[f"convert_frames_per_s_{n}_workers"] = rep["frames_per_second"]
        out["convert_frames"] = rep["frames_now"]
    best = max(out[f"convert_frames_per_s_{n}_workers"] for n in sorted({1, workers}))
    out["minutes_for_200x100_frames"] = round(200 * 100 / best / 60, 1)
    out["load_after_convert"] = load()

    # Linearity: one episode of L frames vs one of 4L (4 episodes back to back), warm model,
    # the episode's whole conversion (resize, windows, assembly), without disk I/O.
    torch.set_num_threads(1)
    pipe = TranslatorPipeline.from_pretrained(model)
    ds = LeRobotDataset(sim)
    eps = [ds[i] for i in range(4)]
    L = min(len(e) for e in eps)

    def cut(parts):
        keys = [sim_key(pipe.camera)] + [control_key(pipe.camera, c) for c in pipe.controls]
        return Episode(frames={k: np.concatenate([e.frames[k][:L] for e in parts]) for k in keys},
                       action=np.concatenate([e.action[:L] for e in parts]),
                       state=np.concatenate([e.state[:L] for e in parts]), fps=ds.fps, provenance=parts[0].provenance)

    g = {**SamplingParams(num_steps=lin_steps, w_action=1.0, w_sim=1.0).to_dict(), "precision": precision}
    convert_episode(pipe, cut(eps[:1]), 0, 0, g, "bench")  # warm-up
    wall, cpu = {"L": [], "4L": []}, {"L": [], "4L": []}
    for _ in range(repeats):  # alternate, so that drifts in the machine's load hit both
        for name, ep in (("L", cut(eps[:1])), ("4L", cut(eps))):
            w, c = _timed(lambda: convert_episode(pipe, ep, 0, 0, g, "bench"))
            wall[name].append(w)
            cpu[name].append(c)
    out.update({"linearity_steps": lin_steps, "L_frames": L, "time_L_s": round(min(wall["L"]), 3),
                "time_4L_s": round(min(wall["4L"]), 3),
                "ratio_4L_over_L": round(min(wall["4L"]) / min(wall["L"]), 3),
                "cpu_ratio_4L_over_L": round(min(cpu["4L"]) / min(cpu["L"]), 3), "load_after": load()})
    return out


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process): CPU time is less disturbed by other users."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def success_rates(n: int, tmp: Path) -> dict:
    tasks = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
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
    ap.add_argument("--episodes", type=int, default=32, help="episodes per generation run (amortizes worker start-up)")
    ap.add_argument("--convert-episodes", type=int, default=2, help="episodes converted for frames/s")
    ap.add_argument("--steps", type=int, default=None, help="translator sampling steps for frames/s (default: "
                    "the translator's own)")
    ap.add_argument("--translator", type=Path, default=CONFIGS / "translator" / "tiny_lab.yaml",
                    help="translator config whose (randomly initialized) model is timed")
    ap.add_argument("--model", type=Path, default=None, help="a trained translator folder instead")
    ap.add_argument("--convert-workers", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="conversion precision")
    ap.add_argument("--linearity-steps", type=int, default=4, help="sampling steps for the L vs 4L timing")
    ap.add_argument("--repeats", type=int, default=3, help="timings per episode length (best is kept)")
    ap.add_argument("--success", type=int, default=0, help="also measure success rates on N seeds per task/split")
    ap.add_argument("--skip-speed", action="store_true", help="only the success rates")
    ap.add_argument("--skip-conversion", action="store_true", help="generation speed only")
    ap.add_argument("--skip-generation", action="store_true", help="conversion speed only")
    a = ap.parse_args()
    # diffusers imports triton, which crashes (SIGSEGV in free) when it is loaded AFTER Mesa's
    # llvmpipe has rendered in this process; loaded before, both work. Imported here, not at the
    # top, so that the spawned generation workers (which re-import this file) stay light.
    import comsim.translator.pipeline  # noqa: F401
    tmp = Path(tempfile.mkdtemp(prefix="bench_factory_"))
    result = {"machine_cpus": os.cpu_count()}
    controls = translator_controls(a.translator, a.model)
    try:
        if not a.skip_speed and not a.skip_generation:
            result["generation"] = bench_generation(a.task, a.episodes, tmp, controls)
            print(json.dumps(result["generation"]), flush=True)
        elif not a.skip_speed:  # conversion input only
            generate_dataset(a.task, 4, tmp / "gen1", seed=100, progress=False, controls=controls)
        if not a.skip_speed and not a.skip_conversion:
            result["conversion"] = bench_conversion(tmp / "gen1", tmp, a.convert_episodes, a.steps,
                                                    a.linearity_steps, a.repeats, a.translator, a.model,
                                                    a.convert_workers, a.precision)
            print(json.dumps(result["conversion"]), flush=True)
        if a.success:
            result["success"] = success_rates(a.success, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
