"""Train a Diffusion Policy on a mixture of datasets. Thin entry point over comsim.policy.

One arm of an experiment (trained into the folder the experiment uses, so
``eval/eval_policy.py --experiment`` then only scores it):

    python train/train_policy.py --experiment configs/experiments/demo_small.yaml --arm real10 train.steps=200

A standalone run (a PolicyRunConfig YAML: output_dir, data.sources, data.synthetic_fraction,
policy, train):

    python train/train_policy.py --config my_run.yaml train.batch_size=32

Positional ``a.b=value`` arguments override the YAML (comsim.config.apply_overrides). The
synthetic fraction asked for and the one actually drawn are logged to
``<output_dir>/tb`` (tensorboard) and ``<output_dir>/train_log.json``.
"""
import argparse
import json
import sys

from comsim.config import ConfigError, load_config
from comsim.policy.config import PolicyRunConfig
from comsim.policy.data import MixtureDataset
from comsim.pipeline.experiment import arm_run, ensure_datasets, load_experiment
from comsim.policy.training import train_policy


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--experiment", help="experiment YAML (configs/experiments/*.yaml); needs --arm")
    g.add_argument("--config", help="PolicyRunConfig YAML")
    p.add_argument("--arm", help="arm of the experiment to train")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=100")
    args = p.parse_args(argv)
    try:
        if args.experiment:
            if not args.arm:
                p.error("--experiment needs --arm NAME")
            cfg = load_experiment(args.experiment, args.overrides)
            arms = {a.name: a for a in cfg.all_arms()}
            if args.arm not in arms:
                raise ConfigError(f"--arm: no arm {args.arm!r} in {args.experiment}; arms are {sorted(arms)}")
            arm = arms[args.arm]
            names = {s.dataset for s in arm.sources if s.dataset in cfg.datasets}
            missing = [why for why in ensure_datasets(cfg, names).values() if why]
            if missing:
                sys.exit(f"cannot train arm {args.arm!r}: {missing[0]}")
            run = arm_run(cfg, arm)
        else:
            run = load_config(PolicyRunConfig, args.config, args.overrides)
        data = MixtureDataset(run.data, run.model_config(), run.cache_dir)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    log = train_policy(run, data=data)
    print(json.dumps({k: log[k] for k in ("output_dir", "steps", "final_loss", "step_time_s", "wall_s")}
                     | {"synthetic_fraction": log["mixture"]["synthetic_fraction"],
                        "sampled_fraction": log["mixture"]["sampled_fraction"]}))


if __name__ == "__main__":
    main()
