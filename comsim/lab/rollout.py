"""Closed-loop scoring of a policy in the lab: N seeded trials, success rate, Wilson 95% interval.

    policy = load_policy("runs/exp/arms/real-1a2b/policy")   # comsim.policy.policies
    res = evaluate(policy, task="push", n_trials=50, panel="ood")

``policy`` is any object with ``eval()``, ``reset()`` and ``select_action(obs, generator,
num_inference_steps=None)`` returning an absolute joint + gripper target (``comsim.policy.Policy``).
    res["success_rate"], res["ci95"]

Panels: ``id`` starts the objects where the demonstrations started (the task's regions in
the lab cell); ``ood`` starts the task's main object (push: the cube, stack: the top cube)
in boxes just outside its region (beyond it, before it, and out to the side), one box per
trial in turn; ``custom`` takes region overrides from the config. A panel is the lab cell
with other regions, so the policy meets the lab's own look and physics, built by
``LabEnv`` itself. Trial i starts from lab seed ``episode_seed(seed, i)`` (layout, sensor
noise) and samples its diffusion noise from a generator seeded with the same number: the
same policy and seed give the same result. The policy executes ``n_action_steps`` of each
predicted chunk, then re-plans; a trial ends at success or at the timeout.

Each trial's record holds ``seed``, ``success``, the main object's ``start_xy`` and
``final_xy`` (m, table frame), the goal's ``target_xy`` (push: the target's centre; null
when the task has no fixed goal), ``final_distance`` to it, every object's start and final
x, y, and ``video``: the path of its mp4 relative to ``video_dir``'s parent (the arm's
folder in an experiment), or null. With a ``video_dir``, the first successful and the first
failed trial of the panel are always saved, besides the first ``videos`` trials.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from comsim.config import ConfigError
from comsim.lab.cell import LabCell, Region, load_lab_cell
from comsim.lab.env import LabEnv
from comsim.episode import episode_seed


@dataclass
class PanelConfig:
    """Where the objects start in a closed-loop panel."""
    kind: str = "id"  # id: the task's own regions | ood: boxes just outside them | custom: `layouts`
    ood_margin: float = 0.01  # m between the in-distribution region and an OOD box
    ood_width: float = 0.06  # m: depth of each OOD box
    layouts: list[dict[str, Region]] = field(default_factory=list)  # custom: region overrides, one per box
    # trials on this panel; None: the experiment's eval.n_trials. Trial i is the same trial whatever the count,
    # so a panel grown from 50 to 100 trials reuses its first 50
    n_trials: int | None = None

    def __post_init__(self):
        if self.n_trials is not None and (isinstance(self.n_trials, bool) or not isinstance(self.n_trials, int)
                                          or self.n_trials < 1):
            raise ConfigError(f"n_trials: expected an integer >= 1 or null, got {self.n_trials!r}")
        if self.kind not in ("id", "ood", "custom"):
            raise ConfigError(f"kind: expected id | ood | custom, got {self.kind!r}")
        if self.kind == "custom" and not self.layouts:
            raise ConfigError("layouts: a custom panel needs at least one layout")


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (well-behaved at 0/n and n/n)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def trial_seeds(seed: int, n: int) -> list[int]:
    return [episode_seed(seed, i) for i in range(n)]


def main_object(cell: LabCell, task: str) -> str:
    cfg = getattr(cell.tasks, task)
    return cfg.cube if task == "push" else cfg.top


def panel_layouts(cell: LabCell, task: str, panel: PanelConfig) -> list[dict[str, Region]]:
    """Region overrides per box of a panel ([{}] = the task's own regions)."""
    if panel.kind == "id":
        return [{}]
    if panel.kind == "custom":
        return [dict(layout) for layout in panel.layouts]
    obj = main_object(cell, task)
    regions = getattr(cell.tasks, task).regions
    if obj not in regions:
        raise ValueError(f"tasks.{task}.regions has no region for {obj!r}: cannot place an OOD panel outside it")
    r, m, w = regions[obj], panel.ood_margin, panel.ood_width
    (x0, x1), (y0, y1) = r.x, r.y
    side = [y0 - m - w, y0 - m] if (y0 + y1) / 2 < 0 else [y1 + m, y1 + m + w]  # away from the middle
    boxes = [Region(x=[x1 + m, x1 + m + w], y=[y0, y1], yaw=list(r.yaw)),  # beyond (farther from the robot)
             Region(x=[x0 - m - w, x0 - m], y=[y0, y1], yaw=list(r.yaw)),  # before (closer to the robot)
             Region(x=[x0, x1], y=side, yaw=list(r.yaw))]  # out to the side
    return [{obj: b} for b in boxes]


def panel_cell(cell: LabCell, task: str, layout: dict[str, Region]) -> LabCell:
    if not layout:
        return cell
    cell = copy.deepcopy(cell)
    regions = getattr(cell.tasks, task).regions
    for name, region in layout.items():
        if name not in regions:
            raise ValueError(f"panel layout: no object {name!r} in tasks.{task}.regions {sorted(regions)}")
        regions[name] = region
    return cell


def evaluate(policy, task: str = "push", n_trials: int = 10, seeds: list[int] | None = None,
             panel: str | PanelConfig = "id", cell: LabCell | str | Path | None = None, seed: int = 100_000,
             max_seconds: float | None = None, num_inference_steps: int | None = None,
             video_dir: str | Path | None = None, videos: int = 0, progress: bool = True,
             trial_log: str | Path | None = None) -> dict:
    """Run ``n_trials`` closed-loop trials of ``policy`` in the lab; returns the panel's results.

    ``trial_log``: a JSON-lines file that gets each finished trial at once; trials already in
    it (same index and seed) are not run again, so a killed evaluation resumes where it
    stopped and its partial results can be read meanwhile. A trial depends only on the
    policy, the panel and its seed: keep one log per policy and panel."""
    panel_cfg = panel if isinstance(panel, PanelConfig) else PanelConfig(kind=panel)
    name = panel if isinstance(panel, str) else panel_cfg.kind
    base = cell if isinstance(cell, LabCell) else load_lab_cell(cell)
    seeds = list(seeds) if seeds is not None else trial_seeds(seed, n_trials)
    if len(seeds) != n_trials:
        raise ValueError(f"evaluate: {len(seeds)} seeds for {n_trials} trials")
    layouts = panel_layouts(base, task, panel_cfg)
    obj = main_object(base, task)
    target = [float(v) for v in base.tasks.push.target] if task == "push" else None
    policy.eval()
    saved = {True: False, False: False}  # a video of a success / of a failure is written
    logged = _read_trial_log(trial_log)
    trials, t0 = [], time.time()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=n_trials, desc=f"eval {task}/{name}", unit="trial")
    for b, layout in enumerate(layouts):
        mine = list(range(b, n_trials, len(layouts)))  # trial i uses box i % len(layouts)
        if not mine:
            continue
        with LabEnv(panel_cell(base, task, layout), task) as env:
            limit = env.max_frames if max_seconds is None else min(env.max_frames, math.ceil(max_seconds * env.fps))
            for i in mine:
                if (i, int(seeds[i])) in logged:
                    trial = logged[(i, int(seeds[i]))]
                    saved[trial["success"]] |= trial["video"] is not None
                    trials.append(trial)
                    if bar is not None:
                        bar.update(1)
                    continue
                trial, frames = _trial(policy, env, seeds[i], i, b, limit, num_inference_steps, obj, target,
                                       keep_frames=video_dir is not None)
                trial["video"] = None
                if frames is not None and (i < videos or not saved[trial["success"]]):
                    from comsim.io.video import write_video
                    path = Path(video_dir) / f"{name}_trial{i:03d}_{'success' if trial['success'] else 'failure'}.mp4"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_video(path, frames, env.fps)
                    trial["video"] = path.relative_to(Path(video_dir).parent).as_posix()
                    saved[trial["success"]] = True
                trials.append(trial)
                if trial_log is not None:
                    with open(trial_log, "a") as f:  # one line per trial: a kill loses at most the running one
                        f.write(json.dumps(trial) + "\n")
                        f.flush()
                        os.fsync(f.fileno())
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(success=sum(t["success"] for t in trials))
    if bar is not None:
        bar.close()
    trials.sort(key=lambda t: t["trial"])
    k = sum(t["success"] for t in trials)
    lo, hi = wilson_interval(k, n_trials)
    return {"panel": name, "kind": panel_cfg.kind, "task": task, "n_trials": n_trials, "successes": k,
            "success_rate": k / n_trials, "ci95": [lo, hi], "layouts": [
                {o: {"x": r.x, "y": r.y, "yaw": r.yaw} for o, r in lay.items()} for lay in layouts],
            "max_frames": limit, "wall_s": time.time() - t0, "trials": trials}


def _trial(policy, env: LabEnv, seed: int, index: int, box: int, limit: int, steps: int | None, obj: str,
           target: list[float] | None, keep_frames: bool) -> tuple[dict, np.ndarray | None]:
    obs = env.reset(seed)
    start = _object_xy(env)
    policy.reset()
    gen = torch.Generator().manual_seed(int(seed))
    frames = [obs["image"]] if keep_frames else None
    success, n = False, 0
    for n in range(1, limit + 1):
        action = policy.select_action(obs, gen, num_inference_steps=steps)
        action[7] = np.clip(action[7], 0.0, 1.0)  # gripper command in [0, 1] (CONTRACTS.md)
        obs, success, done = env.step(action)
        if frames is not None:
            frames.append(obs["image"])
        if success or done:
            break
    final = _object_xy(env)
    dist = None if target is None else round(float(np.hypot(*np.subtract(final[obj], target))), 4)
    return ({"trial": index, "seed": int(seed), "box": box, "success": bool(success), "steps": n,
             "start_xy": start[obj], "final_xy": final[obj], "target_xy": target, "final_distance": dist,
             "objects_start_xy": start, "objects_final_xy": final},
            np.stack(frames) if frames is not None else None)


def _read_trial_log(path: str | Path | None) -> dict[tuple[int, int], dict]:
    if path is None or not Path(path).is_file():
        return {}
    done, text = {}, Path(path).read_text()
    if text and not text.endswith("\n"):  # a line cut by a kill: the next trial starts on a line of its own
        with open(path, "a") as f:
            f.write("\n")
    for line in text.splitlines():
        try:
            t = json.loads(line)
        except json.JSONDecodeError:  # the last line, cut by a kill
            continue
        done[(int(t["trial"]), int(t["seed"]))] = t
    return done


def _object_xy(env: LabEnv) -> dict[str, list[float]]:
    return {name: [round(float(v), 4) for v in p[:2]] for name, p in env.truth().object_pos.items()}
