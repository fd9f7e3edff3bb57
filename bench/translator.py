"""Benchmark the translator: does pseudo-real beat raw sim, and does the action steer the arm?

    python bench/translator.py                       # synthetic pairs, trains configs/translator/tiny.yaml
    python bench/translator.py --data data/lab_pairs # a paired LeRobot dataset (cam + cam_sim)
    python bench/translator.py --model runs/translator-tiny/final   # skip training

On the HELD-OUT episodes (the config's data.val_episodes) it reports PSNR against the real
frames of: the raw sim render, action-only (w_action=1, w_sim=0), sim-only (0, 1) and composed
samples (the config's sampling weights), over whole episodes (overlapping windows).

Action consistency (synthetic data, where the arm can be located by colour): action-only
samples driven by ANOTHER held-out episode's actions; the arm found in them is compared
with the arm those actions draw (IoU, centroid error). Two references: the real frames of
the episode with the wrong actions (chance level) and with their own actions (the ceiling).

The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from comsim.translator.data import resize_video  # noqa: E402
from comsim.translator.pipeline import TranslatorPipeline  # noqa: E402
from comsim.translator.synthetic import action_consistency  # noqa: E402
from comsim.translator.training import build_datasets, load_train_config, psnr, train  # noqa: E402


def held_out_episodes(cfg, max_frames: int):
    _, val = build_datasets(cfg)
    if val is None:
        raise SystemExit("data.val_episodes must be > 0: the benchmark scores held-out episodes")
    keys = val.keys
    out = []
    for s, e in val.episodes:
        src = val.sources[s]
        n = min(src.episode_length(e), max_frames)
        ep = src.read_window(e, 0, n, cameras=keys)
        out.append({"real": resize_video(ep.frames[keys[0]], val.resolution),
                    "sim": resize_video(ep.frames[keys[1]], val.resolution), "action": ep.action})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/translator/tiny.yaml")
    p.add_argument("--data", default=None, help="paired LeRobot dataset; default: synthetic pairs")
    p.add_argument("--camera", default=None, help="camera short name (default: the config's)")
    p.add_argument("--model", default=None, help="a trained pipeline folder: skip training")
    p.add_argument("--out", default="runs/bench-translator")
    p.add_argument("--minutes", type=float, default=12.0, help="training wall-time cap")
    p.add_argument("--frames", type=int, default=24, help="frames per held-out episode scored")
    p.add_argument("--num-steps", type=int, default=None, help="sampling steps (default: the config's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = [f"train.output_dir={args.out}", f"train.max_minutes={args.minutes}", *args.overrides]
    if args.data:
        overrides.append(f"data.paths=[{args.data}]")
    if args.camera:
        overrides.append(f"data.camera={args.camera}")
    cfg = load_train_config(args.config, overrides)
    synthetic = not cfg.data.paths

    result = {"bench": "translator", "data": args.data or "synthetic", "config": args.config}
    t0 = time.time()
    if args.model:
        model_dir = Path(args.model)
    else:
        model_dir = train(cfg)
        result["train_minutes"] = round((time.time() - t0) / 60, 2)
    episodes = held_out_episodes(cfg, args.frames)
    pipe = TranslatorPipeline.from_pretrained(model_dir, expect={"camera": cfg.data.camera,
                                                                 "action_dim": episodes[0]["action"].shape[1]})
    steps = pipe.provenance.get("steps")
    if steps and "train_minutes" in result:
        result["steps"] = steps
        result["s_per_step"] = round(result["train_minutes"] * 60 / steps, 3)

    sc = cfg.sampling
    n_steps = args.num_steps or sc.num_steps
    modes = {"action_only": (1.0, 0.0), "sim_only": (0.0, 1.0), "composed": (sc.w_action, sc.w_sim)}
    scores = {"sim": [], **{m: [] for m in modes}}
    t1 = time.time()
    for i, ep in enumerate(episodes):
        scores["sim"].append(psnr(ep["sim"], ep["real"]))
        for m, (wa, ws) in modes.items():
            gen = pipe(ep["sim"], ep["action"], w_action=wa, w_sim=ws, num_steps=n_steps, seed=i)
            scores[m].append(psnr(gen, ep["real"]))
    result["psnr"] = {k: round(float(np.mean(v)), 2) for k, v in scores.items()}
    result["gain_db_over_sim"] = round(result["psnr"]["composed"] - result["psnr"]["sim"], 2)
    result.update({"held_out_episodes": len(episodes), "frames_per_episode": len(episodes[0]["real"]),
                   "num_steps": n_steps, "weights": {"w_action": sc.w_action, "w_sim": sc.w_sim}})

    if synthetic and len(episodes) > 1:
        result["action_consistency"] = {
            "how": "action-only samples (w_sim=0) driven by ANOTHER held-out episode's actions; arm pixels found "
                   "by colour vs. the arm those actions draw; chance: the real frames vs. those wrong actions; "
                   "real: the real frames vs. their own actions"}
        for wa in (1.0, 2.0):
            got, chance, ceiling = [], [], []
            for i, ep in enumerate(episodes):
                other = episodes[(i + 1) % len(episodes)]
                n = min(len(ep["sim"]), len(other["action"]))
                gen = pipe(ep["sim"][:n], other["action"][:n], w_action=wa, w_sim=0.0, num_steps=n_steps, seed=100 + i)
                got.append(action_consistency(gen, other["action"][:n]))
                chance.append(action_consistency(ep["real"][:n], other["action"][:n]))
                ceiling.append(action_consistency(other["real"][:n], other["action"][:n]))
            mean = lambda rs, k: round(float(np.mean([r[k] for r in rs])), 3)  # noqa: E731
            result["action_consistency"][f"w_action={wa:g}"] = {"iou": mean(got, "iou"),
                                                                 "centroid_err_px": mean(got, "centroid_err_px")}
        result["action_consistency"].update({"chance_iou": mean(chance, "iou"),
                                             "chance_centroid_err_px": mean(chance, "centroid_err_px"),
                                             "real_iou": mean(ceiling, "iou")})
    else:
        result["action_consistency"] = None  # needs an arm detector for this data (e.g. the lab's seg labels)
    result["eval_minutes"] = round((time.time() - t1) / 60, 2)
    ps = result["psnr"]
    result["targets"] = {"gain_ge_8db": result["gain_db_over_sim"] >= 8.0,
                         "composed_ge_sim_only": ps["composed"] >= ps["sim_only"],
                         "composed_gt_action_only": ps["composed"] > ps["action_only"] + 1.0,
                         "train_le_15min": result.get("train_minutes", 0.0) <= 15.0}
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
