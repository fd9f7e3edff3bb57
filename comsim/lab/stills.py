"""Calibration stills: what a real cell captures before recording (EasyHeC-style).

The lab camera's sensor is natively ``scale`` times the episode videos' resolution (the
videos are a downscaled stream). Before the episodes, the cell takes a few full-resolution
stills with the arm moved through several joint configurations (the table cleared), plus
one robot-free background still (the arm parked out of view: rendered with the robot
hidden). They are written in the layout of a calibration folder (``comsim.twin.frames``),
without masks, so ``comsim twin calibrate DIR/calibration`` works on them and derives the
masks from the difference to the background still:

    DIR/calibration/color/NNNNNN.png        RGB stills (distorted, as recorded)
    DIR/calibration/qpos/NNNNNN.txt         7 arm joints + 2 finger positions
    DIR/calibration/background.png          the robot-free still
    DIR/calibration/camera_intrinsics.json  K (at the stills' size), distortion, width, height

Same sensor effects as the videos: the same lens (distortion coefficients on normalized
coordinates, vignetting), the optical blur scaled to the finer pixels, the same read noise
and JPEG quality per pixel. Nothing hidden is written here (the camera pose stays in
``lab_truth.json``).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import mujoco
import numpy as np

from comsim.io.files import write_png
from comsim.lab.effects import SensorModel, distortion_coeffs
from comsim.lab.look import render_camera_name, render_intrinsics
from comsim.lab.realism import AutoExposure
from comsim.sim.camera import as_K, scale_K
from comsim.sim.scene import FINGER_TRAVEL, geom_labels

CALIBRATION_DIR = "calibration"
BACKGROUND_FILE = "background.png"
DONE_FILE = "stills.json"  # written last: the folder is complete
STILLS_STREAM = 3  # random stream (after layout, sensor, operator) for the stills' poses and noise
HIDDEN_GROUP = 5  # geom group the robot is moved to for the background still


def still_poses(home, n: int, rng: np.random.Generator, lo=None, hi=None) -> np.ndarray:
    """``n`` joint configurations around ``home`` that spread the arm over the image."""
    home = np.asarray(home, np.float64)
    span = np.array([0.9, 0.5, 0.7, 0.6, 1.2, 0.6, 1.2])
    q = home + rng.uniform(-1.0, 1.0, (n, 7)) * span
    if lo is not None:
        q = np.clip(q, np.asarray(lo) + 0.05, np.asarray(hi) - 0.05)
    return q


class _StillCamera:
    """The lab's true camera at ``scale`` times the video resolution, through the sensor model."""

    def __init__(self, scene, cell, scale: int):
        cam = cell.scene.camera(cell.camera)
        rK, rw, rh = render_intrinsics(cell)
        self.scale = int(scale)
        self.width, self.height = cam.width * self.scale, cam.height * self.scale
        self.K = scale_K(cam.K, cam.width, cam.height, self.width, self.height)
        rw2, rh2 = rw * self.scale, rh * self.scale
        m = scene.model
        self.model, self.data = m, scene.data
        self.cam_id = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, render_camera_name(cam.name))
        m.vis.global_.offwidth = max(m.vis.global_.offwidth, rw2)
        m.vis.global_.offheight = max(m.vis.global_.offheight, rh2)
        self.renderer = mujoco.Renderer(m, rh2, rw2)
        look = dataclasses.replace(cell.look.sensor, blur_sigma_px=cell.look.sensor.blur_sigma_px * self.scale)
        self.sensor = SensorModel(look, self.K, self.height, self.width,
                                  render_K=scale_K(rK, rw, rh, rw2, rh2), render_size=(rw2, rh2))
        self.dist = distortion_coeffs(look)
        self.exposure = cell.look.exposure
        self.robot_geoms = np.nonzero(geom_labels(m) == 1)[0]
        self.hidden = mujoco.MjvOption()
        self.hidden.geomgroup[HIDDEN_GROUP] = 0

    def rgb(self, rng: np.random.Generator, robot: bool = True) -> np.ndarray:
        m = self.model
        if robot:
            self.renderer.update_scene(self.data, self.cam_id)
        else:
            saved = m.geom_group[self.robot_geoms].copy()
            m.geom_group[self.robot_geoms] = HIDDEN_GROUP
            try:
                self.renderer.update_scene(self.data, self.cam_id, scene_option=self.hidden)
            finally:
                m.geom_group[self.robot_geoms] = saved
        clean = self.renderer.render()
        if self.exposure.auto > 0:  # the camera's auto-exposure is on for the stills too
            return self.sensor(clean, rng, gain=AutoExposure(self.exposure, 1.0)(clean))
        return self.sensor(clean, rng)

    def close(self) -> None:
        self.renderer.close()


def record_calibration_stills(env, out: str | Path, n: int = 12, scale: int = 4, seed: int = 0) -> Path:
    """Write ``n`` stills + a background still of ``env``'s cell into ``out`` (a calibration folder).

    Kept when already complete (``stills.json``). The env's scene is left reset: record the
    episodes after this.
    """
    out = Path(out)
    done = out / DONE_FILE
    meta = {"n": int(n), "scale": int(scale), "seed": int(seed)}
    if done.is_file() and json.loads(done.read_text()) == meta:
        return out
    if out.exists():
        shutil.rmtree(out)
    (out / "color").mkdir(parents=True)
    (out / "qpos").mkdir()
    scene, cell = env.scene, env.cell
    env.nominal()  # the calibrated camera, the cell's own light (no episode's conditions)
    rng = np.random.default_rng([int(seed), STILLS_STREAM])
    m = scene.model
    lo = [m.jnt_range[m.joint(j).id][0] for j in _arm_joint_names(scene)]
    hi = [m.jnt_range[m.joint(j).id][1] for j in _arm_joint_names(scene)]
    # The table is cleared for calibration: objects far out of view.
    away = {name: ([20.0 + 2 * i, 20.0, 1.0], [1.0, 0.0, 0.0, 0.0]) for i, name in enumerate(scene.object_names)}
    cam = _StillCamera(scene, cell, scale)
    try:
        scene.reset(object_poses=away)
        mujoco.mj_forward(m, scene.data)
        write_png(out / BACKGROUND_FILE, cam.rgb(rng, robot=False))
        k, tries = 0, 0
        while k < n and tries < 50 * n:
            tries += 1
            q = still_poses(cell.scene.robot.init_qpos, 1, rng, lo, hi)[0]
            width = float(rng.uniform(0.0, 2 * FINGER_TRAVEL))
            scene.reset(arm_qpos=q, object_poses=away)
            scene.set_robot_qpos(q, width)
            mujoco.mj_forward(m, scene.data)
            if not _clear(scene):
                continue
            write_png(out / "color" / f"{k:06d}.png", cam.rgb(rng))
            np.savetxt(out / "qpos" / f"{k:06d}.txt", np.r_[q, width / 2, width / 2])
            k += 1
        if k < n:
            raise RuntimeError(f"record_calibration_stills: found only {k} collision-free arm poses of {n}")
        fx, fy, cx, cy = (float(v) for v in as_K(cam.K))
        intr = {"width": cam.width, "height": cam.height, "K": [[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]],
                "dist": cam.dist.tolist(), "distortion_model": "opencv"}
        (out / "camera_intrinsics.json").write_text(json.dumps(intr, indent=2) + "\n")
    finally:
        cam.close()
        scene.reset()
    done.write_text(json.dumps(meta) + "\n")
    return out


def _arm_joint_names(scene) -> list[str]:
    from comsim.sim.scene import ROBOT_PREFIX
    return [f"{ROBOT_PREFIX}joint{i}" for i in range(1, 8)]


def _clear(scene) -> bool:
    """No robot contact (with the table or itself) and the hand above the table."""
    d = scene.data
    labels = geom_labels(scene.model)
    pairs = np.asarray(d.contact.geom)[:d.ncon].reshape(-1, 2)
    if len(pairs) and np.any((labels[pairs] == 1).any(axis=1)):
        return False
    return float(scene.tcp_pose()[0][2]) > 0.08
