"""Headless rendering of a scene camera: RGB, segmentation labels, metric depth.

Fast by default: the scene's lights cast no shadows unless the spec asks for them and
multisampling is off (``render.offsamples: 0``), which is what lets llvmpipe draw the
light-visual Panda cell at hundreds of frames per second at 128x128.

Close renderers explicitly (``close()`` or ``with SceneRenderer(...) as r:``): each one
holds an OpenGL context.
"""
from __future__ import annotations

import mujoco
import numpy as np

from comsim.sim.scene import Scene, geom_labels


class SceneRenderer:
    """Render one camera of a Scene (or a bare MjModel) at ``width`` x ``height``.

    The size defaults to the camera's resolution in the spec; another size must keep the
    aspect ratio (the image is the same view, with K scaled: see ``camera.scale_K``).
    """

    def __init__(self, scene_or_model: Scene | mujoco.MjModel, camera: str | int,
                 width: int | None = None, height: int | None = None):
        if isinstance(scene_or_model, Scene):
            self.model, self._data = scene_or_model.model, scene_or_model.data
        else:
            self.model, self._data = scene_or_model, None
        m = self.model
        cam_id = camera if isinstance(camera, int) else mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if not 0 <= cam_id < m.ncam:
            names = [m.camera(i).name for i in range(m.ncam)]
            raise ValueError(f"SceneRenderer: no camera {camera!r}; the model has {names}")
        self.camera_id = cam_id
        cam_w, cam_h = (int(v) for v in m.cam_resolution[cam_id])
        self.width, self.height = width or cam_w, height or cam_h
        if m.cam_sensorsize[cam_id][0] > 0 and abs(self.width / self.height - cam_w / cam_h) > 0.01:
            raise ValueError(f"SceneRenderer: {self.width}x{self.height} does not keep camera "
                             f"{camera!r}'s aspect ratio ({cam_w}x{cam_h})")
        self._labels = np.concatenate([geom_labels(m), [0]])  # index -1 (background) -> 0
        # The offscreen buffer size is read when a GL context is made: grow it if needed.
        m.vis.global_.offwidth = max(m.vis.global_.offwidth, self.width)
        m.vis.global_.offheight = max(m.vis.global_.offheight, self.height)
        self._renderer = mujoco.Renderer(m, self.height, self.width)

    def _data_or_default(self, data):
        if data is None:
            if self._data is None:
                raise ValueError("SceneRenderer built from an MjModel needs `data`")
            return self._data
        return data

    def _render(self, data) -> np.ndarray:
        if self._renderer is None:
            raise RuntimeError("SceneRenderer is closed")
        self._renderer.update_scene(self._data_or_default(data), self.camera_id)
        return self._renderer.render()

    def rgb(self, data: mujoco.MjData | None = None) -> np.ndarray:
        """uint8 (H, W, 3)."""
        return self._render(data)

    def segmentation(self, data: mujoco.MjData | None = None) -> np.ndarray:
        """int32 (H, W): 0 background, 1 robot, 2 + i the spec's i-th object (CONTRACTS.md)."""
        self._renderer.enable_segmentation_rendering()
        try:
            seg = self._render(data)
        finally:
            self._renderer.disable_segmentation_rendering()
        objid, objtype = seg[..., 0], seg[..., 1]
        is_geom = objtype == int(mujoco.mjtObj.mjOBJ_GEOM)  # MuJoCo 4 enums are not ints
        return np.where(is_geom, self._labels[np.where(is_geom, objid, -1)], 0).astype(np.int32)

    def depth(self, data: mujoco.MjData | None = None) -> np.ndarray:
        """float32 (H, W): distance along the optical axis in metres."""
        self._renderer.enable_depth_rendering()
        try:
            return self._render(data)
        finally:
            self._renderer.disable_depth_rendering()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self) -> "SceneRenderer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
