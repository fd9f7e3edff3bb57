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

A cell's realism options (``comsim.lab.realism``) act here: ``reset`` draws the episode's
conditions from its seed (lights, exposure, white balance, camera offset and drift, a passing
distractor, object friction and mass) and each observation renders them (``clean_image``); a cell
without them takes the plain path (no extra render, no extra random draw).
"""
from __future__ import annotations

import math
from pathlib import Path

import mujoco
import numpy as np

from comsim.config import ConfigError
from comsim.lab.cell import LabCell, load_lab_cell
from comsim.lab.look import LabCamera, apply_look, render_camera_name, render_intrinsics
from comsim.lab.realism import AutoExposure, ConditionsApplier, EpisodeConditions, episode_conditions, realism_on
from comsim.lab.tasks import TaskState, make_task
from comsim.sim.scene import OBJECT_PREFIX, Scene, build_mjspec, geom_labels

# Streams of randomness drawn from an episode seed: layout, sensor noise, operator (3: calibration stills,
# 4: the episode's conditions, comsim.lab.realism).
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
        # what the twin cannot model (comsim.lab.realism): per-episode conditions, per-frame camera and blur
        self.realism = realism_on(self.cell)
        K, w, h = render_intrinsics(self.cell)
        self._conditions = ConditionsApplier(m, self.cell, render_camera_name(self.cell.camera), K, (w, h),
                                             self.scene.object_names)
        self.conditions: EpisodeConditions | None = None
        self._exposure: AutoExposure | None = None
        # camera motion, blur and distractors render a state of their own (never the simulated one)
        self._view = mujoco.MjData(m) if any(self.realism[k] for k in ("camera", "blur", "distractors")) else None
        self._quat_adr = [m.jnt_qposadr[m.joint(OBJECT_PREFIX + n).id] + 3 for n in self.scene.object_names]
        self._prev_qpos = self.scene.data.qpos.copy()
        self._last_render: tuple[int | None, np.ndarray | None] = (None, None)

    @property
    def task_name(self) -> str:
        return self.task.name

    # ------------------------------------------------------------ closed loop

    def reset(self, seed: int) -> dict:
        """New episode: objects placed from ``seed``, robot at home; returns the first observation."""
        self.seed = int(seed)
        layout = self.task.sample_layout(np.random.default_rng([self.seed, LAYOUT_STREAM]))
        c = episode_conditions(self.cell, self.seed) if any(self.realism.values()) else None
        self.conditions = c
        self._conditions.apply(c)  # before the reset: this episode's physics and lights
        self._exposure = AutoExposure(self.cell.look.exposure, c.gain) if c is not None else None
        self.scene.reset(object_poses=layout)
        self._sensor_rng = np.random.default_rng([self.seed, SENSOR_STREAM])
        self.frame = 0
        self._prev_qpos = self.scene.data.qpos.copy()
        self._last_render = (None, None)  # (frame, render at its instant): motion blur reuses it
        return self.observe()

    def nominal(self) -> None:
        """The cell's own lights, physics and calibrated camera (no episode's conditions): for the
        calibration stills, taken before the camera was bumped and the light changed."""
        self.conditions, self._exposure = None, None
        self._conditions.apply(None)
        mujoco.mj_forward(self.scene.model, self.scene.data)

    def step(self, action) -> tuple[dict, bool, bool]:
        """Hold ``action`` for one frame; returns (observation, success, done)."""
        if self.seed is None:
            raise RuntimeError("LabEnv.step: call reset(seed) first")
        if self.frame >= self.max_frames:
            raise RuntimeError(f"LabEnv.step: the episode is over (time limit {self.max_frames} frames); reset")
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (8,) or not np.all(np.isfinite(a)):
            raise ValueError(f"LabEnv.step: expected a finite action of shape (8,), got {a.shape}")
        self._prev_qpos = self.scene.data.qpos.copy()
        self.scene.step(a, n_substeps=self.control_steps_per_frame * self.scene.spec.physics.substeps)
        self.frame += 1
        return self.observe(), self.success(), self.frame >= self.max_frames

    def observe(self) -> dict:
        return {"image": self.image(), "state": self.scene.get_state().astype(np.float32)}

    def image(self) -> np.ndarray:
        """What the camera records now: uint8 (H, W, 3)."""
        c = self.conditions
        if c is None:
            return self.camera.rgb(self._sensor_rng)
        clean = self.clean_image()
        return self.camera.rgb(self._sensor_rng, clean, self._exposure(clean), c.white_balance)

    def clean_image(self) -> np.ndarray:
        """The pinhole render (with its margin) the sensor gets now: the camera where it is now, the
        distractors where they pass and, with motion blur, the mean of renders at states between the
        previous frame's and this one's. uint8 (H + 2m, W + 2m, 3)."""
        c = self.conditions
        if c is None or self._view is None:
            return self.camera.clean()
        m, v, now = self.scene.model, self._view, self.scene.data.qpos
        blur = self.cell.look.motion_blur
        fractions = np.linspace(1.0 - blur.exposure, 1.0, blur.samples) if self.realism["blur"] else [1.0]
        acc = None
        for a in fractions:  # the last one is this frame's instant: the camera is left where it is now
            if a == 0.0 and self._last_render[0] is not None and self._last_render[0] == self.frame - 1:
                img = self._last_render[1]  # a shutter open the whole interval starts where the last frame ended
            else:
                t = (self.frame - (1.0 - a)) / self.fps
                v.qpos[:] = interpolate_qpos(self._prev_qpos, now, a, self._quat_adr)
                self._conditions.place_distractors(v, c, t)
                self._conditions.set_camera(c.camera_shift_px(t) if self.realism["camera"] else None)
                mujoco.mj_kinematics(m, v)
                mujoco.mj_camlight(m, v)
                img = self.camera.clean(v).astype(np.float32)
            acc = img if acc is None else acc + img
        self._last_render = (self.frame, img)
        return np.clip(acc / len(fractions) + 0.5, 0, 255).astype(np.uint8)

    def place_camera(self, T_cam_from_base=None) -> None:
        """Put the camera at ``T_cam_from_base`` (None: its calibrated pose): e.g. a recorded frame's true
        pose (``camera_T_cam_from_base`` in the episode's truth), to draw its true labels."""
        self._conditions.place_camera(None if T_cam_from_base is None else np.asarray(T_cam_from_base, np.float64))
        mujoco.mj_camlight(self.scene.model, self.scene.data)

    def camera_pose(self) -> np.ndarray:
        """The true ``T_cam_from_base`` of the frame just observed (the camera may move: realism)."""
        c = self.conditions
        shift = c.camera_shift_px(self.frame / self.fps) if c is not None and self.realism["camera"] else (0.0, 0.0)
        return self._conditions.camera_T(shift)

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
        mujoco.mj_camlight(self.scene.model, self.scene.data)  # the camera where it is now (it may move)
        return self.camera.segmentation()

    def close(self) -> None:
        self.camera.close()

    def __enter__(self) -> "LabEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def interpolate_qpos(q0: np.ndarray, q1: np.ndarray, a: float, quat_adr: list[int]) -> np.ndarray:
    """The state a fraction ``a`` of the way from ``q0`` to ``q1``: joints linearly, free-joint
    orientations by normalized linear interpolation (the shorter way round)."""
    if a == 1.0:
        return q1
    q = (1.0 - a) * q0 + a * q1
    for i in quat_adr:
        r0, r1 = q0[i:i + 4], q1[i:i + 4]
        r = (1.0 - a) * (r0 if np.dot(r0, r1) >= 0 else -r0) + a * r1
        q[i:i + 4] = r / np.linalg.norm(r)
    return q
