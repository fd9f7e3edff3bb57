"""Choose the translator's guidance weights on a validation episode that no test score ever uses.

The demo's video-metrics stage scores the last two lab pairs of a run (its held-out test pairs). This bench
trains the run's translator config again with one more pair held out (the last three: the validation pair
first, then the two test pairs), so the model never sees any of them, and scores a grid of (w_action, w_sim)
on the VALIDATION pair only: PSNR per frame then mean, against its lab frames (both through H.264, as the
metrics stage scores them). The test pairs are never read. The last line is one JSON object with every row
and the best setting.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/translator_weights.py runs/lab_table runs/weights \\
        [--grid 1:1.5 0:1 0.5:1 ...] [dotted overrides of the translator config]
"""
import argparse
import json
import tempfile
import time
from pathlib import Path

from comsim.config import config_file
from comsim.pipeline.demo import PROFILES
from comsim.pipeline.stages import heldout_count
from comsim.io.keys import control_key, sim_key
from comsim.io.lerobot import LeRobotDataset
from comsim.io.video import read_video, write_video
from comsim.metrics.frame import mean_psnr
from comsim.run_layout import RunLayout
from comsim.translator.pipeline import TranslatorPipeline
from comsim.translator.sampling import SamplingParams
from comsim.translator.training import load_train_config, train

GRID = ("1:1.5", "1:1", "0.5:1.5", "0.5:1", "0.25:1", "0:1.5", "0:1", "0.5:0.5")


def through_h264(frames, fps: float):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "clip.mp4"
        write_video(path, frames, fps)
        return read_video(path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a `comsim demo` run folder (its paired lab episodes)")
    p.add_argument("out", help="the validation model's folder")
    p.add_argument("--grid", nargs="+", default=list(GRID), help="W_ACTION:W_SIM settings to score")
    p.add_argument("--config", default=PROFILES["small"].loop.translator_config)
    p.add_argument("overrides", nargs="*", help="dotted overrides of the translator config")
    a = p.parse_args()
    paired = RunLayout(a.run).paired
    n = len(LeRobotDataset(paired))
    test_pairs = heldout_count(n)  # as the run holds them out
    val_episode = n - test_pairs - 1
    cfg = load_train_config(config_file(a.config), [f"data.paths=[{paired}]", f"data.val_episodes={test_pairs + 1}",
                                                    f"train.output_dir={a.out}", *a.overrides])
    t = time.time()
    final = Path(a.out) / "final"
    if not (final / "translator.json").is_file():
        train(cfg, resume_from_checkpoint="latest" if any(Path(a.out).glob("checkpoint-*")) else None)
    train_s = time.time() - t
    pipe = TranslatorPipeline.from_pretrained(final)
    cam = pipe.camera
    ep = LeRobotDataset(paired).read_episode(val_episode, cameras=[cam, sim_key(cam)] +
                                             [control_key(cam, c) for c in pipe.controls])
    real = ep.frames[cam]
    rows = [{"setting": "raw twin", "psnr": round(mean_psnr([(through_h264(ep.frames[sim_key(cam)], ep.fps), real)]), 3)}]
    for setting in a.grid:
        w_action, w_sim = (float(v) for v in setting.split(":"))
        gen = pipe.translate_episode(ep, SamplingParams(w_action=w_action, w_sim=w_sim), seed=val_episode).frames[cam]
        rows.append({"w_action": w_action, "w_sim": w_sim,
                     "psnr": round(mean_psnr([(through_h264(gen, ep.fps), real)]), 3)})
        print(json.dumps(rows[-1]), flush=True)
    best = max(rows[1:], key=lambda r: r["psnr"])
    print(json.dumps({"bench": "translator_weights", "run": a.run, "validation_episode": val_episode,
                      "test_episodes_never_read": list(range(n - test_pairs, n)), "train_s": round(train_s),
                      "num_steps": pipe.sampling.num_steps, "rows": rows, "best": best}))


if __name__ == "__main__":
    main()
