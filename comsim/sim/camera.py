"""OpenCV cameras <-> MuJoCo cameras. The ONLY place that converts between the two.

OpenCV: ``K`` = (fx, fy, cx, cy) in pixels at W x H, pixel (0, 0) centred at (0, 0);
``T_cam_from_base`` maps base-frame points into the camera frame (x right, y down,
z forward). MuJoCo: a camera body frame looking along -z with y up, and (MuJoCo >= 3.2)
``resolution``, ``sensorsize``, ``focalpixel`` and ``principalpixel`` (compiled into
``cam_intrinsic``; setting ``intrinsic`` directly on an MjSpec camera is ignored).

With sensorsize = resolution = (W, H) the sensor unit is one pixel and the principal
point offset from the image centre is measured in OpenGL pixel coordinates, whose
pixel centres sit at i + 0.5: so OpenCV's ``cx`` is at ``cx + 0.5`` there. MuJoCo's
offset points the other way from OpenCV's (both signs flip); the test in
tests/test_sim.py renders a point with an off-centre principal point to check this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# OpenCV camera axes expressed in MuJoCo camera axes (x same, y and z flipped).
_CV_TO_MJ = np.diag([1.0, -1.0, -1.0])


def as_K(K: Any) -> np.ndarray:
    """(fx, fy, cx, cy) from a 4-vector or a 3x3 matrix; ValueError otherwise."""
    try:
        a = np.asarray(K, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"expected [fx, fy, cx, cy] or a 3x3 matrix of numbers, got {K!r}") from None
    if a.shape == (3, 3):
        if abs(a[0, 1]) > 1e-9 or np.abs(a[2] - [0, 0, 1]).max() > 1e-9 or abs(a[1, 0]) > 1e-9:
            raise ValueError(f"expected a 3x3 pinhole K [[fx,0,cx],[0,fy,cy],[0,0,1]] (no skew), got {a.tolist()}")
        a = np.array([a[0, 0], a[1, 1], a[0, 2], a[1, 2]])
    if a.shape != (4,):
        raise ValueError(f"expected [fx, fy, cx, cy] or a 3x3 matrix, got shape {a.shape}: {np.asarray(K).tolist()}")
    if a[0] <= 0 or a[1] <= 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"focal lengths must be positive and finite, got {a.tolist()}")
    return a


def as_rigid(T: Any, tol: float = 1e-4) -> np.ndarray:
    """A 4x4 float array that is a proper rigid transform; ValueError otherwise."""
    try:
        a = np.asarray(T, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"expected a 4x4 rigid transform (nested list of numbers), got {T!r}") from None
    if a.shape != (4, 4):
        raise ValueError(f"expected a 4x4 rigid transform, got shape {a.shape}")
    if not np.all(np.isfinite(a)):  # NaN fails every comparison below, so it would pass them
        raise ValueError(f"expected a 4x4 rigid transform of finite numbers, got {a.round(4).tolist()}")
    R = a[:3, :3]
    if (np.abs(R.T @ R - np.eye(3)).max() > tol or abs(np.linalg.det(R) - 1) > tol
            or np.abs(a[3] - [0, 0, 0, 1]).max() > tol):
        raise ValueError("expected a 4x4 rigid transform (orthonormal rotation, det +1, last row 0 0 0 1), "
                         f"got {a.round(4).tolist()}")
    return a


def invert_rigid(T: np.ndarray) -> np.ndarray:
    R, t = T[:3, :3], T[:3, 3]
    out = np.eye(4)
    out[:3, :3] = R.T
    out[:3, 3] = -R.T @ t
    return out


@dataclass
class MujocoCameraParams:
    pos: np.ndarray  # (3,) camera centre in the world frame
    quat: np.ndarray  # (4,) w x y z, MuJoCo camera frame in the world frame
    resolution: tuple[int, int]
    sensorsize: tuple[float, float]
    focal_pixel: tuple[float, float]
    principal_pixel: tuple[float, float]  # offset from the image centre, MuJoCo's sign


def opencv_to_mujoco(K: Any, T_cam_from_base: Any, width: int, height: int,
                     T_world_from_base: np.ndarray | None = None) -> MujocoCameraParams:
    """MuJoCo camera parameters that render exactly what the OpenCV camera sees."""
    import mujoco

    fx, fy, cx, cy = as_K(K)
    T_base_from_cam = invert_rigid(as_rigid(T_cam_from_base))
    T_world_from_cam = T_base_from_cam if T_world_from_base is None else T_world_from_base @ T_base_from_cam
    R_mj = T_world_from_cam[:3, :3] @ _CV_TO_MJ
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, R_mj.reshape(-1))
    principal = (-(cx + 0.5 - width / 2), -(cy + 0.5 - height / 2))
    return MujocoCameraParams(
        pos=T_world_from_cam[:3, 3].copy(), quat=quat, resolution=(int(width), int(height)),
        sensorsize=(float(width), float(height)), focal_pixel=(fx, fy), principal_pixel=principal)


def project_points(K: Any, T_cam_from_base: Any, pts_base: Any) -> np.ndarray:
    """OpenCV pinhole projection of base-frame points (N, 3) -> pixel coordinates (N, 2)."""
    fx, fy, cx, cy = as_K(K)
    T = as_rigid(T_cam_from_base)
    p = np.atleast_2d(np.asarray(pts_base, dtype=np.float64)) @ T[:3, :3].T + T[:3, 3]
    return np.stack([fx * p[:, 0] / p[:, 2] + cx, fy * p[:, 1] / p[:, 2] + cy], axis=1)


def scale_K(K: Any, width: int, height: int, new_width: int, new_height: int) -> np.ndarray:
    """(fx, fy, cx, cy) of the same camera imaged at another resolution."""
    fx, fy, cx, cy = as_K(K)
    sx, sy = new_width / width, new_height / height
    # Pixel centres at integers: the image edge is at -0.5, which must stay put.
    return np.array([fx * sx, fy * sy, (cx + 0.5) * sx - 0.5, (cy + 0.5) * sy - 0.5])


def shifted_camera(T_cam_from_base: Any, K: Any, shift_px) -> np.ndarray:
    """``T_cam_from_base`` rotated about the camera centre so that the image moves by ``shift_px`` (x, y):
    a rotation by dx / fx about the camera's y axis and by -dy / fy about its x axis (OpenCV axes). A
    camera knocked or drifting on its mount turns more than it travels: its image shifts."""
    from scipy.spatial.transform import Rotation

    fx, fy, _, _ = as_K(K)
    R = np.eye(4)
    R[:3, :3] = Rotation.from_rotvec([-shift_px[1] / fy, shift_px[0] / fx, 0.0]).as_matrix()
    return R @ np.asarray(T_cam_from_base, np.float64)


def look_at(eye: Any, target: Any, up: Any = (0.0, 0.0, 1.0)) -> np.ndarray:
    """``T_cam_from_base`` of an OpenCV camera at ``eye`` looking at ``target``."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:
        raise ValueError("look_at: viewing direction is parallel to `up`")
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    T_base_from_cam = np.eye(4)
    T_base_from_cam[:3, :3] = np.stack([x, y, z], axis=1)
    T_base_from_cam[:3, 3] = eye
    return invert_rigid(T_base_from_cam)
