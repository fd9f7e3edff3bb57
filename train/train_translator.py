"""Train the translator (neural simulator). Thin entry point over comsim.translator.training.

    accelerate launch train/train_translator.py --config configs/translator/tiny.yaml \
        train.output_dir=runs/tiny train.max_steps=2000 [--resume_from_checkpoint latest]

CPU, two processes (DDP over gloo):
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no train/train_translator.py --config ...

Positional ``a.b=value`` arguments override the YAML (comsim.config.apply_overrides).
"""
import argparse
import sys

from comsim.errors import exit_for
from comsim.translator.training import load_train_config, train


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML, e.g. configs/translator/tiny.yaml")
    p.add_argument("--resume_from_checkpoint", default=None, help="'latest' or a checkpoint-<step> folder")
    p.add_argument("--stop_at_step", type=int, default=None, help="stop after this step's checkpoint (no final save)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_steps=100")
    args = p.parse_args(argv)
    try:  # bad input: one line naming the file and key, exit 2; a bug keeps its traceback
        cfg = load_train_config(args.config, args.overrides)
        train(cfg, resume_from_checkpoint=args.resume_from_checkpoint, stop_at_step=args.stop_at_step)
    except Exception as e:
        return exit_for(e, "train_translator")
    return 0


if __name__ == "__main__":
    sys.exit(main())
