"""Primitives of the scripted expert: move, grasp, lift, place, stack, release, push, wait, home.

Each primitive is three things:
- ``params``: its parameters, with defaults and allowed ranges (checked when a task loads);
- ``check_sequence``: what it needs in the hand and leaves there (a ``place`` with nothing
  held is an error at load time, naming the line);
- ``plan``: the TCP poses it will aim at, predicted from the initial layout, so that IK can
  vet a layout before an episode is spent on it;
- ``run``: a generator of actions (8,), one per frame, that reads the TRUE scene state
  between moves (closed loop, like an operator watching the cell) and raises
  ``PrimitiveFailure`` when it can see that it failed (fingers closed on nothing, an object
  dropped), so failures are counted with a reason instead of disappearing.

Motion is top-down: min-jerk moves of the TCP pose through ``CartesianCommander``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from comsim.factory.params import Param, Ref
from comsim.sim.motion import CartesianCommander, nearest_symmetric, object_yaw, push_yaw, unit

MIN_TCP_Z = 0.012  # m: lower and the fingertips scrape the table
GRIPPER_OPEN = 1.0
GRIPPER_CLOSED = 0.0
PUSH_Z = 0.022  # TCP height while pushing: fingertips ~1 cm above the table, mid-cube contact
FINGER_HALF_THICKNESS = 0.0105  # closed fingers, measured along the push direction
MAX_PUSH_STEP = 0.01  # m per frame the hand may move while pushing
STEER_UNTIL = 0.05  # m from the goal: steer towards it until then, then hold the direction
MAX_PUSH_LATERAL = 0.03  # m off the pushing line: the object has slid off the fingers
PUSH_LEAD = 0.015  # m the hand leads into the object while pushing
PUSH_STOP = 0.008  # m before the goal (along the push) at which the stroke stops

HAND_CLEARANCE = 0.22  # m: neighbours closer than this to a grasped object steer the hand's orientation
SPEED = Param("float", 1.0, (0.2, 2.0), "speed factor on the task's nominal TCP speed")


class PrimitiveFailure(RuntimeError):
    """The expert sees that a primitive failed; ``reason`` is a short key for the report."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


# ---------------------------------------------------------------- what a primitive works with


@dataclass
class Expert:
    """The expert's view of an episode: the scene, its object instances, its hand."""
    scene: object  # comsim.sim.Scene
    setup: object  # comsim.factory.layout.EpisodeSetup
    cmd: CartesianCommander
    held: str | None = None

    def see(self, role: str) -> tuple[np.ndarray, np.ndarray]:
        return self.scene.object_pose(role)

    def xy(self, ref: Ref) -> np.ndarray:
        if ref.kind == "object":
            return self.see(ref.name)[0][:2]
        if ref.kind == "target":
            return np.asarray(self.setup.targets[ref.name], dtype=np.float64)
        return np.asarray(ref.point[:2], dtype=np.float64)

    def width(self) -> float:
        return float(self.scene.get_state()[7])


@dataclass
class PlanState:
    """The predicted course of a program from the initial layout (for reachability checks)."""
    setup: object
    tcp: np.ndarray
    yaw: float
    held: str | None = None
    objects: dict = field(default_factory=dict)  # role -> [pos (3,), yaw]
    waypoints: list = field(default_factory=list)  # (pos, yaw, parameter name)

    def aim(self, pos, yaw: float, param: str) -> None:
        self.tcp, self.yaw = np.asarray(pos, dtype=np.float64), float(yaw)
        self.waypoints.append((self.tcp.copy(), self.yaw, param))

    def xy(self, ref: Ref) -> np.ndarray:
        if ref.kind == "object":
            return self.objects[ref.name][0][:2]
        if ref.kind == "target":
            return np.asarray(self.setup.targets[ref.name], dtype=np.float64)
        return np.asarray(ref.point[:2], dtype=np.float64)


def wrist_yaw(angle: float, period: float, current: float, home: float) -> float:
    """The symmetric copy of ``angle`` nearest the current wrist yaw, unless that strays more than
    0.6 pi from the home yaw: then the copy nearest home. (Joint 7 has +-166 deg, and the Panda's
    home posture sits 45 deg off centre, so one direction runs out after ~120 deg.)"""
    yaw = nearest_symmetric(angle, current, period)
    return yaw if abs(yaw - home) <= 0.6 * math.pi else nearest_symmetric(angle, home, period)


def _grasp_yaw(setup, role: str, obj_xy, obj_yaw: float, current: float, neighbours) -> float:
    """Wrist yaw that closes the fingers across the object, keeping the hand clear of neighbours.

    The Panda hand is ~20 cm long along the fingers' closing axis: lowered next to a tall
    stack with that axis pointing at it, it would knock the stack over. A cube can be taken
    with the hand along either of its sides; the side that points the hand away from the
    nearest things wins, then the smaller wrist turn.
    """
    inst = setup.roles[role]
    if inst.shape == "cylinder":
        return current
    if inst.shape == "box":  # only across the narrow side
        offset = 0.0 if inst.size[1] <= inst.size[0] else math.pi / 2
        return wrist_yaw(obj_yaw + offset, math.pi, current, setup.home_yaw)
    options = [wrist_yaw(obj_yaw + k * math.pi / 2, math.pi, current, setup.home_yaw) for k in (0, 1)]

    def crowding(yaw: float) -> float:
        axis = np.array([math.sin(yaw), -math.cos(yaw)])  # fingers close along the TCP y axis
        cost = 0.0
        for xy in neighbours:
            d = np.asarray(xy) - obj_xy
            dist = float(np.linalg.norm(d))
            if 1e-6 < dist < HAND_CLEARANCE:
                cost += abs(axis @ d) / dist * (HAND_CLEARANCE - dist)
        return cost

    return min(options, key=lambda y: (round(crowding(y), 4), abs(y - current)))


# ---------------------------------------------------------------- primitives


class Primitive(ABC):
    name = ""
    params: dict[str, Param] = {}

    def check_sequence(self, step, held: str | None, objects: dict, fail) -> str | None:
        """Static check of what is held before/after; returns what is held after this step."""
        return held

    @abstractmethod
    def plan(self, ps: PlanState, p: dict) -> None:
        """Each subclass says how: advance the planning state (what moves where) without simulating."""

    @abstractmethod
    def run(self, ex: Expert, p: dict) -> Iterator[np.ndarray]:
        """Each subclass says how: yields the actions of this step."""


def _need_held(step, held, fail):
    if held is None:
        fail(step.line, f"{step.primitive}: nothing is held here; add a grasp before it")


class Move(Primitive):
    """Move the TCP (top-down) above an object, a target or a point."""
    name = "move"
    params = {"to": Param("point", doc="object, target, [x, y] or [x, y, z]"),
              "height": Param("float", None, (0.0, 0.4), "m above the object's top / the table / the 3-D point"),
              "yaw": Param("float", None, (-math.pi, math.pi), "wrist yaw (rad); default: keep"),
              "speed": SPEED}

    @staticmethod
    def _goal(top_z: float, ref: Ref, height) -> float:
        if ref.kind == "point" and len(ref.point) == 3:
            return ref.point[2] + (height or 0.0)
        return top_z + (0.10 if height is None else height)

    def plan(self, ps, p):
        ref = p["to"]
        top = ps.objects[ref.name][0][2] + ps.setup.roles[ref.name].half_height if ref.kind == "object" else 0.0
        ps.aim(np.r_[ps.xy(ref), self._goal(top, ref, p["height"])], ps.yaw if p["yaw"] is None else p["yaw"], "to")

    def run(self, ex, p):
        ref = p["to"]
        top = ex.see(ref.name)[0][2] + ex.setup.roles[ref.name].half_height if ref.kind == "object" else 0.0
        yield from ex.cmd.move(np.r_[ex.xy(ref), self._goal(top, ref, p["height"])], p["yaw"], speed=p["speed"])


class Grasp(Primitive):
    """Open, reach above the object (wrist across its narrow side), descend, close on it."""
    name = "grasp"
    params = {"object": Param("object", doc="the object role to pick"),
              "approach": Param("float", 0.10, (0.03, 0.3), "m above the object's top before descending"),
              "offset": Param("float", 0.003, (-0.02, 0.02), "TCP height relative to the object's centre"),
              "close_time": Param("float", 0.5, (0.2, 2.0), "s the fingers get to close"),
              "speed": SPEED}

    def check_sequence(self, step, held, objects, fail):
        if held is not None:
            fail(step.line, f"grasp: the hand already holds {held!r}; release it first")
        return step.params["object"].name

    def _poses(self, setup, role, pos, obj_yaw, yaw0, p, neighbours):
        inst = setup.roles[role]
        yaw = _grasp_yaw(setup, role, pos[:2], obj_yaw, yaw0, neighbours)
        above = np.r_[pos[:2], pos[2] + inst.half_height + p["approach"]]
        at = np.r_[pos[:2], max(pos[2] + p["offset"], MIN_TCP_Z)]
        return yaw, above, at

    def plan(self, ps, p):
        role = p["object"].name
        pos, obj_yaw = ps.objects[role]
        others = [v[0][:2] for n, v in ps.objects.items() if n != role] + \
            [ps.setup.poses[d.name][:2] for d in ps.setup.distractors]
        yaw, above, at = self._poses(ps.setup, role, pos, obj_yaw, ps.yaw, p, others)
        ps.aim(above, yaw, "approach")
        ps.aim(at, yaw, "object")
        ps.held = role

    def run(self, ex, p):
        role = p["object"].name
        others = [n for n in ex.scene.object_names if n != role]
        pos, quat = ex.see(role)
        near = [ex.see(n)[0][:2] for n in others]
        yaw, above, _ = self._poses(ex.setup, role, pos, object_yaw(quat), ex.cmd.yaw, p, near)
        yield from ex.cmd.move(above, yaw, grip=GRIPPER_OPEN, speed=p["speed"])
        pos, quat = ex.see(role)  # look again (the arm may have nudged it) and correct
        near = [ex.see(n)[0][:2] for n in others]
        yaw, above, at = self._poses(ex.setup, role, pos, object_yaw(quat), ex.cmd.yaw, p, near)
        yield from ex.cmd.move(above, yaw, speed=p["speed"], min_s=0.3)
        yield from ex.cmd.move(at, speed=0.5 * p["speed"])
        yield from ex.cmd.hold(p["close_time"], grip=GRIPPER_CLOSED)
        width, expect = ex.width(), ex.setup.roles[role].grasp_width
        if width < 0.4 * expect:
            raise PrimitiveFailure("grasp_missed", f"fingers closed to {width * 1000:.0f} mm on a "
                                   f"{expect * 1000:.0f} mm object")
        ex.held = role


class Lift(Primitive):
    """Raise the hand (and what it holds) straight up."""
    name = "lift"
    params = {"height": Param("float", 0.12, (0.02, 0.3), "m"), "speed": Param("float", 0.6, (0.2, 2.0))}

    def plan(self, ps, p):
        ps.aim(ps.tcp + [0, 0, p["height"]], ps.yaw, "height")
        if ps.held:
            ps.objects[ps.held][0] = ps.objects[ps.held][0] + [0, 0, p["height"]]

    def run(self, ex, p):
        z0 = ex.see(ex.held)[0][2] if ex.held else None
        yield from ex.cmd.move(ex.cmd.pos + [0, 0, p["height"]], speed=p["speed"])
        if ex.held and ex.see(ex.held)[0][2] - z0 < 0.5 * p["height"]:
            raise PrimitiveFailure("dropped", f"{ex.held!r} did not rise with the hand")


class Place(Primitive):
    """Carry the held object over a target or point and set it down on the table (no release)."""
    name = "place"
    landing = "at"  # the parameter that says where
    params = {"at": Param("place", doc="target or [x, y]"),
              "clearance": Param("float", 0.004, (0.0, 0.03), "m between the object and the surface at the end"),
              "height": Param("float", 0.06, (0.02, 0.3), "m of clearance while carrying"),
              "speed": SPEED}

    def check_sequence(self, step, held, objects, fail):
        _need_held(step, held, fail)
        if step.params["at"].kind == "object":
            fail(step.param_lines["at"], f"place.at: {step.params['at'].name!r} is an object; "
                 "use `stack: {on: ...}` to put one object on another")
        return held

    # -- shared with Stack: where the object lands
    def _landing(self, ps_or_ex, p) -> tuple[np.ndarray, float, float | None]:
        """(xy, surface z, wrist yaw or None = keep)."""
        return ps_or_ex.xy(p["at"]), 0.0, None

    def plan(self, ps, p):
        inst = ps.setup.roles[ps.held]
        xy, surface, yaw = self._landing(ps, p)
        yaw = ps.yaw if yaw is None else yaw
        offset = ps.objects[ps.held][0][2] - ps.tcp[2]
        carry = max(ps.tcp[2], surface + 2 * inst.half_height + p["height"] - offset)
        ps.aim(np.r_[xy, carry], yaw, self.landing)
        ps.aim(np.r_[xy, surface + inst.half_height + p["clearance"] - offset], yaw, self.landing)
        ps.objects[ps.held][0] = np.r_[xy, surface + inst.half_height]

    def run(self, ex, p):
        inst = ex.setup.roles[ex.held]
        xy, surface, yaw = self._landing(ex, p)
        offset = ex.see(ex.held)[0][2] - ex.scene.tcp_pose()[0][2]  # where the object sits in the hand
        carry = max(ex.cmd.pos[2], surface + 2 * inst.half_height + p["height"] - offset)
        yield from ex.cmd.move(np.r_[ex.cmd.pos[:2], carry], speed=p["speed"], min_s=0.2)
        yield from ex.cmd.move(np.r_[xy, carry], yaw, speed=p["speed"])
        # Look at the object, not the hand: line it up over the landing spot.
        xy, surface, _ = self._landing(ex, p)
        held = ex.see(ex.held)[0]
        if held[2] < surface + inst.half_height:
            raise PrimitiveFailure("dropped", f"{ex.held!r} fell out of the hand while carrying")
        yield from ex.cmd.move(ex.cmd.pos + np.r_[xy - held[:2], 0], speed=p["speed"], min_s=0.3)
        held = ex.see(ex.held)[0]
        offset = held[2] - ex.scene.tcp_pose()[0][2]
        yield from ex.cmd.move(np.r_[ex.cmd.pos[:2], surface + inst.half_height + p["clearance"] - offset],
                               speed=0.4 * p["speed"])


class Stack(Place):
    """Carry the held object over another one, line it up (yaw too) and set it down on top."""
    name = "stack"
    landing = "on"
    params = {"on": Param("object", doc="the object to stack on"),
              "clearance": Param("float", 0.004, (0.0, 0.03)),
              "height": Param("float", 0.06, (0.02, 0.3)),
              "align": Param("bool", True, doc="turn the wrist so the edges line up"),
              "speed": SPEED}

    def check_sequence(self, step, held, objects, fail):
        _need_held(step, held, fail)
        if step.params["on"].name == held:
            fail(step.param_lines["on"], f"stack.on: {held!r} is the object in the hand")
        return held

    def _landing(self, view, p):
        role = p["on"].name
        inst = view.setup.roles[role]
        if isinstance(view, PlanState):
            pos, obj_yaw, current = view.objects[role][0], view.objects[role][1], view.yaw
        else:
            pos, quat = view.see(role)
            obj_yaw, current = object_yaw(quat), view.cmd.yaw
        yaw = None
        if p["align"] and inst.shape != "cylinder":
            yaw = wrist_yaw(obj_yaw, math.pi / 2 if inst.shape == "cube" else math.pi, current, view.setup.home_yaw)
        return pos[:2].copy(), pos[2] + inst.half_height, yaw


class Release(Primitive):
    """Open the fingers, wait for the object to settle, and back off upwards."""
    name = "release"
    params = {"retreat": Param("float", 0.10, (0.0, 0.3), "m straight up after opening"),
              "wait": Param("float", 0.5, (0.1, 2.0), "s with the fingers opening"),
              "speed": Param("float", 0.7, (0.2, 2.0))}

    def check_sequence(self, step, held, objects, fail):
        _need_held(step, held, fail)
        return None

    def plan(self, ps, p):
        ps.held = None
        if p["retreat"] > 0:
            ps.aim(ps.tcp + [0, 0, p["retreat"]], ps.yaw, "retreat")

    def run(self, ex, p):
        yield from ex.cmd.hold(p["wait"], grip=GRIPPER_OPEN)
        ex.held = None
        if p["retreat"] > 0:
            yield from ex.cmd.move(ex.cmd.pos + [0, 0, p["retreat"]], speed=p["speed"])


class Push(Primitive):
    """Push an object across the table to a target with closed fingers, steering as it goes.

    The hand goes behind the object on its line to the goal (fingers side by side across the
    push: a flat pusher squares the object up), leans in, and re-aims every frame; if the
    object slides off the fingers or stops short, it lifts off and tries again.
    """
    name = "push"
    params = {"object": Param("object"), "to": Param("place", doc="target or [x, y]"),
              "attempts": Param("int", 3, (1, 5), "strokes before giving up"),
              "tolerance": Param("float", 0.5, (0.1, 1.0), "fraction of the target radius that is close enough"),
              "speed": SPEED}

    def check_sequence(self, step, held, objects, fail):
        if held is not None:
            fail(step.line, f"push: the hand holds {held!r}; release it first")
        return held

    def _contact(self, setup, role) -> float:
        return setup.roles[role].footprint / 2 + FINGER_HALF_THICKNESS

    def plan(self, ps, p):
        role = p["object"].name
        start, goal = ps.objects[role][0][:2], ps.xy(p["to"])
        d = unit(goal - start)
        yaw = push_yaw(math.atan2(d[1], d[0]), ps.setup.home_yaw)  # one hand pose per direction
        behind = start - d * (self._contact(ps.setup, role) + 0.03)
        ps.aim(np.r_[behind, PUSH_Z + 0.08], yaw, "object")
        ps.aim(np.r_[behind, PUSH_Z], yaw, "object")
        ps.aim(np.r_[goal - d * self._contact(ps.setup, role), PUSH_Z], yaw, "to")
        ps.objects[role][0] = np.r_[goal, ps.objects[role][0][2]]

    def run(self, ex, p):
        role = p["object"].name
        contact = self._contact(ex.setup, role)
        radius = ex.setup.target_radius[p["to"].name] if p["to"].kind == "target" else 0.02
        outcome = "not tried"
        for attempt in range(p["attempts"]):
            goal = ex.xy(p["to"])
            cube = ex.see(role)[0][:2]
            d = unit(goal - cube)
            yaw = push_yaw(math.atan2(d[1], d[0]), ex.setup.home_yaw)
            behind = cube - d * (contact + 0.03)
            yield from ex.cmd.move(np.r_[behind, PUSH_Z + 0.08], yaw, grip=GRIPPER_CLOSED, speed=p["speed"])
            cube = ex.see(role)[0][:2]
            behind = cube - unit(goal - cube) * (contact + 0.03)
            yield from ex.cmd.move(np.r_[behind, PUSH_Z], speed=0.6 * p["speed"])
            outcome = yield from self._stroke(ex, role, goal, contact, p["speed"])
            miss = float(np.linalg.norm(ex.see(role)[0][:2] - goal))
            if outcome == "done" and miss > p["tolerance"] * radius:
                outcome = f"off target by {miss * 100:.1f} cm"
            if outcome == "done":
                break
            yield from ex.cmd.move(ex.cmd.pos + [0, 0, 0.08], speed=0.7 * p["speed"])  # lift off, try again
        back = -0.05 * unit(ex.xy(p["to"]) - ex.cmd.pos[:2])  # step back: the result is in view
        yield from ex.cmd.move(ex.cmd.pos + np.r_[back, 0.14], speed=0.7 * p["speed"])
        if outcome != "done":
            raise PrimitiveFailure("push_missed", f"after {p['attempts']} strokes: {outcome}")

    @staticmethod
    def _stroke(ex, role, goal, contact, speed):
        """Keep the hand just behind the object on its line to the goal and lean in.

        Returns "done" (level with the goal), "lost" (slid off the fingers) or "timeout".
        """
        max_step = MAX_PUSH_STEP * speed
        d = None
        for _ in range(round(6.0 / ex.cmd.dt)):
            cube = ex.see(role)[0][:2]
            dist = float(np.linalg.norm(goal - cube))
            if d is None or dist > STEER_UNTIL:  # close to the goal: nudge straight on
                d = (goal - cube) / max(dist, 1e-9)
            if (goal - cube) @ d < PUSH_STOP:
                return "done"
            rel = cube - ex.scene.tcp_pose()[0][:2]
            along = rel @ d
            if np.linalg.norm(rel - along * d) > MAX_PUSH_LATERAL or along < 0.01:
                return "lost"
            lead = min(PUSH_LEAD, 0.3 * dist + 0.003)  # ease off near the goal
            step = cube - d * (contact - lead) - ex.cmd.pos[:2]
            n = float(np.linalg.norm(step))
            if n > max_step:
                step *= max_step / n
            ex.cmd.pos = np.r_[ex.cmd.pos[:2] + step, PUSH_Z]
            yield ex.cmd.command(GRIPPER_CLOSED)
        return "timeout"


class Wait(Primitive):
    """Hold still (the scene settles; the camera keeps recording)."""
    name = "wait"
    params = {"seconds": Param("float", 0.5, (0.1, 10.0))}

    def plan(self, ps, p):
        pass

    def run(self, ex, p):
        yield from ex.cmd.hold(p["seconds"])


class Home(Primitive):
    """Go back to where the hand started the episode (out of the camera's way)."""
    name = "home"
    params = {"speed": SPEED}

    def plan(self, ps, p):
        ps.aim(ps.setup.home_tcp, ps.setup.home_yaw, "home")

    def run(self, ex, p):
        yield from ex.cmd.move(ex.setup.home_tcp, ex.setup.home_yaw, speed=p["speed"])


PRIMITIVES: dict[str, Primitive] = {c.name: c() for c in (Move, Grasp, Lift, Place, Stack, Release, Push, Wait, Home)}
