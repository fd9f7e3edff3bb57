"""Score policies closed-loop in the lab. Thin entry point over comsim.policy.

The Compositional Simulation experiment, end to end (records missing lab demos, trains one
policy per arm, scores each on the ID and OOD panels, writes results.json and results.md;
rerunning resumes):

    python eval/eval_policy.py --experiment configs/experiments/demo_small.yaml [--arms real10,...] [eval.n_trials=20]

One saved policy on one panel:

    python eval/eval_policy.py --policy runs/x/policy --task push --panel ood --trials 50 --out ood.json
"""
import argparse
import json
import sys
from pathlib import Path

from comsim.errors import exit_for


def main(argv=None):
    try:  # bad input: one line naming the file and key, exit 2; a bug keeps its traceback
        _main(argv)
    except Exception as e:
        return exit_for(e, "eval_policy")
    return 0


def _main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--experiment", help="experiment YAML (configs/experiments/*.yaml)")
    g.add_argument("--policy", help="a saved policy folder (config.json + model.safetensors)")
    p.add_argument("--arms", default=None, help="comma-separated arm names (default: all)")
    p.add_argument("--task", default="push")
    p.add_argument("--panel", default="id", choices=["id", "ood"])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=100_000, help="trial i uses lab seed episode_seed(seed, i)")
    p.add_argument("--cell", default=None, help="lab cell YAML (default: the built-in lab)")
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--videos", type=int, default=0, help="save the first N trials as mp4 next to --out")
    p.add_argument("--out", default=None, help="results JSON (with --policy)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the experiment YAML, e.g. eval.n_trials=20")
    args = p.parse_args(argv)
    if args.experiment:
        from comsim.pipeline.experiment import load_experiment, run_experiment
        cfg = load_experiment(args.experiment, args.overrides)
        run_experiment(cfg, arms=args.arms.split(",") if args.arms else None)
        print((Path(cfg.output_dir) / "results.md").read_text())
        return
    from comsim.policy.policies import load_policy
    from comsim.lab.rollout import evaluate
    from comsim.policy.training import write_json
    policy = load_policy(args.policy)  # the policy class its config.json names (diffusion, keypoint)
    out = Path(args.out) if args.out else None
    res = evaluate(policy, args.task, args.trials, panel=args.panel, cell=args.cell, seed=args.seed,
                   max_seconds=args.max_seconds, video_dir=out.parent / "videos" if out else None, videos=args.videos)
    if out:
        write_json(res, out)
    lo, hi = res["ci95"]
    print(json.dumps({"panel": res["panel"], "success_rate": res["success_rate"], "ci95": [lo, hi],
                      "successes": res["successes"], "n_trials": res["n_trials"]}))


if __name__ == "__main__":
    sys.exit(main())
