"""The twin's view through the REAL camera: pinhole render + the camera's lens distortion.

Paired data must be pixel-aligned with the real video, so when the real camera has
distortion (published in ``camera_intrinsics.json`` or a calibration), the twin renders a
slightly wider pinhole view (a margin on every side, so the distortion has real content to
pull in at the corners) and warps it with the same OpenCV model. Labels are warped with
nearest-neighbour sampling so that they stay labels.
"""
from __future__ import annotations

import copy

import cv2
import mujoco
import numpy as np

from comsim.sim.camera import as_K, opencv_to_mujoco
from comsim.sim.render import SceneRenderer
from comsim.sim.scene import Scene
from comsim.sim.spec import CameraSpec, SceneSpec

DEPTH_MAX_M = 2.55  # depth video: 1 grey level per cm, 0..2.55 m


def render_margin(width: int, height: int, dist) -> int:
    return 0 if dist is None else int(np.ceil(0.08 * max(width, height))) + 2


def with_render_camera(spec: SceneSpec, cam: str, dist) -> tuple[SceneSpec, str, int]:
    """A copy of ``spec`` with an extra, wider pinhole camera to render ``cam`` from."""
    c = spec.camera(cam)
    m = render_margin(c.width, c.height, dist)
    if m == 0:
        return spec, cam, 0
    fx, fy, cx, cy = as_K(c.K)
    out = copy.deepcopy(spec)
    name = f"{cam}_twin_render"
    out.cameras.append(CameraSpec(name=name, width=c.width + 2 * m, height=c.height + 2 * m,
                                  K=[fx, fy, cx + m, cy + m], T_cam_from_base=c.T_cam_from_base))
    return out, name, m


class RealCameraView:
    """RGB / labels / depth of the twin as the real (distorted) camera records them."""

    def __init__(self, scene: Scene, cam: str, render_cam: str, K, dist, width: int, height: int, margin: int):
        self.renderer = SceneRenderer(scene, render_cam)
        self.scene = scene
        self.width, self.height, self.margin = width, height, margin
        fx, fy, cx, cy = as_K(K)
        self.render_K = (fx, fy, cx + margin, cy + margin)
        if dist is not None and margin > 0:
            fx, fy, cx, cy = as_K(K)
            Km = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1.0]])
            Kr = np.array([[fx, 0, cx + margin], [0, fy, cy + margin], [0, 0, 1.0]])
            ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
            pts = np.stack([xs.ravel(), ys.ravel()], -1)[:, None, :]
            src = cv2.undistortPoints(pts, Km, np.asarray(dist, np.float64), P=Kr).reshape(height, width, 2)
            self.map_x, self.map_y = src[..., 0].astype(np.float32), src[..., 1].astype(np.float32)
        else:
            self.map_x = self.map_y = None

    def place_camera(self, T_cam_from_base) -> None:
        """Move the camera to ``T_cam_from_base`` for the next frames (a camera that moved after its
        calibration: ``comsim.twin.camera_motion``)."""
        m, d = self.scene.model, self.scene.data
        T_world_from_base = np.eye(4)
        T_world_from_base[:3, 3] = self.scene.spec.robot.base_pos
        p = opencv_to_mujoco(self.render_K, T_cam_from_base, self.width + 2 * self.margin,
                             self.height + 2 * self.margin, T_world_from_base)
        cid = self.renderer.camera_id
        m.cam_pos[cid], m.cam_quat[cid] = p.pos, p.quat
        mujoco.mj_camlight(m, d)

    def _warp(self, img: np.ndarray, nearest: bool = False) -> np.ndarray:
        if self.map_x is None:
            return img
        return cv2.remap(img, self.map_x, self.map_y, cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR,
                         borderMode=cv2.BORDER_REPLICATE)

    def rgb(self) -> np.ndarray:
        return self._warp(self.renderer.rgb())

    def segmentation(self) -> np.ndarray:
        return self._warp(self.renderer.segmentation().astype(np.float32), nearest=True).astype(np.int32)

    def depth(self) -> np.ndarray:
        return self._warp(self.renderer.depth())

    def normals(self) -> np.ndarray:
        """float32 (H, W, 3) unit surface normals in the camera frame (OpenCV), as the real camera records
        them: computed in the pinhole render (its own K, margin included), then moved by the lens with the
        pixels (a normal's direction does not depend on where the lens puts it)."""
        fx, fy, cx, cy = as_K(self.render_K)
        n = normals_from_depth(self.renderer.depth(), (fx, fy, cx, cy))
        if self.map_x is None:
            return n
        n = self._warp(n)
        return n / np.maximum(np.linalg.norm(n, axis=-1, keepdims=True), 1e-6)

    def close(self) -> None:
        self.renderer.close()


def normals_from_depth(depth: np.ndarray, K) -> np.ndarray:
    """float32 (H, W, 3) unit normals in the camera frame (x right, y down, z forward) of a pinhole depth image
    (metres along the optical axis, camera ``K`` = fx, fy, cx, cy), turned towards the camera. Each pixel is
    back-projected to 3D and the normal is the cross product of the surface's central differences along the
    image rows and columns (one-sided at the border); a pixel with no depth gets the normal -z (facing the
    camera)."""
    fx, fy, cx, cy = as_K(K)
    z = np.asarray(depth, np.float64)
    far = ~np.isfinite(z)
    z = np.where(far, np.nanmax(np.where(far, np.nan, z)) if (~far).any() else 1.0, z)
    H, W = z.shape
    v, u = np.mgrid[0:H, 0:W].astype(np.float64)
    P = np.stack([(u - cx) / fx * z, (v - cy) / fy * z, z], -1)
    n = np.cross(np.gradient(P, axis=1), np.gradient(P, axis=0))
    n /= np.maximum(np.linalg.norm(n, axis=-1, keepdims=True), 1e-12)
    n = np.where((n * P).sum(-1, keepdims=True) > 0, -n, n)  # facing the camera: n . (point - camera) < 0
    n[far] = (0.0, 0.0, -1.0)
    return n.astype(np.float32)


def normal_to_rgb(normals: np.ndarray) -> np.ndarray:
    """Unit normals as a video frame: each component from [-1, 1] to 0..255 (smooth, so it survives H.264)."""
    return np.clip((np.asarray(normals, np.float32) + 1.0) * 127.5 + 0.5, 0, 255).astype(np.uint8)


def depth_to_rgb(depth: np.ndarray) -> np.ndarray:
    g = np.clip(np.nan_to_num(depth, nan=DEPTH_MAX_M, posinf=DEPTH_MAX_M) * 100.0, 0, 255).astype(np.uint8)
    return np.repeat(g[..., None], 3, -1)
