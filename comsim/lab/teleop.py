"""A scripted teleoperator: a person at the console, with a person's habits.

The operator watches the true scene (as a person watches the real one), plans Cartesian
moves (reach, correct, descend, grasp, lift, carry, place, release, retreat; for push:
get behind the cube on the line to the target and push it there, steering as it goes),
and streams joint targets found by IK, one per camera frame.

Human-like variation, all drawn from the episode's operator seed (``OperatorHabits``):
a speed factor, low-frequency hand tremor of a few mm that calms down for fine moves,
a first aim that misses by up to ~1.5 cm and is then corrected, occasional overshoot of a
transport move followed by a correction, short hesitations, and for pushing how hard the
hand leads the cube and when it is "close enough". Variation can cause honest failures;
the success flag is always judged on the final state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from comsim.sim.ik import solve_ik, top_down_quat
from comsim.sim.motion import min_jerk, nearest_symmetric, object_yaw, push_yaw, tcp_yaw, unit

PUSH_Z = 0.022  # TCP height while pushing: fingertips ~1 cm above the table, mid-cube contact
FINGER_HALF_THICKNESS = 0.0105  # closed fingers, measured along the push direction
HOVER = 0.10  # above an object before descending
MAX_PUSH_SPEED = 0.1  # m/s the hand may move while pushing (x the episode's speed factor)
MAX_ROTATION_SPEED = 2.0  # rad/s of wrist yaw
STEER_UNTIL = 0.05  # m from the goal: steer towards it until then, then hold the direction
MAX_PUSH_LATERAL = 0.03  # m off the pushing line: the cube has slid off the fingers


@dataclass
class Style:
    """One demonstration's habits, drawn once per episode."""
    speed: float
    noise_amp: np.ndarray  # (3, 3): axis x component, metres
    noise_freq: np.ndarray  # (3, 3) Hz
    noise_phase: np.ndarray  # (3, 3) rad
    aim_error: float
    overshoot: float  # metres, 0 = none this episode
    push_lead: float
    push_stop: float

    @classmethod
    def draw(cls, habits, rng: np.random.Generator) -> "Style":
        h = habits
        amp = rng.uniform(*h.path_noise_mm) / 1000
        weights = rng.uniform(0.3, 1.0, (3, 3))
        weights *= amp / np.sqrt((weights**2).sum(1, keepdims=True))
        weights[2] *= 0.5  # people hold height better than position across the table
        return cls(
            speed=rng.uniform(*h.speed), noise_amp=weights,
            noise_freq=rng.uniform(*h.path_noise_hz, (3, 3)), noise_phase=rng.uniform(0, 2 * np.pi, (3, 3)),
            aim_error=rng.uniform(*h.aim_error_m),
            overshoot=rng.uniform(*h.overshoot_m) if rng.random() < h.overshoot_prob else 0.0,
            push_lead=rng.uniform(*h.push_lead_m), push_stop=rng.uniform(*h.push_stop_m))


class ScriptedTeleoperator:
    """``demonstrate()`` yields one action (8,) per frame; step the env with each in turn."""

    def __init__(self, env, rng: np.random.Generator):
        self.env, self.scene = env, env.scene
        self.habits = env.cell.operator
        self.rng = rng
        self.style = Style.draw(self.habits, rng)
        self.dt = 1.0 / env.fps
        pos, quat = self.scene.tcp_pose()
        self.pos = pos  # commanded TCP position (before tremor)
        self.yaw = self.home_yaw = tcp_yaw(quat)
        self.q = self.scene.get_state()[:7].copy()
        self.grip = float(self.scene.spec.robot.init_gripper)
        self.t = 0.0
        self.frame = -1  # index of the frame the last command was sent at
        self.noise_gain = 0.0  # calm at the start
        self.events: list[tuple[int, str]] = []  # (frame, what happened): corrections, retries

    def demonstrate(self) -> Iterator[np.ndarray]:
        scripts = {"push": self._push, "stack": self._stack}
        yield from scripts[self.env.task_name]()

    # ------------------------------------------------------------ what the operator sees

    def _see(self, name: str) -> tuple[np.ndarray, float]:
        pos, quat = self.scene.object_pose(name)
        return pos, object_yaw(quat)

    # ------------------------------------------------------------ moving the hand

    def _command(self, grip: float) -> np.ndarray:
        self.t += self.dt
        self.frame += 1
        s = self.style
        tremor = (s.noise_amp * np.sin(2 * np.pi * s.noise_freq * self.t + s.noise_phase)).sum(1)
        target = self.pos + self.noise_gain * tremor
        self.q = solve_ik(self.scene, target, top_down_quat(self.yaw), q_init=self.q).q
        self.grip = grip
        return np.concatenate([self.q, [grip]]).astype(np.float32)

    def _move(self, pos, yaw: float | None = None, grip: float | None = None, speed: float = 1.0,
              noise: float = 1.0, min_s: float = 0.4) -> Iterator[np.ndarray]:
        """Min-jerk move of the commanded pose; the tremor gain blends to ``noise`` on the way."""
        start, yaw0, gain0 = self.pos.copy(), self.yaw, self.noise_gain
        pos = np.asarray(pos, dtype=np.float64)
        yaw = yaw0 if yaw is None else yaw
        grip = self.grip if grip is None else grip
        v = self.habits.nominal_speed * speed * self.style.speed
        duration = max(min_s, np.linalg.norm(pos - start) / v, abs(yaw - yaw0) / MAX_ROTATION_SPEED)
        n = max(1, round(duration * self.rng.uniform(0.9, 1.1) / self.dt))
        for k in range(1, n + 1):
            s = min_jerk(k / n)
            self.pos = start + (pos - start) * s
            self.yaw = yaw0 + (yaw - yaw0) * s
            self.noise_gain = gain0 + (noise - gain0) * s
            yield self._command(grip)

    def _transport(self, pos, yaw: float, grip: float) -> Iterator[np.ndarray]:
        """A long move; some episodes overshoot it and come back."""
        pos = np.asarray(pos, dtype=np.float64)
        if self.style.overshoot > 0:
            self.events.append((self.frame + 1, f"overshoot by {self.style.overshoot * 100:.1f} cm, then correct"))
            d = pos - self.pos
            d[2] = 0
            d /= max(np.linalg.norm(d), 1e-9)
            yield from self._move(pos + self.style.overshoot * d, yaw, grip)
            yield from self._move(pos, noise=0.6, min_s=0.3)
        else:
            yield from self._move(pos, yaw, grip)

    def _hold(self, seconds: float, grip: float | None = None) -> Iterator[np.ndarray]:
        grip = self.grip if grip is None else grip
        for _ in range(round(seconds / self.dt)):
            yield self._command(grip)

    def _pause(self) -> Iterator[np.ndarray]:
        yield from self._hold(self.rng.uniform(*self.habits.pause_s))

    def _withdraw(self, grip: float) -> Iterator[np.ndarray]:
        """Lift off, then pull back towards the base and open: the result stays in view."""
        yield from self._move(self.pos + [0, 0, 0.05], grip=grip, speed=0.5, noise=0.4, min_s=0.3)
        yield from self._move(np.r_[0.75 * self.pos[:2], 0.25], grip=1.0, noise=0.8)
        yield from self._hold(0.2)

    def _aim_error(self) -> np.ndarray:
        a = self.rng.uniform(0, 2 * np.pi)
        return self.style.aim_error * np.array([np.cos(a), np.sin(a), 0.0])

    # ------------------------------------------------------------ stack

    def _stack(self) -> Iterator[np.ndarray]:
        cfg = self.env.task.cfg
        half = self.env.task.half_heights
        top, yaw_top = self._see(cfg.top)
        grasp_yaw = nearest_symmetric(yaw_top, self.yaw, np.pi / 2)
        # Reach above the cube; the first aim is a little off and gets corrected.
        yield from self._transport(top + [0, 0, HOVER] + self._aim_error(), grasp_yaw, grip=1.0)
        yield from self._pause()
        top, _ = self._see(cfg.top)
        self.events.append((self.frame + 1, "correct the aim above the cube"))
        yield from self._move(top + [0, 0, HOVER], noise=0.3, min_s=0.3)
        yield from self._move(top + [0, 0, 0.003], speed=0.5, noise=0.15)
        yield from self._hold(self.rng.uniform(0.4, 0.6), grip=0.0)  # close on the cube
        yield from self._move(self.pos + [0, 0, 0.12], speed=0.6, noise=0.5)

        # Carry it above the base, turning the wrist so the cube lines up with the base.
        base, yaw_base = self._see(cfg.base)
        place_yaw = nearest_symmetric(yaw_base, self.yaw, np.pi / 2)
        lift = 2 * half[cfg.top] + 0.06
        yield from self._transport(np.r_[base[:2], self.pos[2]], place_yaw, grip=0.0)
        yield from self._move(np.r_[self.pos[:2], base[2] + half[cfg.base] + half[cfg.top] + lift],
                              noise=0.5, min_s=0.3)
        yield from self._pause()
        # Look at the cube, not the hand: line it up over the base.
        held, _ = self._see(cfg.top)
        base, _ = self._see(cfg.base)
        yield from self._move(self.pos + np.r_[base[:2] - held[:2], 0], noise=0.3, min_s=0.3)
        held, _ = self._see(cfg.top)
        offset_z = held[2] - self.scene.tcp_pose()[0][2]  # where the cube sits in the hand
        place_z = base[2] + half[cfg.base] + half[cfg.top] + 0.004 - offset_z
        yield from self._move(np.r_[self.pos[:2], place_z], speed=0.4, noise=0.15)
        yield from self._hold(self.rng.uniform(0.4, 0.6), grip=1.0)  # release
        yield from self._withdraw(grip=1.0)

    # ------------------------------------------------------------ push

    def _push(self) -> Iterator[np.ndarray]:
        cfg = self.env.task.cfg
        goal = np.asarray(cfg.target, dtype=np.float64)
        contact = self.env.task.sizes[cfg.cube][0] / 2 + FINGER_HALF_THICKNESS
        first = True
        for attempt in range(3):
            cube, _ = self._see(cfg.cube)
            d = unit(goal - cube[:2])
            # Fingers closed side by side across the push: a flat pusher squares the cube up. The
            # operator holds the hand the same way for every push (see push_yaw).
            yaw = push_yaw(math.atan2(d[1], d[0]), self.home_yaw)
            behind = cube[:2] - d * (contact + 0.03)
            above = np.r_[behind, PUSH_Z + 0.08] + (self._aim_error() if first else 0)
            if first:
                yield from self._transport(above, yaw, grip=0.0)
                yield from self._pause()
            else:
                yield from self._move(above, yaw, grip=0.0, noise=0.6)
            first = False
            cube, _ = self._see(cfg.cube)
            behind = cube[:2] - unit(goal - cube[:2]) * (contact + 0.03)
            yield from self._move(np.r_[behind, PUSH_Z], speed=0.6, noise=0.2)
            outcome = yield from self._push_stroke(cfg.cube, goal, contact)
            miss = np.linalg.norm(self._see(cfg.cube)[0][:2] - goal)
            if outcome == "done" and miss > 0.5 * cfg.target_radius:
                outcome = f"off target by {miss * 100:.1f} cm"  # a person looks, then tries again
            self.events.append((self.frame, f"push stroke {attempt}: {outcome}"))
            if outcome == "done":
                break
            yield from self._move(self.pos + [0, 0, 0.08], speed=0.7, noise=0.5)  # lift off and retry
        yield from self._withdraw(grip=0.0)

    def _push_stroke(self, cube_name: str, goal: np.ndarray, contact: float):
        """Keep the hand just behind the cube on its line to the goal and lean in; steer each frame.

        Returns "done" (level with the goal along the push), "lost" (the cube slid off the hand)
        or "timeout".
        """
        s = self.style
        max_step = MAX_PUSH_SPEED * s.speed * self.dt
        self.noise_gain = 0.2
        d = None
        for _ in range(round(6.0 / self.dt)):
            cube = self._see(cube_name)[0][:2]
            dist = np.linalg.norm(goal - cube)
            if d is None or dist > STEER_UNTIL:  # close to the goal a person just nudges straight on
                d = (goal - cube) / dist
            if (goal - cube) @ d < s.push_stop:  # level with the goal along the push: stop
                return "done"
            rel = cube - self.scene.tcp_pose()[0][:2]
            along = rel @ d
            if np.linalg.norm(rel - along * d) > MAX_PUSH_LATERAL or along < 0.01:
                return "lost"
            lead = min(s.push_lead, 0.3 * dist + 0.003)  # ease off near the goal
            want = cube - d * (contact - lead)
            step = want - self.pos[:2]
            n = np.linalg.norm(step)
            if n > max_step:
                step *= max_step / n
            self.pos = np.r_[self.pos[:2] + step, PUSH_Z]
            yield self._command(0.0)
        return "timeout"
