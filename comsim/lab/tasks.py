"""The lab's tasks: initial layouts, props, and success predicates on the true scene state.

A task samples object poses from a seed (``sample_layout``), may add props to the scene
(``decorate``: the push target is a flat decal with no collision), and judges a
``TaskState`` (``success``). The predicates only read the state, so an evaluator can
recompute them from the hidden truth files (``comsim.lab.truth``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import dataclass

import mujoco
import numpy as np

from comsim.config import ConfigError
from comsim.lab.cell import LabCell, PushTaskCell, Region, StackTaskCell
from comsim.sim.scene import add_marker, yaw_quat

TARGET_NAME = "push_target"  # a marker (comsim.sim.scene.add_marker): no collision, background in segmentation
GRIPPER_OPEN_WIDTH = 0.06  # m: "released" means the fingers are at least this far apart
STACK_Z_TOL = 0.01  # m: resting on top, not balanced on an edge or still falling
ON_TABLE_Z_TOL = 0.01


@dataclass
class TaskState:
    """The true scene state a success predicate needs."""
    object_pos: dict[str, np.ndarray]  # name -> (3,) centre
    object_quat: dict[str, np.ndarray]  # name -> (4,) w x y z
    gripper_width: float  # m
    touching_robot: dict[str, bool]  # name -> any contact with a robot geom


class Task(ABC):
    name = ""

    def __init__(self, cell: LabCell):
        self.cell = cell
        self.sizes = {o.name: np.asarray(o.size, float) for o in cell.scene.objects}
        self.half_heights = {o.name: o.half_height for o in cell.scene.objects}

    @property
    def cfg(self) -> PushTaskCell | StackTaskCell:
        return getattr(self.cell.tasks, self.name)

    @property
    def instruction(self) -> str:
        return self.cfg.instruction

    def decorate(self, ms: mujoco.MjSpec) -> None:
        """Add task props to the (uncompiled) scene."""

    def sample_layout(self, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Initial object poses {name: (pos, quat)}, resting on the table, by rejection sampling."""
        regions = self.cfg.regions
        for _ in range(1000):
            layout = {}
            for name, region in regions.items():
                layout[name] = self._sample_pose(rng, name, region)
            if self._layout_ok(layout):
                return layout
        raise ConfigError(f"tasks.{self.name}.regions: no layout satisfies the separation constraints "
                          "in 1000 tries; widen the regions or lower min_separation")

    def _sample_pose(self, rng, name: str, region: Region):
        x, y, yaw = (rng.uniform(*getattr(region, k)) for k in ("x", "y", "yaw"))
        return np.array([x, y, self.half_heights[name]]), yaw_quat(yaw)

    def _layout_ok(self, layout) -> bool:
        xy = [p[:2] for p, _ in layout.values()]
        return all(np.linalg.norm(a - b) >= self.cfg.min_separation
                   for i, a in enumerate(xy) for b in xy[i + 1:])

    @abstractmethod
    def success(self, s: TaskState) -> bool:
        """Each subclass says how."""

    def describe(self) -> dict:
        """Task parameters for the truth file."""
        return {"name": self.name, "instruction": self.instruction}


class PushTask(Task):
    """Push ``cube`` until its centre is within ``target_radius`` of the target, on the table."""
    name = "push"

    def decorate(self, ms: mujoco.MjSpec) -> None:
        c = self.cfg
        add_marker(ms, TARGET_NAME, c.target, c.target_radius, c.target_rgba)

    def _layout_ok(self, layout) -> bool:
        cube = layout[self.cfg.cube][0][:2]
        far = np.linalg.norm(cube - self.cfg.target) >= self.cfg.min_start_distance
        return far and super()._layout_ok(layout)

    def success(self, s: TaskState) -> bool:
        c = self.cfg
        pos = s.object_pos[c.cube]
        on_table = abs(pos[2] - self.half_heights[c.cube]) < ON_TABLE_Z_TOL
        return bool(on_table and np.linalg.norm(pos[:2] - np.asarray(c.target)) <= c.target_radius)

    def describe(self) -> dict:
        c = self.cfg
        return {**super().describe(), "cube": c.cube, "target": list(c.target), "target_radius": c.target_radius}


class StackTask(Task):
    """``top`` resting on ``base``: centred within half a side, at the right height, released."""
    name = "stack"

    def success(self, s: TaskState) -> bool:
        c = self.cfg
        top, base = s.object_pos[c.top], s.object_pos[c.base]
        half_side = self.sizes[c.base][0] / 2
        centred = np.linalg.norm(top[:2] - base[:2]) <= half_side
        rest_z = base[2] + self.half_heights[c.base] + self.half_heights[c.top]
        resting = abs(top[2] - rest_z) < STACK_Z_TOL
        released = s.gripper_width >= GRIPPER_OPEN_WIDTH and not s.touching_robot[c.top]
        return bool(centred and resting and released)

    def describe(self) -> dict:
        return {**super().describe(), "top": self.cfg.top, "base": self.cfg.base}


TASKS = {"push": PushTask, "stack": StackTask}


def make_task(name: str, cell: LabCell) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown lab task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](cell)
