"""Benchmark: where one training step of an experiment arm's policy spends its time.

    python bench/policy_step.py --experiment configs/experiments/lab_table.yaml --arm real10 \
        --steps 100 --threads 1 [--compile] [overrides ...]

Builds the arm's data and policy as training does (the same batches, seeded by step), runs
``--steps`` optimiser steps with ``--threads`` torch threads, eagerly or compiled, in float32 or
under ``train.precision``'s autocast, and prints
one JSON object as its last line: the median milliseconds of the whole step and of its parts
(batch sampling, forward, backward, gradient clipping, optimiser, EMA), after 5 warm-up
steps. Run it alone on the machine; two runs side by side measure two arms sharing it.
Nothing is written but the decoded-frame cache of the experiment.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")

PARTS = ("sample", "forward", "backward", "clip", "optimizer", "ema")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", required=True, help="experiment YAML (configs/experiments/*.yaml)")
    p.add_argument("--arm", required=True, help="the arm whose data and policy to step")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: train.num_threads)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the policy (default: train.compile)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the experiment")
    args = p.parse_args(argv)

    import numpy as np
    import torch

    from comsim.config import ConfigError
    from comsim.policy import training
    from comsim.policy.data import MixtureDataset
    from comsim.pipeline.experiment import arm_run, arm_with_data, load_experiment
    from comsim.policy.policies import make_policy
    try:
        cfg = load_experiment(args.experiment, args.overrides)
        arm = arm_with_data(cfg, args.arm)
        if args.steps < 6:
            raise ConfigError(f"--steps: expected at least 6 (5 warm-up steps are not timed), got {args.steps}")
    except ConfigError as e:
        print(f"bench/policy_step.py: {e}", file=sys.stderr)
        return 2
    run = arm_run(cfg, arm)
    t = run.train
    threads = args.threads or t.num_threads or torch.get_num_threads()
    compile = t.compile if args.compile is None else args.compile
    torch.set_num_threads(threads)
    training.keep_freed_memory()
    data = MixtureDataset(run.data, run.model_config(), run.cache_dir)
    torch.manual_seed(t.seed)
    policy = make_policy(run.model_config(), stats=data.stats()).train()
    if compile:
        policy.compile()
    opt = torch.optim.AdamW(policy.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    from diffusers.training_utils import EMAModel
    ema = (EMAModel(policy.parameters(), decay=t.ema_decay, use_ema_warmup=True, power=t.ema_power)
           if t.ema_decay is not None else None)
    times = {k: [] for k in (*PARTS, "step")}
    for step in range(args.steps):
        stamps = [time.perf_counter()]
        rng, gen = training.step_generators(t.seed, step)
        batch = data.sample(t.batch_size, rng)
        stamps.append(time.perf_counter())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=t.precision == "bf16"):
            loss = policy.compute_loss(batch, gen)
        stamps.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        stamps.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(policy.parameters(), t.max_grad_norm)
        stamps.append(time.perf_counter())
        opt.step()
        stamps.append(time.perf_counter())
        if ema is not None:
            ema.step(policy.parameters())
        stamps.append(time.perf_counter())
        for name, a, b in zip(PARTS, stamps, stamps[1:]):
            times[name].append(b - a)
        times["step"].append(stamps[-1] - stamps[0])
    ms = {k: round(float(np.median(v[5:])) * 1000, 1) for k, v in times.items()}
    print(json.dumps({"bench": "policy_step", "experiment": cfg.name, "arm": args.arm, "threads": threads,
                      "compile": compile, "precision": t.precision, "batch_size": t.batch_size, "steps": args.steps,
                      "step_ms": ms.pop("step"), "parts_ms": ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
