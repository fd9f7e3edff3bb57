"""Score a trained translator on a paired dataset's held-out episodes (the ones `comsim demo` holds out).

    python bench/translator_heldout.py MODEL PAIRED                 # robot region + whole-frame PSNR, every frame
    python bench/translator_heldout.py MODEL PAIRED --stage RUN      # the demo's video-metrics stage into RUN/
    python bench/translator_heldout.py MODEL PAIRED --stage RUN --factory CONVERTED   # + its object fidelity

The default is the ablation protocol (docs/results/2026-12-06-translator-solid-arm.md): every held-out frame
(``--frames`` caps it per episode), composed guidance ``--weights`` (w_action:w_sim), sampling seed = the episode's
index, the robot region against the lab's true robot masks (docs/metrics.md). ``--stage`` runs
``comsim.pipeline.stages.video_metrics`` instead: the baselines fit on the training pairs, FID, robot region and
object fidelity, written to RUN/metrics.json as the demo writes it. ``--last-step-sigma`` samples the old way (the
last Euler step to sigma 0.001 and not to the prediction) for the ablation of that step. The last line printed is
one JSON object.
"""
import argparse
import json
import os
import time
from pathlib import Path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("paired", type=Path)
    ap.add_argument("--frames", type=int, default=10_000, help="frames per held-out episode (default: all)")
    ap.add_argument("--weights", default="1:1", help="w_action:w_sim")
    ap.add_argument("--last-step-sigma", action="store_true", help="the old last step (ablation)")
    ap.add_argument("--stage", type=Path, default=None, help="run the demo's video-metrics stage into this folder")
    ap.add_argument("--factory", type=Path, default=None, help="a converted factory dataset (with --stage)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from comsim.translator.pipeline import TranslatorPipeline

    if a.last_step_sigma:
        TranslatorPipeline.final_step_to_x0 = False
    t0 = time.perf_counter()
    if a.stage is not None:
        out = stage(a)
    else:
        out = ablation(a, TranslatorPipeline)
    out.update(bench="translator_heldout", model=str(a.model), paired=str(a.paired),
               last_step_sigma=a.last_step_sigma, seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(out))
    return out


def ablation(a, TranslatorPipeline) -> dict:
    from comsim.episode import resize_frames
    from comsim.io.lerobot import LeRobotDataset
    from comsim.metrics.frame import mean_psnr
    from comsim.metrics.robot_region import pool_robot_region, robot_region_scores
    from comsim.pipeline.robot_masks import RobotMasks
    from comsim.pipeline.stages import heldout_indices, token_px
    from comsim.translator.data import camera_shifts
    from comsim.translator.sampling import SamplingParams

    pipe = TranslatorPipeline.from_pretrained(a.model)
    shifts = camera_shifts(a.paired)
    ds, cam, res = LeRobotDataset(a.paired), pipe.camera, pipe.resolution
    w_action, w_sim = (float(x) for x in a.weights.split(":"))
    params = SamplingParams(w_action=w_action, w_sim=w_sim)
    scores, pairs = [], []
    with RobotMasks(a.paired, cam) as masks:
        for i in heldout_indices(a.paired):
            ep = ds.read_window(i, 0, min(a.frames, ds.episode_length(i)))
            region, robot = masks(i, res, len(ep.action))
            real = resize_frames(ep.frames[cam], res)
            track = shifts.get(i)
            pred = pipe.translate_episode(ep, params, seed=i,
                                          camera_shift=None if track is None else track[:len(ep.action)]).frames[cam]
            scores.append(robot_region_scores(pred, real, region, robot, token_px(pipe)))
            pairs.append((pred, real))
    keys = ("psnr", "psnr_still", "psnr_moving", "ssim", "sharpness", "seam", "seam_real", "seam_near_robot",
            "seam_near_robot_real", "frames_still", "frames_moving", "mask_source")
    region = pool_robot_region(scores)
    return {"weights": a.weights, "frame_psnr": round(mean_psnr(pairs), 3),
            "robot_region": {k: region[k] for k in keys if k in region}}


def stage(a) -> dict:
    from comsim.pipeline import stages
    from comsim.run_layout import RunLayout

    run = RunLayout(a.stage)
    a.stage.mkdir(parents=True, exist_ok=True)
    if not run.paired.exists():
        os.symlink(a.paired.resolve(), run.paired)
    converted = {"id": a.factory.resolve()} if a.factory else {}
    r = stages.video_metrics(a.model.resolve(), run, converted)
    parts = ("pseudo_real_vs_real", "raw_sim_vs_real", "global_color_vs_real", "compositor_vs_real")
    return {"whole_frame": {k: r[k]["metrics"] for k in parts}, "robot_region": r["robot_region"],
            "object_fidelity": r.get("object_fidelity"), "metrics": str(run.metrics)}


if __name__ == "__main__":
    main()
