"""Whose motions does a policy know? Its offline error on new lab episodes, seen three ways.

New lab push episodes (a seed no arm trained on) are replayed in the run's twin and translated by the run's
translator, so the same actions and states come with three views: the lab's frames, the raw twin render and
the pseudo-real translation. On every ``--stride``-th frame a policy predicts its chunk of ``horizon`` joint
targets; the error is the L1 to the demonstrator's actions over the chunk, averaged over frames and episodes, on
one scale for every policy: each action dimension's range over the probe's episodes mapped to [-1, 1] (a
dimension the demonstrator never moves is left out and named; padding past the episode's end is left out).

- lab frames vs raw twin vs pseudo-real: what the look costs the policy;
- a policy trained on scripted-factory episodes vs one on demo-derived ones (``comsim generate --from-demos``),
  on the same lab episodes: whether the demonstrator's style is what was missing.

    MUJOCO_GL=egl .venv/bin/python bench/style_probe.py runs/lab_table \\
        --policy scripted=runs/lab_table/policy/arms/pseudo200-XXXX/policy \\
        --policy demo_derived=runs/lab_table/policy/arms/demo_pseudo200-XXXX/policy [--episodes 20]

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from comsim.episode import resize_frames
from comsim.io.keys import control_key, sim_key
from comsim.io.lerobot import LeRobotDataset
from comsim.pipeline import stages
from comsim.policy.policies import load_policy
from comsim.run_layout import RunLayout
from comsim.twin.selfcheck import ON_UNRELIABLE
from comsim.translator.pipeline import TranslatorPipeline

VIEWS = ("lab", "raw_twin", "pseudo_real")


@torch.no_grad()
def chunk_l1(policy, frames: np.ndarray, state: np.ndarray, action: np.ndarray, stride: int,
             scale: tuple[np.ndarray, np.ndarray]) -> float:
    """Mean L1 between the policy's chunks and the demonstrated actions, every ``stride`` frames, over the action
    dimensions of ``scale`` = (dims, half of their range)."""
    cfg = policy.config
    T = len(action)
    errors = []
    for t in range(0, T, stride):
        obs = np.clip(np.arange(cfg.n_obs_steps) - (cfg.n_obs_steps - 1) + t, 0, T - 1)
        images = torch.from_numpy(resize_frames(frames[obs], cfg.image_size)).permute(0, 3, 1, 2)[None]
        pred = policy.sample_actions(images, torch.from_numpy(state[obs].astype(np.float32))[None],
                                     torch.Generator().manual_seed(t))[0]
        idx = np.arange(cfg.horizon) - (cfg.n_obs_steps - 1) + t
        keep = (idx >= 0) & (idx < T)
        target = action[np.clip(idx, 0, T - 1)]
        dims, half_range = scale
        err = (np.abs(pred.numpy()[:, dims] - target[:, dims]) / half_range).mean(-1)
        errors.append(float(err[keep].mean()))
    return float(np.mean(errors))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a `comsim demo` / `make lab-table` run folder (its twin and translator)")
    ap.add_argument("--policy", action="append", required=True, metavar="NAME=DIR", help="a saved policy (repeatable)")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=300_000, help="lab seed of the probe episodes (no arm trained on it)")
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--out", default=None, help="default: RUN/style_probe")
    ap.add_argument("--cell", default=None, help="the run's lab cell (default: the built-in lab)")
    ap.add_argument("--on-unreliable", choices=ON_UNRELIABLE, default="refuse",
                    help="a twin that fails its self-check on the probe's recording: refuse (the default) or mark "
                         "its episodes and go on, as the run itself did")
    a = ap.parse_args(argv)
    run = RunLayout(a.run)
    out = Path(a.out or run.root / "style_probe")
    lab = stages.record_lab(out / "lab", "push", a.episodes, seed=a.seed, cell=a.cell, calibration_stills=12)
    paired = out / "paired"
    stages.align_twin(lab, run.paired / "twin_aligned.yaml", paired, out / "twin_summary.json",
                      on_unreliable=a.on_unreliable)
    pd = LeRobotDataset(paired)
    pipe = TranslatorPipeline.from_pretrained(run.translator_final)
    cams = ["front", sim_key("front"), *(control_key("front", c) for c in pipe.controls)]
    translated = [pipe.translate_episode(pd.read_episode(e, cameras=cams), seed=e).frames["front"] for e in range(len(pd))]
    policies = dict(p.split("=", 1) for p in a.policy)
    actions = np.concatenate([pd.read_columns(e, ["action"])["action"] for e in range(len(pd))])
    lo, hi = actions.min(0), actions.max(0)
    dims = np.flatnonzero(hi - lo > 1e-6)
    scale = (dims, (hi - lo)[dims] / 2)
    result = {"bench": "style_probe", "run": str(run.root), "episodes": a.episodes, "lab_seed": a.seed,
              "stride": a.stride, "action_dims_scored": dims.tolist(),
              "action_dims_left_out": [int(d) for d in np.flatnonzero(hi - lo <= 1e-6)], "policies": {}}
    for name, path in policies.items():
        pol = load_policy(path).eval()
        per_view = {v: [] for v in VIEWS}
        for e in range(len(pd)):
            ep = pd.read_episode(e, cameras=["front", sim_key("front")])
            views = {"lab": ep.frames["front"], "raw_twin": ep.frames[sim_key("front")],
                     "pseudo_real": resize_frames(translated[e], ep.frames["front"].shape[1:3])}
            for v, frames in views.items():
                per_view[v].append(chunk_l1(pol, frames, ep.state, ep.action, a.stride, scale))
        result["policies"][name] = {"dir": path, **{v: round(float(np.mean(x)), 4) for v, x in per_view.items()}}
        print(json.dumps({name: result["policies"][name]}), flush=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
