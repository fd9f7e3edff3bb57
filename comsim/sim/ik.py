"""Damped-least-squares inverse kinematics for the TCP site.

Works on a scratch MjData, so the scene's own state is never touched. Joint limits are
respected by clipping every iterate; a small null-space pull towards a rest posture
keeps the elbow where a person would expect it.
"""
from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np


@dataclass
class IKResult:
    q: np.ndarray  # (7,) joint positions
    pos_err: float  # metres
    rot_err: float  # radians (0 when no orientation was asked for)
    converged: bool
    iters: int


def top_down_quat(yaw: float = 0.0) -> np.ndarray:
    """TCP orientation pointing straight down (z_tcp = -z), x_tcp at ``yaw`` about world z.

    The fingers close along the TCP y axis, i.e. along (sin yaw, -cos yaw, 0).
    """
    c, s = np.cos(yaw), np.sin(yaw)
    R = np.array([[c, s, 0.0], [s, -c, 0.0], [0.0, 0.0, -1.0]])  # columns: x, y, z of the TCP
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, R.reshape(-1))
    return quat


def solve_ik(scene, pos, quat=None, q_init=None, *, max_iters: int = 300, tol_pos: float = 1e-4,
             tol_rot: float = 1e-3, damping: float = 1e-2, rest=None) -> IKResult:
    """Joints that put the scene's TCP at ``pos`` (and ``quat``, w x y z, if given).

    ``q_init`` defaults to the scene's current arm joints; ``rest`` (default: the spec's
    initial posture) is the null-space target.
    """
    model = scene.model
    data = scene.scratch_data
    data.qpos[:] = scene.data.qpos
    qadr, dofadr, (lo, hi) = scene.arm_qadr, scene.arm_dofadr, scene.arm_range.T
    q = np.clip(np.asarray(scene.get_state()[:7] if q_init is None else q_init, dtype=np.float64), lo, hi)
    rest = np.asarray(scene.spec.robot.init_qpos if rest is None else rest, dtype=np.float64)
    target_pos = np.asarray(pos, dtype=np.float64)
    target_quat = None if quat is None else np.asarray(quat, dtype=np.float64) / np.linalg.norm(quat)
    site = scene.tcp_site
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    cur_quat, err_quat, neg = np.zeros(4), np.zeros(4), np.zeros(4)
    rot_vec = np.zeros(3)
    pos_err = rot_err = np.inf
    for it in range(max_iters + 1):
        data.qpos[qadr] = q
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        e_pos = target_pos - data.site_xpos[site]
        pos_err = float(np.linalg.norm(e_pos))
        mujoco.mj_jacSite(model, data, jacp, jacr, site)
        if target_quat is not None:
            mujoco.mju_mat2Quat(cur_quat, data.site_xmat[site])
            mujoco.mju_negQuat(neg, cur_quat)
            mujoco.mju_mulQuat(err_quat, target_quat, neg)  # world-frame rotation current -> target
            mujoco.mju_quat2Vel(rot_vec, err_quat, 1.0)
            rot_err = float(np.linalg.norm(rot_vec))
            e = np.concatenate([e_pos, rot_vec])
            J = np.vstack([jacp[:, dofadr], jacr[:, dofadr]])
        else:
            rot_err = 0.0
            e, J = e_pos, jacp[:, dofadr]
        if pos_err < tol_pos and rot_err < tol_rot:
            return IKResult(q.copy(), pos_err, rot_err, True, it)
        if it == max_iters:
            break
        JJt = J @ J.T + damping**2 * np.eye(len(e))
        dq = J.T @ np.linalg.solve(JJt, e)
        # Null-space posture term: moves along directions that do not disturb the TCP.
        J_pinv = J.T @ np.linalg.inv(JJt)
        dq += (np.eye(7) - J_pinv @ J) @ (0.1 * (rest - q))
        step = np.abs(dq).max()
        if step > 0.2:  # keep iterates in the region where the linearisation holds
            dq *= 0.2 / step
        q = np.clip(q + dq, lo, hi)
    return IKResult(q.copy(), pos_err, rot_err, False, max_iters)
