"""Benchmark: train one arm of a policy experiment and score it closed-loop on fixed panels.

    python bench/policy.py --experiment configs/experiments/lab_table.yaml --arm oracle200 \
        eval.n_trials=20 eval.seed=200000 output_dir=/tmp/bench_oracle

Trains the arm's policy (or finds it trained: the experiment's own cache, keyed by data,
policy and training config), scores it on every panel of ``eval`` (each panel's file keyed
by the eval config), and prints one JSON object as its last line: per panel the success
rate, successes, trials and 95% Wilson interval; the training steps, median seconds per
step, wall and CPU seconds, torch threads. Pick hyperparameters with ``eval.seed`` on a
validation range (e.g. 200000), never on the experiment's evaluation seed.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", required=True, help="experiment YAML (configs/experiments/*.yaml)")
    p.add_argument("--arm", required=True, help="the arm to train and score")
    p.add_argument("--progress", action="store_true", help="show training and scoring progress bars (stderr)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=2000 policy.horizon=8")
    args = p.parse_args(argv)

    import torch

    from comsim.config import ConfigError
    from comsim.pipeline.experiment import arm_with_data, load_experiment, run_arm
    try:
        cfg = load_experiment(args.experiment, args.overrides)
        arm = arm_with_data(cfg, args.arm)
    except ConfigError as e:
        print(f"bench/policy.py: {e}", file=sys.stderr)
        return 2
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    t0 = time.time()
    res = run_arm(cfg, arm, progress=args.progress)
    tr = res["train"]
    print(json.dumps({"bench": "policy", "experiment": cfg.name, "arm": arm.name, "dir": res["dir"],
                      "policy": cfg.policy, "eval_seed": cfg.eval.seed, "n_trials": cfg.eval.n_trials,
                      "panels": res["panels"], "steps": tr["steps"], "batch_size": tr["batch_size"],
                      "s_per_step": tr["step_time_s"], "train_wall_s": tr["wall_s"], "train_cpu_s": tr.get("cpu_s"),
                      "threads": tr.get("threads"), "final_loss": tr["final_loss"],
                      "num_parameters": tr["num_parameters"], "wall_s": time.time() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
