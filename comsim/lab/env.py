"""LabEnv: the lab in closed loop, one camera frame per step.

    env = LabEnv(task="push")          # built-in cell (configs/lab/default.yaml)
    obs = env.reset(seed=3)            # {"image": uint8 (H, W, 3), "state": float32 (8,)}
    obs, success, done = env.step(action)   # action (8,): 7 joint targets + gripper (1 = open)

An action is held for one frame (1/fps s = several control steps of the sim): the same
zero-order hold as ``Scene.step``, so a twin replaying the recorded actions drives its
servos the same way. ``success`` is the task predicate on the state after the step;
``done`` is the time limit. Recording (``comsim.lab.record``) runs this same env, so a
policy scored here meets exactly what the demonstrations met.

``truth()`` returns the hidden state (object poses, contacts) that only the scripted
operator and evaluators may use.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from comsim.config import ConfigError
from comsim.lab.cell import LabCell, load_lab_cell
from comsim.lab.look import LabCamera, apply_look
from comsim.lab.tasks import TaskState, make_task
from comsim.sim.scene import OBJECT_PREFIX, Scene, build_mjspec, geom_labels

# Streams of randomness drawn from an episode seed: layout, sensor noise, operator.
LAYOUT_STREAM, SENSOR_STREAM, OPERATOR_STREAM = 0, 1, 2


class LabEnv:
    def __init__(self, cell: LabCell | str | Path | None = None, task: str = "push", fps: int | None = None):
        self.cell = cell if isinstance(cell, LabCell) else load_lab_cell(cell)
        self.task = make_task(task, self.cell)
        self.fps = int(fps or self.cell.fps)
        ms = build_mjspec(self.cell.scene)
        apply_look(ms, self.cell)
        self.task.decorate(ms)
        self.scene = Scene(self.cell.scene, mjspec=ms)
        steps = 1.0 / (self.fps * self.scene.control_dt)
        if abs(steps - round(steps)) > 1e-6 or round(steps) < 1:
            raise ConfigError(f"fps: {self.fps} frames/s is not a whole number of control steps of "
                              f"{self.scene.control_dt:g} s; use e.g. 10, 25 or 50")
        self.control_steps_per_frame = round(steps)
        self.max_frames = math.ceil(self.task.cfg.max_seconds * self.fps)
        self.camera = LabCamera(self.scene, self.cell)
        self._robot_geom = geom_labels(self.scene.model) == 1
        m = self.scene.model
        self._object_geoms = {n: m.geom(OBJECT_PREFIX + n).id for n in self.scene.object_names}
        self.frame = 0
        self.seed: int | None = None
        self._sensor_rng = np.random.default_rng(0)

    @property
    def task_name(self) -> str:
        return self.task.name

    # ------------------------------------------------------------ closed loop

    def reset(self, seed: int) -> dict:
        """New episode: objects placed from ``seed``, robot at home; returns the first observation."""
        self.seed = int(seed)
        layout = self.task.sample_layout(np.random.default_rng([self.seed, LAYOUT_STREAM]))
        self.scene.reset(object_poses=layout)
        self._sensor_rng = np.random.default_rng([self.seed, SENSOR_STREAM])
        self.frame = 0
        return self.observe()

    def step(self, action) -> tuple[dict, bool, bool]:
        """Hold ``action`` for one frame; returns (observation, success, done)."""
        if self.seed is None:
            raise RuntimeError("LabEnv.step: call reset(seed) first")
        if self.frame >= self.max_frames:
            raise RuntimeError(f"LabEnv.step: the episode is over (time limit {self.max_frames} frames); reset")
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (8,) or not np.all(np.isfinite(a)):
            raise ValueError(f"LabEnv.step: expected a finite action of shape (8,), got {a.shape}")
        self.scene.step(a, n_substeps=self.control_steps_per_frame * self.scene.spec.physics.substeps)
        self.frame += 1
        return self.observe(), self.success(), self.frame >= self.max_frames

    def observe(self) -> dict:
        return {"image": self.camera.rgb(self._sensor_rng), "state": self.scene.get_state().astype(np.float32)}

    def success(self) -> bool:
        return self.task.success(self.truth())

    # ------------------------------------------------------------ hidden truth

    def truth(self) -> TaskState:
        d = self.scene.data
        pairs = np.asarray(d.contact.geom)[:d.ncon].reshape(-1, 2)
        robot_pairs = pairs[self._robot_geom[pairs].any(axis=1)]  # contacts with a robot geom
        touching = {n: bool(np.any(robot_pairs == g)) for n, g in self._object_geoms.items()}
        poses = {n: self.scene.object_pose(n) for n in self.scene.object_names}
        return TaskState(object_pos={n: p for n, (p, _) in poses.items()},
                         object_quat={n: q for n, (_, q) in poses.items()},
                         gripper_width=float(self.scene.get_state()[7]), touching_robot=touching)

    def segmentation(self) -> np.ndarray:
        """Labels (CONTRACTS.md) in the recorded image geometry: for evaluators, never recorded."""
        return self.camera.segmentation()

    def close(self) -> None:
        self.camera.close()

    def __enter__(self) -> "LabEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
