"""Render throughput of the twin cell (frames/s), one renderer in this process.

Each case is a function returning {"name": fps}; add cases to CASES. ``lab_*``: the lab
camera with shadows on (2 shadow-casting lights, 1024 shadow map) at 128x128. The robot moves between frames so the scene is re-posed each
time, as in a replay. Prints ONE JSON object as its last line.

    MUJOCO_GL=egl python bench/render.py [--frames 300] [--config configs/twin/panda_cell.yaml]

llvmpipe starts one render thread per core unless LP_NUM_THREADS says otherwise (the factory's workers set 1):
`LP_NUM_THREADS=1 python bench/render.py` measures one thread; two copies started together (`... & ... & wait`)
measure a process per core. The JSON names the thread count it ran with (null: llvmpipe's default).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from comsim.config import PANDA_CELL
from comsim.sim.render import SceneRenderer
from comsim.sim.scene import Scene
from comsim.sim.spec import load_scene_spec


def twin_fps(config: Path, visual: str, size: int, frames: int) -> float:
    """RGB frames/s of the spec's first camera at size x size, arm moving every frame."""
    spec = load_scene_spec(config, [f"robot.visual={visual}"])
    scene = Scene(spec)
    cam = spec.cameras[0].name
    q0 = np.asarray(spec.robot.init_qpos)
    with SceneRenderer(scene, cam, size, size) as r:
        for _ in range(5):  # warm-up: first frames upload meshes and textures
            r.rgb()
        t0 = time.perf_counter()
        for i in range(frames):
            scene.set_robot_qpos(q0 + 0.3 * np.sin(0.05 * i), 0.08)
            r.rgb()
        return frames / (time.perf_counter() - t0)


def twin_cases(config: Path, frames: int) -> dict[str, float]:
    return {
        "twin_light_128_fps": twin_fps(config, "light", 128, frames),
        "twin_light_256_fps": twin_fps(config, "light", 256, frames),
        "twin_full_128_fps": twin_fps(config, "full", 128, max(frames // 3, 30)),
    }


def lab_cases(config: Path, frames: int) -> dict[str, float]:
    """The lab's camera at 128x128 with shadows on (its own cell, not ``config``): the
    shadowed render alone (144x144: 8 px of lens margin per side), and the full
    observation (render + lens + sensor + JPEG), which is what LabEnv.step costs."""
    from comsim.lab import LabEnv

    n = max(frames // 3, 30)  # shadows cost ~10x
    with LabEnv(task="push") as env:
        scene, cam = env.scene, env.camera
        assert env.cell.scene.render.shadows and cam.width == cam.height == 128
        q0 = np.asarray(env.cell.scene.robot.init_qpos)
        rng = np.random.default_rng(0)
        out = {}
        for name, draw in (("lab_shadows_128_fps", cam.clean), ("lab_observation_128_fps", lambda: cam.rgb(rng))):
            for _ in range(5):
                draw()
            t0 = time.perf_counter()
            for i in range(n):
                scene.set_robot_qpos(q0 + 0.3 * np.sin(0.05 * i), 0.08)
                draw()
            out[name] = n / (time.perf_counter() - t0)
    return out


CASES = [twin_cases, lab_cases]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--config", type=Path, default=PANDA_CELL)
    args = ap.parse_args(argv)
    results: dict[str, float] = {}
    for case in CASES:
        results.update({k: round(v, 1) for k, v in case(args.config, args.frames).items()})
    results["cpu_count"] = os.cpu_count()
    results["llvmpipe_threads"] = os.environ.get("LP_NUM_THREADS")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
