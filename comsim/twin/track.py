"""Analysis by synthesis over time: the initial object poses whose physics replay reproduces
the objects' tracks in the real video.

A cube is a few pixels across in a 128-px frame: its initial yaw cannot be read from the
first frame, yet which face the finger hits decides where a push sends it. The video
shows where it went, though:

1. ``object_tracks``: every object is localized (``localize.localize_object``) in every
   ``every``-th real frame (pinhole geometry, the calibrated camera), with the arm's
   pixels (the twin's silhouette at that frame's recorded joints, dilated) excluded; a
   frame counts for an object only when the arm hides little of it there.
2. ``refine_initial_poses``: for each object that moves (in the track or in the replay
   from the first-frame estimate), the physics replay (no rendering) is run from
   candidate initial poses (yaw over the shape's symmetry period, then a small x/y/yaw
   grid around the best) and the pose whose simulated track best matches the observed one
   (robust loss over the frames where it is visible) is kept. Objects that do not move
   keep their first-frame estimate. Candidates restart from a saved physics state taken
   before the arm comes near the object (the replay is identical up to then), so a
   candidate costs only the part of the episode after the approach.

Deterministic: fixed candidate lists, MuJoCo's physics, no random numbers.
"""
from __future__ import annotations

import cv2
import mujoco
import numpy as np

from comsim.sim.scene import OBJECT_PREFIX, ROBOT_PREFIX, Scene, yaw_quat
from comsim.sim.spec import SceneSpec
from comsim.sim.camera import project_points
from comsim.twin.localize import (CHANGE, change_not_shadow, colour_likelihood, coverage, expected_area_px,
                                    local_background, object_points, symmetry)
from comsim.twin.silhouette import RobotSilhouette

EVERY = 2  # frames compared: every EVERY-th
YAW_STEPS = 9  # grid: yaw over the symmetry period in this many steps (10 deg for a cube) ...
LATERAL_M = (-0.004, -0.002, 0.0, 0.002, 0.004)  # ... x offsets across the arm's approach
APPROACH_S = 0.6  # candidates restart this long before the arm first touches the object
MOVED_M = 0.002  # an object the first-frame replay moves by this much is refined


class Evidence:
    """Per compared frame: the arm's pixels (the twin's silhouette at the recorded joints,
    dilated; never evidence) and, per object, its colour evidence (``colour_likelihood``)
    and the change from the robot-free background that is not a shadow (when there is one)."""

    def __init__(self, frames: np.ndarray, states: np.ndarray, spec: SceneSpec, cam: str, K, T, colors=None,
                 background=None, every: int = EVERY):
        c = spec.camera(cam)
        self.K, self.T = np.asarray(K, np.float64), np.asarray(T, np.float64)
        self.frames = np.arange(0, len(frames), every)
        self.H, self.W = frames.shape[1:3]
        self.valid, self.like, self.change = [], {o.name: [] for o in spec.objects}, []
        k5 = np.ones((5, 5), np.uint8)
        with RobotSilhouette(spec, c.K, c.width, c.height, visual=spec.robot.visual) as sil:
            sil.set_camera(self.T)
            for k in self.frames:
                sil.set_joints(states[k, :7], [states[k, 7] / 2] * 2)
                valid = cv2.dilate(sil.mask().astype(np.uint8), k5) == 0
                self.valid.append(valid.astype(np.float32))
                img = frames[k]
                for o in spec.objects:
                    rgb = o.rgba if colors is None or o.name not in colors else colors[o.name]
                    size = np.sqrt(max(expected_area_px(o, K, T, 0.4, 0.0), 1.0))
                    bg = local_background(img, size) if background is None else background
                    self.like[o.name].append(colour_likelihood(img, rgb, bg) * valid)
                self.change.append(None if background is None else change_not_shadow(img, background, *CHANGE) * valid)

    def frame_loss(self, obj, j: int, x: float, y: float, yaw: float, static: bool) -> float:
        """Squared difference between the object's silhouette at (x, y, yaw) and the evidence in
        compared frame ``j``, over the pixels the arm leaves visible, minus the same for no
        object there, per pixel of the whole silhouette: -1 a perfect visible fit, 0 hidden
        or nothing said, +1 visible where nothing is. ``static``: the object has not moved
        yet; then change evidence counts too (faces whose colour the light washes out)."""
        uv = project_points(self.K, self.T, object_points(obj, x, y, yaw))
        x0, y0 = np.floor(uv.min(0)).astype(int) - 3
        x1, y1 = np.ceil(uv.max(0)).astype(int) + 4
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(self.W, x1), min(self.H, y1)
        if x1 - x0 < 2 or y1 - y0 < 2:
            return 0.0
        top, side = coverage(obj, (x, y, yaw), self.K, self.T, (x0, y0, x1, y1))
        cov = np.clip(top + side, 0.0, 1.0)
        area = float((cov ** 2).sum())
        if area <= 0:
            return 0.0
        v = self.valid[j][y0:y1, x0:x1]
        t = self.like[obj.name][j][y0:y1, x0:x1]
        if static and self.change[j] is not None:
            t = np.maximum(t, self.change[j][y0:y1, x0:x1])
        return float(((cov ** 2) * v).sum() - 2.0 * (cov * t).sum()) / area

    def loss(self, obj, pos: np.ndarray, quat: np.ndarray, k_move: int) -> float:
        """Mean ``frame_loss`` over the compared frames of a replayed track (pos (n, 3), quat (n, 4))."""
        out = [self.frame_loss(obj, j, pos[k, 0], pos[k, 1], quat_yaw(quat[k]), k < k_move)
               for j, k in enumerate(self.frames)]
        return float(np.mean(out))


def quat_yaw(q) -> float:
    w, x, y, z = q
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


class PhysicsReplay:
    """The physics replay of one episode without rendering, restartable from saved states."""

    def __init__(self, spec: SceneSpec, state: np.ndarray, action: np.ndarray, timestamps: np.ndarray):
        self.scene = Scene(spec)
        self.state0, self.action = np.asarray(state[0], np.float64), np.asarray(action, np.float64)
        t = np.asarray(timestamps, np.float64)
        self.n = len(self.action)
        sub = self.scene.spec.physics.substeps
        self.substeps = [max(1, int(round((t[k + 1] - t[k]) / self.scene.control_dt))) * sub for k in range(self.n - 1)]
        self.kind = mujoco.mjtState.mjSTATE_INTEGRATION
        self.size = mujoco.mj_stateSize(self.scene.model, self.kind)
        m = self.scene.model
        robot_bodies = {b for b in range(m.nbody) if m.body(b).name.startswith(ROBOT_PREFIX)}
        self.robot_geoms = np.array([g for g in range(m.ngeom) if m.geom_bodyid[g] in robot_bodies])
        self.obj_geoms = {n: np.flatnonzero(m.geom_bodyid == m.body(OBJECT_PREFIX + n).id)
                          for n in self.scene.object_names}

    def run(self, poses: dict, save: bool = False, start: tuple | None = None):
        """Object positions (n, n_obj, 3) and quaternions (n, n_obj, 4) at every frame, contact
        flags (n, n_obj) with the robot, and (if ``save``) the physics state before each step.
        ``start``: (frame, saved state) to continue from, ``poses`` written over the objects'.
        Steps exactly as ``replay.replay_episode`` does (same resets, same substeps)."""
        sc = self.scene
        pos = np.full((self.n, len(sc.object_names), 3), np.nan)
        quat = np.full((self.n, len(sc.object_names), 4), np.nan)
        touch = np.zeros((self.n, len(sc.object_names)), bool)
        self.tcp = np.full((self.n, 3), np.nan)
        states = [] if save else None
        if start is None:
            sc.reset(arm_qpos=self.state0[:7], object_poses=poses)
            sc.set_robot_qpos(self.state0[:7], float(self.state0[7]))
            k0 = 0
        else:
            k0, st = start
            mujoco.mj_setState(sc.model, sc.data, st, self.kind)
            for name, pose in poses.items():
                sc._write_object(name, *pose)
            mujoco.mj_forward(sc.model, sc.data)
        for k in range(k0, self.n):
            for i, name in enumerate(sc.object_names):
                pos[k, i], quat[k, i] = sc.object_pose(name)
            touch[k] = self._touching()
            self.tcp[k] = sc.data.site_xpos[sc.tcp_site]
            if save:
                st = np.empty(self.size)
                mujoco.mj_getState(sc.model, sc.data, st, self.kind)
                states.append(st)
            if k < self.n - 1:
                sc.step(self.action[k, :8], n_substeps=self.substeps[k])
        return pos, quat, touch, states

    def _touching(self) -> np.ndarray:
        d, names = self.scene.data, self.scene.object_names
        out = np.zeros(len(names), bool)
        if d.ncon == 0:
            return out
        g1, g2 = d.contact.geom1[:d.ncon], d.contact.geom2[:d.ncon]
        rob1, rob2 = np.isin(g1, self.robot_geoms), np.isin(g2, self.robot_geoms)
        for i, n in enumerate(names):
            og = self.obj_geoms[n]
            out[i] = bool(np.any((rob1 & np.isin(g2, og)) | (rob2 & np.isin(g1, og))))
        return out


def refine_initial_poses(replay: PhysicsReplay, spec: SceneSpec, first: dict, evidence: Evidence, fps: float,
                         log=None) -> dict:
    """{name: {"pos", "yaw", "refined", "track_residual", "first_frame_track_residual", ...}}
    plus "simulations" (how many physics replays were run).

    ``first``: the first-frame estimates (``localize_objects``). An object is refined when the
    replay from the first-frame estimates touches or moves it; the others keep their pose.
    Objects are refined one at a time, in the order the arm reaches them, the others at
    their current best.
    """
    names = replay.scene.object_names
    objs = {o.name: o for o in spec.objects}
    cur = {n: (np.asarray(first[n]["pos"], np.float64), float(first[n]["yaw"]))
           for n in names if (first.get(n) or {}).get("found")}

    def poses(over=None):
        d = dict(cur, **(over or {}))
        return {n: (p, yaw_quat(y)) for n, (p, y) in d.items()}

    pos0, quat0, touch0, saved = replay.run(poses(), save=True)
    tcp0 = replay.tcp.copy()
    n_sims = 1
    order = []
    for i, n in enumerate(names):
        if n not in cur:
            continue
        moved = np.flatnonzero(np.linalg.norm(pos0[:, i, :2] - pos0[0, i, :2], axis=-1) > MOVED_M)
        touched = np.flatnonzero(touch0[:, i])
        ks = [int(a[0]) for a in (moved, touched) if a.size]
        if ks:
            order.append((min(ks), i, n))
    out = {}
    for k_first, i, n in sorted(order):
        k0 = max(0, k_first - int(round(APPROACH_S * fps)))
        obj = objs[n]
        period = symmetry(obj)
        p_first, y_first = cur[n]

        def sim(p, y):
            nonlocal n_sims
            n_sims += 1
            over = poses({n: (p, y)})
            st = (k0, saved[k0]) if k0 > 0 else None
            if st is not None:  # the arm must not already touch the candidate at the restart
                mujoco.mj_setState(replay.scene.model, replay.scene.data, saved[k0], replay.kind)
                for name, pose in over.items():
                    replay.scene._write_object(name, *pose)
                mujoco.mj_forward(replay.scene.model, replay.scene.data)
                if replay._touching()[i]:
                    st = None
            pos, quat, _, _ = replay.run(over, start=st)
            if st is not None:  # at rest until the restart
                pos[:k0], quat[:k0] = pos[k0], quat[k0]
            return evidence.loss(obj, pos[:, i], quat[:, i], k0)

        base = evidence.loss(obj, pos0[:, i], quat0[:, i], k0)
        # Which face the finger meets, and where along it, decides the push: search yaw and
        # the offset across the fingertip's approach (along it, the still frames pin it down).
        tcp = tcp0[max(0, k_first - 3):k_first + 1, :2]
        d = tcp[-1] - tcp[0] if len(tcp) > 1 else np.zeros(2)
        d = d / np.linalg.norm(d) if np.linalg.norm(d) > 1e-4 else np.array([1.0, 0.0])
        across = np.array([-d[1], d[0], 0.0])
        step = 0.0 if period is None else period / YAW_STEPS
        cands = {(0.0, round(y_first, 6)): base}
        for j in range(1 if period is None else YAW_STEPS):
            for lat in LATERAL_M:
                key = (lat, round(y_first + step * j, 6))
                if key not in cands:
                    cands[key] = sim(p_first + across * lat, key[1])
        blat, byaw = min(cands, key=cands.get)
        dl = (LATERAL_M[1] - LATERAL_M[0]) / 2
        for olat in (-dl, 0.0, dl):
            for oyaw in ((0.0,) if period is None else (-step / 3, 0.0, step / 3)):
                key = (round(blat + olat, 6), round(byaw + oyaw, 6))
                if key not in cands:
                    cands[key] = sim(p_first + across * key[0], key[1])
        best = min(cands, key=cands.get)
        p_best = p_first + across * best[0]
        y_best = y_first if period is None else float((best[1] + period / 2) % period - period / 2)
        cur[n] = (p_best, y_best)
        out[n] = {"pos": [float(v) for v in p_best], "yaw": y_best, "refined": True,
                  "first_frame_pos": [float(v) for v in p_first], "first_frame_yaw": y_first,
                  "track_residual": cands[best], "first_frame_track_residual": base,
                  "first_contact_frame": k_first, "restart_frame": k0, "candidates": len(cands)}
        if log:
            log(f"[track] {n}: yaw {np.degrees(y_first):.1f} -> {np.degrees(y_best):.1f} deg, "
                f"{1000 * best[0]:+.0f} mm across the approach, track residual {base:.3f} -> "
                f"{cands[best]:.3f} ({len(cands)} candidates from frame {k0})")
    for n in cur:
        if n not in out:
            p, y = cur[n]
            out[n] = {"pos": [float(v) for v in p], "yaw": y, "refined": False}
    return {"objects": out, "simulations": n_sims}
