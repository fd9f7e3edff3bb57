"""Benchmark the translator: does pseudo-real beat raw sim, and does the action steer the arm?

    python bench/translator.py                       # synthetic pairs, trains configs/translator/tiny.yaml
    python bench/translator.py --data data/lab_pairs # paired LeRobot dataset(s) (cam + cam_sim), first = held out
    python bench/translator.py --data lab            # lab pairs: `comsim lab pairs` into --pairs (if missing)
    python bench/translator.py --model runs/translator-tiny/final   # skip training

On the HELD-OUT episodes (the config's data.val_episodes) it reports PSNR against the real
frames of: the raw sim render, action-only (w_action=1, w_sim=0), sim-only (0, 1) and composed
samples (the config's sampling weights), over whole episodes (overlapping windows). On paired
datasets with the twin's labels, ``baselines`` puts the composed samples beside the no-network
baselines fit on the training pairs (raw twin render, a global colour map, the compositor: real
background plate + per-label colour maps) on the same frames: PSNR, SSIM, FID, LPIPS (where its
weights are on disk) and object-crop scores; and the robot region (``baselines.robot_region``,
docs/metrics.md: PSNR/SSIM inside the real robot mask on still and moving frames, the edge sharpness
against the real frames, the seam score on the translator's token grid) for each of them and for the
real frames themselves. The masks: the lab's true robot masks where the pairs replay a lab recording,
else the twin's robot label dilated 2 px (``mask_source``).

``--action-control``: does the action steer the composed samples? Each held-out episode is translated
with the composed guidance twice, with the same sim video, controls and seed: once with its own actions,
once with another held-out episode's (the one whose actions differ most); both are scored on the robot
region against the real frames. ``psnr_own - psnr_swapped`` near 0 (and a small ``mean_abs_change``
inside the robot mask) says the action does not steer: the sim video draws the arm.

Action consistency: action-only samples driven by ANOTHER held-out episode's actions; the
arm found in them is compared with where those actions put it (IoU). Two references: the
real frames of the episode whose actions were swapped out (chance level) and the real
frames that belong to those actions (the ceiling of the estimator).
- synthetic pairs: the arm is found by colour and drawn from the action (IoU, centroid error);
- paired datasets with ``<cam>_sim_seg`` (the twin's labels, robot = 1): the robot is found
  by ``comsim.metrics.action.RobotColourModel`` (P(robot | colour), fit on the TRAINING
  episodes' real frames with their twin robot masks) and compared with the twin's robot
  mask of the other episode (rendered at its recorded joints), all at the model resolution.

Lab data are also scored at the recording's resolution (``psnr_native``: the pseudo-real
frames upsampled bilinearly, the raw sim at its own resolution). Training time is reported
as wall time, process CPU time and the cores it got (CPU / wall), with the load average:
on a shared machine the wall time per step is longer than on an idle one. On a busy machine
use ``--threads 1`` and ``OMP_WAIT_POLICY=PASSIVE``: two torch threads sharing one free core
ran 5 s/step here, one thread 0.5-0.9 s/step (2 idle cores: ~0.4-0.45 s/step).

Lab pairs, the tiny CPU model (32x32) trained for them:

    OMP_WAIT_POLICY=PASSIVE MUJOCO_GL=egl nice python bench/translator.py \
        --config configs/translator/tiny_lab.yaml --data lab --threads 1

The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("MUJOCO_GL", "egl")  # the lab's true robot masks are rendered in this process (headless)

from comsim.episode import resize_frames  # noqa: E402
from comsim.io.keys import seg_key as seg_key_of, sim_key  # noqa: E402
from comsim.metrics.action import mask_iou, robot_masks_from_labels  # noqa: E402
from comsim.metrics.frame import mean_psnr  # noqa: E402
from comsim.pipeline.stages import token_px  # noqa: E402
from comsim.translator.pipeline import TranslatorPipeline  # noqa: E402
from comsim.translator.sampling import SamplingParams  # noqa: E402
from comsim.translator.synthetic import arm_placement  # noqa: E402
from comsim.translator.training import build_datasets, load_train_config, train  # noqa: E402


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
        controls = {c: resize_frames(ep.frames[k], val.resolution) for c, k in zip(cfg.data.controls, keys[2:])}
        out.append({"real": resize_frames(ep.frames[keys[0]], val.resolution),
                    "sim": resize_frames(ep.frames[keys[1]], val.resolution), "action": ep.action,
                    "controls": controls, "source": s, "episode": e, "n": n})
    return out


def first_frames(controls: dict, n: int | None) -> dict | None:
    """The control videos an episode is translated with, cut to its first ``n`` frames (None: all)."""
    return {c: v[:n] for c, v in controls.items()} or None


def lab_pairs(pairs_dir: Path, args) -> list[str]:
    """The paired datasets listed in PAIRS/pairs.json, made first (in a subprocess: MuJoCo renders
    there, never in this process, which has imported the translator) if missing."""
    manifest = pairs_dir / "pairs.json"
    if not manifest.is_file():
        cmd = [sys.executable, "-m", "comsim.cli", "lab", "pairs", "--out", str(pairs_dir),
               "--push", str(args.push), "--stack", str(args.stack), "--seed", str(args.pairs_seed),
               "--mode", args.mode]
        print("making lab pairs:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    return json.loads(manifest.read_text())["paired"]


def labelled_training_episodes(cfg, n: int):
    """(camera, resolution, seg key, datasets, up to n training episodes spread evenly) of paired data with the
    twin's labels, or None without them. Estimators are fit on these: never held-out or generated frames."""
    from comsim.io.lerobot import LeRobotDataset
    from comsim.translator.data import split_episodes

    cam, res = cfg.data.camera, tuple(cfg.data.resolution)
    seg_key = seg_key_of(cam)
    sources = [LeRobotDataset(p) for p in cfg.data.paths]
    if seg_key not in sources[0].camera_keys:
        return None
    train_eps, _ = split_episodes([len(s) for s in sources], cfg.data.val_episodes)
    return cam, res, seg_key, sources, train_eps[::max(1, len(train_eps) // n)][:n]


def lab_action_consistency(cfg, pipe, episodes, n_steps: int, fit_episodes: int = 8) -> dict:
    """Action-only samples with ANOTHER held-out episode's actions vs the twin's robot masks of it."""
    from comsim.metrics.action import RobotColourModel

    labelled = labelled_training_episodes(cfg, fit_episodes)
    if labelled is None:
        return None
    cam, res, seg_key, sources, fit = labelled
    model = RobotColourModel()
    ref_ious = []
    for s, e in fit:
        ep = sources[s].read_episode(e, cameras=[cam, seg_key])
        real, m = resize_frames(ep.frames[cam], res), robot_masks_from_labels(ep.frames[seg_key], res)
        model.update(real, m)
    for s, e in fit:
        ep = sources[s].read_episode(e, cameras=[cam, seg_key])
        ref_ious.append(float(mask_iou(model.predict(resize_frames(ep.frames[cam], res)),
                                       robot_masks_from_labels(ep.frames[seg_key], res)).mean()))
    masks = []
    for ep in episodes:
        w = sources[ep["source"]].read_window(ep["episode"], 0, ep["n"], cameras=[seg_key])
        masks.append(robot_masks_from_labels(w.frames[seg_key], res))
    # The robot's base and shoulder sit at the same pixels in every episode: pixels that are robot in
    # every frame of every held-out episode are left out of the "moving" IoU, which scores the parts
    # the actions move.
    static = np.all(np.concatenate(masks), axis=0)

    def ious(pred, ref):
        return float(mask_iou(pred, ref).mean()), float(mask_iou(pred, ref, ignore=static).mean())

    # pair each held-out episode with the held-out episode whose robot motion differs most from its own
    partner = []
    for i in range(len(episodes)):
        cands = [(ious(masks[i][:min(len(masks[i]), len(masks[k]))], masks[k][:min(len(masks[i]), len(masks[k]))])[0], k)
                 for k in range(len(episodes)) if k != i]
        partner.append(min(cands)[1])
    result = {"how": "action-only samples (w_sim=0: the sim video does not enter the guided velocity) of held-out "
                     "episode i driven by the actions of held-out episode j (the one whose twin robot masks overlap "
                     "i's least); the robot is found by a colour model P(robot|colour) fit on %d training episodes' "
                     "real frames with their twin robot masks (comsim.metrics.action.RobotColourModel) and compared "
                     "(per-frame IoU, mean) with the twin's robot mask of episode j (seg label 1, rendered at its "
                     "recorded joints), at %dx%d. iou_moving leaves out the %d pixels that are robot in every frame "
                     "of every held-out episode (base, shoulder). chance: episode i's real frames vs j's masks; real: "
                     "episode j's own real frames vs its masks (the estimator's ceiling); twin_i_vs_j: i's twin masks "
                     "vs j's (a perfect drawing of the WRONG motion); vs_episode_i: the samples vs i's masks"
                     % (len(fit), res[0], res[1], int(static.sum())),
              "pairs": [[int(episodes[i]["episode"]), int(episodes[j]["episode"])] for i, j in enumerate(partner)],
              "estimator_iou_on_fit_frames": round(float(np.mean(ref_ious)), 3)}
    mean = lambda xs, k: round(float(np.mean([x[k] for x in xs])), 3)  # noqa: E731
    chance, ceiling, twin = [], [], []
    for i, ep in enumerate(episodes):
        j = partner[i]
        n = min(ep["n"], episodes[j]["n"])
        chance.append(ious(model.predict(ep["real"][:n]), masks[j][:n]))
        ceiling.append(ious(model.predict(episodes[j]["real"][:n]), masks[j][:n]))
        twin.append(ious(masks[i][:n], masks[j][:n]))
    for wa in (1.0, 2.0):
        got, own = [], []
        for i, ep in enumerate(episodes):
            j = partner[i]
            other = episodes[j]
            n = min(ep["n"], other["n"])
            gen = pipe(ep["sim"][:n], other["action"][:n], SamplingParams(n_steps, w_action=wa, w_sim=0.0),
                       seed=100 + i, controls=first_frames(ep["controls"], n))
            got.append(ious(model.predict(gen), masks[j][:n]))
            own.append(ious(model.predict(gen), masks[i][:n]))  # where episode i's robot was
        result[f"w_action={wa:g}"] = {"iou": mean(got, 0), "iou_moving": mean(got, 1),
                                      "vs_episode_i_iou_moving": mean(own, 1)}
    for name, xs in (("chance", chance), ("real", ceiling), ("twin_i_vs_j", twin)):
        result[f"{name}_iou"], result[f"{name}_iou_moving"] = mean(xs, 0), mean(xs, 1)
    return result


def native_scores(cfg, pipe, episodes, gens: dict, fid_frames: int, fid_for=("composed",)) -> dict:
    """PSNR (per frame, mean) and FID at the recording's resolution; generated frames are upsampled
    bilinearly when the translator works below it. FID: InceptionV3 pool features, covariances / (N - 1),
    at most ``fid_frames`` frames per side (evenly spaced), against the held-out real frames; for the raw
    sim render and the ``fid_for`` entries of ``gens``."""
    from comsim.io.lerobot import LeRobotDataset
    from comsim.metrics.frechet import InceptionFeatures, fid

    cam = cfg.data.camera
    sources = [LeRobotDataset(p) for p in cfg.data.paths]
    reals, sims = [], []
    for ep in episodes:
        w = sources[ep["source"]].read_window(ep["episode"], 0, ep["n"], cameras=[cam, sim_key(cam)])
        reals.append(w.frames[cam]), sims.append(w.frames[sim_key(cam)])
    size = reals[0].shape[1:3]
    ups = {m: [resize_frames(g, size) for g in gs] for m, gs in gens.items()}
    out = {"psnr": {"sim": round(mean_psnr(zip(sims, reals)), 2)}, "resolution": list(size)}
    for m, gs in ups.items():
        out["psnr"][m] = round(mean_psnr(zip(gs, reals)), 2)
    if fid_frames:
        feats = InceptionFeatures()
        pick = lambda vs: (lambda a: a[np.linspace(0, len(a) - 1, min(fid_frames, len(a))).astype(int)])(  # noqa: E731
            np.concatenate(vs))
        ref = feats(pick(reals))
        out["fid"] = {"sim": round(fid(feats(pick(sims)), ref), 1), "frames": int(len(ref))}
        for m in fid_for:  # InceptionV3 is the cost
            out["fid"][m] = round(fid(feats(pick(ups[m])), ref), 1)
    return out


def robot_masks(cfg, episodes) -> tuple[list, str] | None:
    """(scoring masks, silhouettes) of each held-out episode's frames at the model resolution
    (comsim.pipeline.robot_masks: the lab's truth where the pairs replay a lab recording, else the twin's robot
    label dilated), and where they came from; None where neither exists."""
    from comsim.pipeline.robot_masks import RobotMasks

    res, providers, out = tuple(cfg.data.resolution), {}, []
    try:
        for ep in episodes:
            s = ep["source"]
            if s not in providers:
                providers[s] = RobotMasks(cfg.data.paths[s], cfg.data.camera)
            out.append(providers[s](ep["episode"], res, ep["n"]))
    except ValueError as e:  # no truth and no labels: the robot region is not scored
        print(f"robot region: not scored ({e})", flush=True)
        return None
    finally:
        for m in providers.values():
            m.close()
    return out, "; ".join(sorted({m.source for m in providers.values()}))


def robot_region(preds: dict, episodes, masks, token: int) -> dict:
    """comsim.metrics.robot_region of every prediction ({name: [frames per episode]}) and of the real frames
    themselves (the ceiling row), on the same held-out frames."""
    from comsim.metrics.robot_region import pool_robot_region, robot_region_scores

    reals = [e["real"] for e in episodes]
    out = {name: pool_robot_region([robot_region_scores(p, r, m, robot, token)
                                    for p, r, (m, robot) in zip(ps, reals, masks)])
           for name, ps in {**preds, "real": reals}.items()}
    return out


def action_control(pipe, episodes, masks, sampling: SamplingParams, token: int, own: list | None = None) -> dict:
    """Composed samples of each held-out episode with its own actions vs with another held-out episode's (the one
    whose actions differ most over their common frames), same sim video, controls and seed; both scored on the
    robot region against the real frames. ``own``: the own-action samples already made with these settings (seed =
    the episode's position), reused where no frame is cut."""
    from comsim.metrics.robot_region import pool_robot_region, robot_region_scores

    def gap(i, k):
        n = min(episodes[i]["n"], episodes[k]["n"])
        return float(np.abs(episodes[i]["action"][:n] - episodes[k]["action"][:n]).mean())

    rows, scores = [], {"own": [], "swapped": []}
    change_in, change_out = [], []
    for i, ep in enumerate(episodes):
        j = max((k for k in range(len(episodes)) if k != i), key=lambda k: gap(i, k))
        n = min(ep["n"], episodes[j]["n"])
        ctrl = first_frames(ep["controls"], n)
        mine = own[i][:n] if own is not None and n == len(own[i]) else \
            pipe(ep["sim"][:n], ep["action"][:n], sampling, seed=i, controls=ctrl)
        other = pipe(ep["sim"][:n], episodes[j]["action"][:n], sampling, seed=i, controls=ctrl)
        m, robot = masks[i][0][:n], masks[i][1][:n]
        for name, frames in (("own", mine), ("swapped", other)):
            scores[name].append(robot_region_scores(frames, ep["real"][:n], m, robot, token))
        diff = np.abs(mine.astype(np.float64) - other.astype(np.float64)).mean(-1)
        change_in.append(diff[m]), change_out.append(diff[~m])
        rows.append([int(ep["episode"]), int(episodes[j]["episode"]), n])
    pooled = {name: pool_robot_region(v) for name, v in scores.items()}
    out = {"how": "composed guidance (w_action %g, w_sim %g, %d steps); held-out episode i translated with its own "
                  "actions and with held-out episode j's (the largest mean |action difference|), same sim video, "
                  "controls and seed; robot region against i's real frames; mean_abs_change: mean |own - swapped| "
                  "(grey levels, RGB mean) inside / outside the robot mask"
                  % (sampling.w_action, sampling.w_sim, sampling.num_steps),
           "pairs_i_j_frames": rows, "own": pooled["own"], "swapped": pooled["swapped"],
           "mean_abs_change_in_robot": round(float(np.concatenate(change_in).mean()), 3),
           "mean_abs_change_outside": round(float(np.concatenate(change_out).mean()), 3)}
    for split in ("", "_still", "_moving"):
        a, b = pooled["own"][f"psnr{split}"], pooled["swapped"][f"psnr{split}"]
        out[f"psnr_own_minus_swapped{split}"] = round(a - b, 3) if a is not None and b is not None else None
    return out


def baseline_scores(cfg, pipe, episodes, gens: dict, fid_frames: int, fit_episodes: int = 40,
                    masks=None) -> dict | None:
    """The no-network baselines (comsim.translator.compositor: raw twin render, one global affine colour map,
    the compositor of real background plate + per-label affine maps), fit on up to ``fit_episodes`` TRAINING
    pairs, beside the translator's composed samples on the same held-out frames: PSNR (per frame, then the
    mean) and SSIM at the model resolution, PSNR and FID at the recording's (``native_scores``), LPIPS where
    its weights are on disk, and object-crop PSNR/LPIPS (comsim.metrics.crops: 16x16 around each twin object's
    label centroid), and the robot region (``robot_region``) where ``masks`` (``robot_masks``) are given.
    None without the twin's labels."""
    from comsim.metrics.crops import object_crop_scores, pool_crop_scores
    from comsim.metrics.frame import ssim
    from comsim.metrics.frechet import MetricUnavailable
    from comsim.io.labels import labels_from_palette
    from comsim.translator.compositor import fit_baselines, training_pairs

    labelled = labelled_training_episodes(cfg, fit_episodes)
    if labelled is None:
        return None
    cam, res, seg, sources, fit = labelled
    bases = fit_baselines((next(training_pairs(sources[s], cam, [e])) for s, e in fit), cam, res)
    preds, labels = {k: [] for k in bases}, []
    for ep in episodes:
        w = sources[ep["source"]].read_window(ep["episode"], 0, ep["n"], cameras=[sim_key(cam), seg])
        labels.append(labels_from_palette(w.frames[seg], res))
        for k, b in bases.items():
            preds[k].append(b.apply(w))
    preds["translator"] = gens["composed"]
    reals = [e["real"] for e in episodes]
    native = native_scores(cfg, pipe, episodes, preds, fid_frames, fid_for=list(preds))
    try:
        from comsim.metrics.frame import load_lpips, lpips_distance
        lpips_model, lpips_note = load_lpips(), None
    except MetricUnavailable as e:
        lpips_model, lpips_note = None, str(e)
    out = {"how": "fit on %d training episodes' pairs (%s); scored on the held-out episodes' frames the translator "
                  "is scored on, at %dx%d; translator = the composed samples" % (len(fit), cam, res[0], res[1]),
           "fit": bases["compositor"].fit_info, "psnr": {}, "ssim": {}, "psnr_native": native["psnr"],
           "fid_native": native.get("fid"), "lpips": {} if lpips_model is not None else None,
           "object_crops": {}}
    if lpips_note:
        out["lpips_unavailable"] = lpips_note
    for k, ps in preds.items():
        out["psnr"][k] = round(mean_psnr(zip(ps, reals)), 2)
        out["ssim"][k] = round(float(np.mean(np.concatenate([ssim(p, r) for p, r in zip(ps, reals)]))), 4)
        if lpips_model is not None:
            out["lpips"][k] = round(float(np.mean(np.concatenate(
                [lpips_distance(p, r, lpips_model) for p, r in zip(ps, reals)]))), 4)
        objects = bases["compositor"].fit_info["object_labels"]
        out["object_crops"][k] = pool_crop_scores([object_crop_scores(p, r, lab, lpips_model=lpips_model,
                                                                      objects=objects)
                                                   for p, r, lab in zip(ps, reals, labels)])
    out["translator_margin_db_over_compositor"] = round(out["psnr"]["translator"] - out["psnr"]["compositor"], 2)
    if masks is not None:
        out["robot_region"] = {**robot_region(preds, episodes, masks[0], token_px(pipe)), "mask_source": masks[1]}
    return out


def held_out_fidelity(cfg, episodes, gens: dict, fit_episodes: int = 8) -> dict | None:
    """Object fidelity (comsim.metrics.fidelity) of the generated held-out episodes against the twin's labels,
    and of their REAL frames (the locator's ceiling); the locator is fit on training episodes' real frames."""
    from comsim.io.labels import labels_from_palette
    from comsim.metrics.fidelity import fit_locator, object_fidelity, pool

    labelled = labelled_training_episodes(cfg, fit_episodes)
    if labelled is None:
        return None
    cam, res, seg_key, sources, fit = labelled
    frames, fit_labels = [], []
    for s, e in fit:
        ep = sources[s].read_episode(e, cameras=[cam, seg_key])
        frames.append(resize_frames(ep.frames[cam], res))
        fit_labels.append(labels_from_palette(ep.frames[seg_key], res))
    model = fit_locator(np.concatenate(frames), np.concatenate(fit_labels))
    labels = []
    for ep in episodes:
        w = sources[ep["source"]].read_window(ep["episode"], 0, ep["n"], cameras=[seg_key])
        labels.append(labels_from_palette(w.frames[seg_key], res))
    out = {"resolution": list(res), "real_ceiling": pool([object_fidelity(e["real"], lab, model)
                                                          for e, lab in zip(episodes, labels)])}
    out["sim_render"] = pool([object_fidelity(e["sim"], lab, model) for e, lab in zip(episodes, labels)])
    for m, gs in gens.items():
        out[m] = pool([object_fidelity(g, lab, model) for g, lab in zip(gs, labels)])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/translator/tiny.yaml")
    p.add_argument("--data", nargs="+", default=None,
                   help="paired LeRobot dataset(s), the first holds the held-out episodes; 'lab': the lab pairs "
                        "in --pairs (made by `comsim lab pairs` if missing); default: synthetic pairs")
    p.add_argument("--pairs", type=Path, default=Path("runs/lab_pairs"), help="lab pairs folder (--data lab)")
    p.add_argument("--push", type=int, default=20, help="lab pairs to make: push episodes")
    p.add_argument("--stack", type=int, default=10, help="lab pairs to make: stack episodes")
    p.add_argument("--pairs-seed", type=int, default=0)
    p.add_argument("--mode", default="physics", choices=["kinematic", "physics"], help="twin replay mode")
    p.add_argument("--no-preload", action="store_true", help="decode windows from the videos at every step")
    p.add_argument("--camera", default=None, help="camera short name (default: the config's)")
    p.add_argument("--model", default=None, help="a trained pipeline folder: skip training")
    p.add_argument("--out", default="runs/bench-translator")
    p.add_argument("--fid-frames", type=int, default=300, help="frames per side for FID at native resolution "
                   "(0: skip FID)")
    p.add_argument("--frames", type=int, default=24, help="frames per held-out episode scored")
    p.add_argument("--num-steps", type=int, default=None, help="sampling steps (default: the config's)")
    p.add_argument("--overlap", type=int, default=None, help="frames shared by consecutive windows (default: the "
                   "config's sampling.overlap)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--validation-episodes", type=int, default=0,
                   help="the first N held-out episodes choose the composed guidance weights (--weights-grid) and "
                        "are then left out of every score; the others are the test episodes")
    p.add_argument("--weights-grid", nargs="+", default=["0.25:1", "0.5:1", "1:1", "0.25:1.25", "0.5:1.25", "1:1.5"],
                   help="W_ACTION:W_SIM settings scored on the validation episodes (with --validation-episodes)")
    p.add_argument("--action-control", action="store_true",
                   help="composed samples with each held-out episode's own actions vs another's, scored on the robot "
                        "region (paired data with the lab's truth or the twin's labels)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out (the "
                   "train_* numbers then cover the resumed part only)")
    p.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = [f"train.output_dir={args.out}", *args.overrides]
    data = args.data
    if data == ["lab"]:
        data = lab_pairs(args.pairs, args)
    if data:
        overrides.append(f"data.paths=[{','.join(data)}]")
        if not args.no_preload:
            overrides.append("data.preload=true")
    if args.camera:
        overrides.append(f"data.camera={args.camera}")
    cfg = load_train_config(args.config, overrides)
    synthetic = not cfg.data.paths

    result = {"bench": "translator", "data": data or "synthetic", "config": args.config,
              "resolution": list(cfg.data.resolution), "overrides": args.overrides}
    t0 = time.time()
    if args.model:
        model_dir = Path(args.model)
    else:
        load0, cpu0 = os.getloadavg()[0], time.process_time()
        model_dir = train(cfg, resume_from_checkpoint="latest" if args.resume else None)
        wall, cpu = time.time() - t0, time.process_time() - cpu0
        result["train_minutes"] = round(wall / 60, 2)
        result["train_cpu_minutes"] = round(cpu / 60, 2)
        result["train_cores_used"] = round(cpu / max(wall, 1e-9), 2)
        result["loadavg_1min_start_end"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    episodes = held_out_episodes(cfg, args.frames)
    validation, episodes = episodes[:args.validation_episodes], episodes[args.validation_episodes:]
    if not episodes:
        raise SystemExit(f"--validation-episodes {args.validation_episodes} leaves no test episode of "
                         f"data.val_episodes={cfg.data.val_episodes}")
    pipe = TranslatorPipeline.from_pretrained(model_dir, expect={"camera": cfg.data.camera,
                                                                 "action_dim": episodes[0]["action"].shape[1]})
    steps = pipe.provenance.get("steps")
    if steps and "train_minutes" in result:
        result["steps"] = steps
        result["s_per_step"] = round(result["train_minutes"] * 60 / steps, 3)
        result["cpu_s_per_step"] = round(result["train_cpu_minutes"] * 60 / steps, 3)

    sc = cfg.sampling
    n_steps = args.num_steps or sc.num_steps
    overlap = args.overlap if args.overlap is not None else sc.overlap  # None: half a window
    weights = (sc.w_action, sc.w_sim)
    if validation:  # composed weights chosen on the validation episodes only (PSNR per frame, then the mean)
        rows = []
        for setting in args.weights_grid:
            wa, ws = (float(v) for v in setting.split(":"))
            gen = [pipe(ep["sim"], ep["action"], SamplingParams(n_steps, wa, ws, overlap), seed=i,
                        controls=first_frames(ep["controls"], None)) for i, ep in enumerate(validation)]
            rows.append({"w_action": wa, "w_sim": ws, "psnr": round(mean_psnr(zip(gen, (e["real"] for e in validation))), 3)})
        best = max(rows, key=lambda r: r["psnr"])
        weights = (best["w_action"], best["w_sim"])
        result["weights_chosen_on_validation"] = {"episodes": [int(e["episode"]) for e in validation], "rows": rows}
    modes = {"action_only": (1.0, 0.0), "sim_only": (0.0, 1.0), "composed": weights}
    gens = {m: [] for m in modes}
    t1 = time.time()
    for i, ep in enumerate(episodes):
        for m, (wa, ws) in modes.items():
            gens[m].append(pipe(ep["sim"], ep["action"], SamplingParams(n_steps, wa, ws, overlap), seed=i,
                                controls=first_frames(ep["controls"], None)))
    result["psnr"] = {"sim": round(mean_psnr((e["sim"], e["real"]) for e in episodes), 2)}
    for m, gs in gens.items():
        result["psnr"][m] = round(mean_psnr((g, e["real"]) for g, e in zip(gs, episodes)), 2)
    if not synthetic:
        native = native_scores(cfg, pipe, episodes, gens, args.fid_frames)
        result["psnr_native"], result["fid_native"] = native["psnr"], native.get("fid")
        result["object_fidelity"] = held_out_fidelity(cfg, episodes, {"composed": gens["composed"]})
        masks = robot_masks(cfg, episodes)
        result["baselines"] = baseline_scores(cfg, pipe, episodes, gens, args.fid_frames, masks=masks)
        if args.action_control:
            result["action_control"] = None if masks is None or len(episodes) < 2 else action_control(
                pipe, episodes, masks[0], SamplingParams(n_steps, *weights, overlap), token_px(pipe),
                own=gens["composed"])
    result["gain_db_over_sim"] = round(result["psnr"]["composed"] - result["psnr"]["sim"], 2)
    result.update({"held_out_episodes": len(episodes), "frames_per_episode": [len(e["real"]) for e in episodes],
                   "num_steps": n_steps, "overlap": pipe.resolve_overlap(overlap),
                   "weights": {"w_action": weights[0], "w_sim": weights[1]}})

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
                gen = pipe(ep["sim"][:n], other["action"][:n], SamplingParams(n_steps, w_action=wa, w_sim=0.0),
                           seed=100 + i, controls=first_frames(ep["controls"], n))
                got.append(arm_placement(gen, other["action"][:n]))
                chance.append(arm_placement(ep["real"][:n], other["action"][:n]))
                ceiling.append(arm_placement(other["real"][:n], other["action"][:n]))
            mean = lambda rs, k: round(float(np.mean([r[k] for r in rs])), 3)  # noqa: E731
            result["action_consistency"][f"w_action={wa:g}"] = {"iou": mean(got, "iou"),
                                                                 "centroid_err_px": mean(got, "centroid_err_px")}
        result["action_consistency"].update({"chance_iou": mean(chance, "iou"),
                                             "chance_centroid_err_px": mean(chance, "centroid_err_px"),
                                             "real_iou": mean(ceiling, "iou")})
    elif len(episodes) > 1:
        result["action_consistency"] = lab_action_consistency(cfg, pipe, episodes, n_steps)  # None: no seg labels
    else:
        result["action_consistency"] = None
    result["eval_minutes"] = round((time.time() - t1) / 60, 2)
    ps = result["psnr"]
    native = result.get("psnr_native") or ps
    fidn = result.get("fid_native") or {}
    fidelity = (result.get("object_fidelity") or {}).get("composed", {})
    moving = ((result.get("action_consistency") or {}).get("w_action=1") or {}).get("iou_moving")
    result["targets"] = {"native_composed_ge_sim_plus_7db": native["composed"] >= native["sim"] + 7.0,
                         "native_composed_ge_sim_only": native["composed"] >= native["sim_only"],
                         "native_fid_le_half_of_sim": bool(fidn) and fidn["composed"] <= fidn["sim"] / 2,
                         "moving_iou_ge_0.35": moving is not None and moving >= 0.35,
                         "cube_within_2px_ge_90pct": fidelity.get("object_within", 0.0) >= 0.9,
                         "train_le_20min": result.get("train_minutes", 0.0) <= 20.0}
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
