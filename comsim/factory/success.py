"""Success predicates: judged on the final simulated state, never on what the expert intended.

A task's ``success:`` list is a conjunction; each entry names a predicate and its
parameters. ``evaluate`` returns the overall flag and each check's own verdict (kept in the
episode's provenance, so a failure says which condition was not met).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from dataclasses import dataclass

import numpy as np

from comsim.factory.params import Param
from comsim.sim.scene import geom_labels

REST_Z_TOL = 0.01  # m: resting on its support, not balanced on an edge or still in the air


@dataclass
class SceneState:
    """What the predicates read: object centres, gripper opening, object-robot contacts."""
    pos: dict[str, np.ndarray]
    quat: dict[str, np.ndarray]
    gripper_width: float
    touching_robot: dict[str, bool]


def scene_state(scene) -> SceneState:
    m, d = scene.model, scene.data
    robot = geom_labels(m) == 1
    pairs = np.asarray(d.contact.geom)[:d.ncon].reshape(-1, 2)
    robot_pairs = pairs[robot[pairs].any(axis=1)] if len(pairs) else pairs
    touching, pos, quat = {}, {}, {}
    for name in scene.object_names:
        g = m.geom("object/" + name).id
        touching[name] = bool(np.any(robot_pairs == g))
        pos[name], quat[name] = scene.object_pose(name)
    return SceneState(pos, quat, float(scene.get_state()[7]), touching)


class Predicate(ABC):
    params: dict[str, Param] = {}

    @abstractmethod
    def __call__(self, s: SceneState, setup, p: dict) -> bool:
        """Each subclass says how."""


class Stacked(Predicate):
    """``top`` rests on ``base``: centred within ``tolerance`` (default half the base's footprint)."""
    params = {"top": Param("object"), "base": Param("object"),
              "tolerance": Param("float", None, (0.002, 0.1), "m between the centres, horizontally")}

    def __call__(self, s, setup, p):
        top, base = p["top"].name, p["base"].name
        t, b = setup.roles[top], setup.roles[base]
        tol = b.footprint / 2 if p["tolerance"] is None else p["tolerance"][0]
        centred = np.linalg.norm(s.pos[top][:2] - s.pos[base][:2]) <= tol
        rest_z = s.pos[base][2] + b.half_height + t.half_height
        return bool(centred and abs(s.pos[top][2] - rest_z) < REST_Z_TOL)


class Released(Predicate):
    """The hand has let go of ``object``: no contact, fingers opened wider than the object."""
    params = {"object": Param("object")}

    def __call__(self, s, setup, p):
        name = p["object"].name
        return bool(not s.touching_robot[name] and s.gripper_width >= setup.roles[name].grasp_width + 0.005)


class At(Predicate):
    """``object`` rests on the table with its centre within ``radius`` of a target or point."""
    params = {"object": Param("object"), "target": Param("place", doc="target or [x, y]"),
              "radius": Param("float", None, (0.005, 0.2), "m (default: the target's radius, or 0.04)")}

    def __call__(self, s, setup, p):
        name, ref = p["object"].name, p["target"]
        xy = setup.targets[ref.name] if ref.kind == "target" else np.asarray(ref.point[:2])
        radius = p["radius"][0] if p["radius"] is not None else (
            setup.target_radius[ref.name] if ref.kind == "target" else 0.04)
        on_table = abs(s.pos[name][2] - setup.roles[name].half_height) < REST_Z_TOL
        return bool(on_table and np.linalg.norm(s.pos[name][:2] - xy) <= radius)


class Lifted(Predicate):
    """``object`` is held in the air: its bottom at least ``height`` above the table, in the hand."""
    params = {"object": Param("object"), "height": Param("float", 0.05, (0.005, 0.4), "m")}

    def __call__(self, s, setup, p):
        name = p["object"].name
        bottom = s.pos[name][2] - setup.roles[name].half_height
        return bool(bottom >= p["height"][0] and s.touching_robot[name])


PREDICATES: dict[str, Predicate] = {"stacked": Stacked(), "released": Released(), "at": At(), "lifted": Lifted()}


def evaluate(program, setup, scene) -> tuple[bool, dict[str, bool]]:
    """(all checks pass, {"<predicate>@<line>": verdict})."""
    return judge(program, setup, scene_state(scene))


def judge(program, setup, s: SceneState) -> tuple[bool, dict[str, bool]]:
    """``evaluate`` on a state given as numbers (e.g. the last frame of a demonstration's replay)."""
    verdicts = {f"{c.predicate}@{c.line}": PREDICATES[c.predicate](s, setup, c.params) for c in program.success}
    return all(verdicts.values()), verdicts
