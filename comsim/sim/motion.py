"""Smooth top-down hand motion for scripted robots: min-jerk paths, yaw symmetry, Cartesian -> joints.

Scripted experts (``comsim.factory``) and scripted operators (``comsim.lab``) think in
TCP poses that point straight down (position + yaw about world z) and stream one joint
target per camera frame. ``CartesianCommander`` keeps that commanded pose, moves it along
min-jerk paths (zero velocity and acceleration at both ends: no jolt the servos would
have to absorb) and turns each pose into joints with damped-least-squares IK, warm-started
from the previous frame's joints so that consecutive targets stay on one IK branch.
"""
from __future__ import annotations

import math
from typing import Iterator

import mujoco
import numpy as np

from comsim.sim.ik import IKResult, solve_ik, top_down_quat

MAX_ROTATION_SPEED = 2.0  # rad/s of wrist yaw
IK_TOLERANCE = 0.005  # m: a frame whose IK misses by more is an unreachable pose


class UnreachableError(RuntimeError):
    """IK could not put the TCP where it was asked to (beyond the joint limits or the arm's reach)."""

    def __init__(self, msg: str, pos=None, error: float | None = None):
        super().__init__(msg)
        self.pos, self.error = pos, error


# ---------------------------------------------------------------- small geometry


def min_jerk(tau: float) -> float:
    """Min-jerk time scaling: 0 -> 1 on tau in [0, 1], zero velocity and acceleration at both ends."""
    tau = min(max(tau, 0.0), 1.0)
    return tau**3 * (10 - 15 * tau + 6 * tau**2)


def object_yaw(quat) -> float:
    """Rotation about world z of a body with quaternion (w, x, y, z) (objects resting upright)."""
    w, x, y, z = quat
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def tcp_yaw(quat) -> float:
    """Yaw of a top-down TCP (the angle of its x axis about world z); see ``top_down_quat``."""
    R = np.zeros(9)
    mujoco.mju_quat2Mat(R, np.asarray(quat, dtype=np.float64))
    return math.atan2(R[3], R[0])


def nearest_symmetric(angle: float, reference: float, period: float) -> float:
    """``angle + k * period`` closest to ``reference``: a cube looks the same every 90 deg and a
    two-finger hand every 180 deg, so the wrist never turns further than it must."""
    return angle + period * round((reference - angle) / period)


def push_yaw(direction: float, home_yaw: float) -> float:
    """Wrist yaw of a push along ``direction`` (rad), the fingers closed side by side across it: the
    copy in the half-turn just positive of the home yaw, the side joint 7 has room for (the Panda's
    home posture sits at q7 = +45 deg, so the joint stays in [-135, 45] deg of its +-166). One hand
    pose per direction: the copy nearest the current yaw would flip the wrist half a turn between
    pushes on either side of the home yaw's normal, two ways to push one layout."""
    return nearest_symmetric(direction, home_yaw + math.pi / 2, math.pi)


def symmetry_period(shape: str) -> float:
    """Yaw period of a top-down grasp on an object: cubes 90 deg, cylinders any (0 = free), boxes 180."""
    return {"cube": math.pi / 2, "cylinder": 0.0}.get(shape, math.pi)


def grasp_yaw(object_quat, shape: str, current_yaw: float) -> float:
    """Wrist yaw that closes the fingers across ``object`` with the least wrist turn."""
    period = symmetry_period(shape)
    if period == 0:
        return current_yaw
    return nearest_symmetric(object_yaw(object_quat), current_yaw, period)


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / max(np.linalg.norm(v), 1e-9)


def move_frames(distance: float, rotation: float, dt: float, speed: float, min_s: float = 0.4,
                rotation_speed: float = MAX_ROTATION_SPEED) -> int:
    """Frames for a min-jerk move of ``distance`` m at a nominal ``speed`` m/s and ``rotation`` rad."""
    duration = max(min_s, distance / speed, abs(rotation) / rotation_speed)
    return max(1, round(duration / dt))


def reachable(scene, pos, yaw: float, q_init=None, tol: float = IK_TOLERANCE) -> IKResult:
    """IK for a top-down pose; ``.converged`` is replaced by 'within ``tol``' (what a frame needs)."""
    res = solve_ik(scene, pos, top_down_quat(yaw), q_init=q_init)
    res.converged = res.pos_err <= tol and res.rot_err <= 0.05
    return res


# ---------------------------------------------------------------- the commander


class CartesianCommander:
    """A commanded top-down TCP pose that becomes one action (8,) per frame.

    ``move`` and ``hold`` are generators of actions; the caller steps the scene with each
    action before asking for the next, so closed-loop code between moves sees the scene as
    it is after the last frame. ``perturb(t)`` (optional) adds a Cartesian offset to every
    commanded position (a human's tremor, say) without changing the plan.
    """

    def __init__(self, scene, dt: float, speed: float = 0.25, perturb=None,
                 ik_tolerance: float = IK_TOLERANCE):
        self.scene, self.dt, self.speed = scene, float(dt), float(speed)
        self.perturb, self.ik_tolerance = perturb, ik_tolerance
        pos, quat = scene.tcp_pose()
        self.pos = pos  # commanded TCP position (before perturbation)
        self.yaw = tcp_yaw(quat)
        self.q = scene.get_state()[:7].copy()
        self.grip = float(scene.spec.robot.init_gripper)
        self.t = 0.0
        self.frames = 0  # actions issued so far

    def command(self, grip: float | None = None) -> np.ndarray:
        """The action for the current commanded pose; raises UnreachableError if IK misses it."""
        self.t += self.dt
        self.frames += 1
        self.grip = self.grip if grip is None else float(grip)
        target = self.pos if self.perturb is None else self.pos + self.perturb(self.t)
        res = reachable(self.scene, target, self.yaw, q_init=self.q, tol=self.ik_tolerance)
        if not res.converged:
            raise UnreachableError(f"TCP pose {np.round(target, 3).tolist()} yaw {self.yaw:.2f} is out of reach "
                                   f"(IK error {res.pos_err * 1000:.1f} mm)", pos=target, error=res.pos_err)
        self.q = res.q
        return np.concatenate([self.q, [self.grip]]).astype(np.float32)

    def move(self, pos, yaw: float | None = None, grip: float | None = None, speed: float = 1.0,
             min_s: float = 0.4, time_scale: float = 1.0) -> Iterator[np.ndarray]:
        """Min-jerk move of the commanded pose to ``pos`` (and ``yaw``) at ``speed`` x the nominal speed.

        ``time_scale`` stretches the duration (a person's timing varies from move to move)."""
        start, yaw0 = self.pos.copy(), self.yaw
        goal = np.asarray(pos, dtype=np.float64)
        yaw1 = yaw0 if yaw is None else float(yaw)
        n = move_frames(float(np.linalg.norm(goal - start)), yaw1 - yaw0, self.dt, self.speed * speed, min_s)
        n = max(1, round(n * time_scale))
        for k in range(1, n + 1):
            s = min_jerk(k / n)
            self.pos = start + (goal - start) * s
            self.yaw = yaw0 + (yaw1 - yaw0) * s
            yield self.command(grip)

    def hold(self, seconds: float, grip: float | None = None) -> Iterator[np.ndarray]:
        for _ in range(max(1, round(seconds / self.dt))):
            yield self.command(grip)


def cartesian_path_to_joints(scene, positions, yaws, q_init=None, tol: float = IK_TOLERANCE) -> np.ndarray:
    """(N, 3) TCP positions + (N,) yaws -> (N, 7) joint targets, each IK warm-started from the last.

    Raises UnreachableError naming the first waypoint that IK cannot reach within ``tol``.
    """
    q = scene.get_state()[:7].copy() if q_init is None else np.asarray(q_init, dtype=np.float64)
    out = []
    for i, (p, y) in enumerate(zip(np.asarray(positions, dtype=np.float64), yaws)):
        res = reachable(scene, p, float(y), q_init=q, tol=tol)
        if not res.converged:
            raise UnreachableError(f"waypoint {i} {np.round(p, 3).tolist()} is out of reach "
                                   f"(IK error {res.pos_err * 1000:.1f} mm)", pos=p, error=res.pos_err)
        q = res.q
        out.append(q)
    return np.array(out)
