"""The robot alone, seen by one OpenCV camera whose pose can change without recompiling.

Calibration renders the same robot thousands of times from slightly different camera
poses, so this model holds only the robot (no table, floor or backdrop: the masks it is
compared with are robot pixels, and nothing in the cell occludes the arm). Camera pose
and image size are set on the compiled model; ``opencv_to_mujoco`` does the conversion.
"""
from __future__ import annotations

import mujoco
import numpy as np

from comsim.sim.camera import as_K, as_rigid, opencv_to_mujoco, scale_K
from comsim.sim.scene import ROBOT_PREFIX, build_mjspec
from comsim.sim.spec import RobotSpec, SceneSpec, scene_spec_from_dict


def robot_spec(robot: str | RobotSpec | SceneSpec, visual: str = "full") -> RobotSpec:
    """A RobotSpec from a built-in name, a RobotSpec, or a twin SceneSpec (its robot)."""
    if isinstance(robot, SceneSpec):
        robot = robot.robot
    if isinstance(robot, str):
        robot = RobotSpec(name=robot)
    d = {k: getattr(robot, k) for k in RobotSpec.__dataclass_fields__}
    d["visual"] = visual
    return RobotSpec(**d)


class RobotSilhouette:
    """Masks and depth of the robot at given joints, through ``K`` (at ``width`` x ``height``).

    ``render(size)`` draws at any size with the image's aspect ratio (K is scaled);
    the mask is where the depth buffer hit the robot.
    """

    def __init__(self, robot: str | RobotSpec | SceneSpec, K, width: int, height: int, visual: str = "full"):
        self.K, self.width, self.height = as_K(K), int(width), int(height)
        r = robot_spec(robot, visual)
        data = {"robot": {k: getattr(r, k) for k in RobotSpec.__dataclass_fields__},
                "cameras": [{"name": "cam", "width": self.width, "height": self.height,
                             "K": self.K.tolist(), "T_cam_from_base": np.eye(4).tolist()}]}
        s = build_mjspec(scene_spec_from_dict(data, where="twin silhouette"))
        for name in ("table", "floor", "backdrop"):
            s.delete(s.geom(name))
        self.model = s.compile()
        self.data = mujoco.MjData(self.model)
        m = self.model
        self.arm_qadr = np.array([m.jnt_qposadr[m.joint(f"{ROBOT_PREFIX}joint{i}").id] for i in range(1, 8)])
        self.finger_qadr = np.array([m.jnt_qposadr[m.joint(f"{ROBOT_PREFIX}finger_joint{i}").id] for i in (1, 2)])
        self.base_pos = np.asarray(r.base_pos, np.float64)
        self._zfar = m.vis.map.zfar * m.stat.extent
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}
        self.T_cam_from_base = np.eye(4)

    def set_camera(self, T_cam_from_base) -> None:
        T = as_rigid(T_cam_from_base)
        T_world_from_base = np.eye(4)
        T_world_from_base[:3, 3] = self.base_pos
        p = opencv_to_mujoco(self.K, T, self.width, self.height, T_world_from_base)
        self.model.cam_pos[0], self.model.cam_quat[0] = p.pos, p.quat
        self.T_cam_from_base = T

    def set_joints(self, q7, fingers=(0.0, 0.0)) -> None:
        """Arm joints (7,) in radians and the two finger joint positions (metres each)."""
        self.data.qpos[self.arm_qadr] = q7
        self.data.qpos[self.finger_qadr] = fingers
        mujoco.mj_kinematics(self.model, self.data)

    def K_at(self, w: int, h: int) -> np.ndarray:
        return scale_K(self.K, self.width, self.height, w, h)

    def _renderer(self, w: int, h: int) -> mujoco.Renderer:
        if (w, h) not in self._renderers:
            if abs(w / h - self.width / self.height) > 0.01:
                raise ValueError(f"RobotSilhouette: {w}x{h} does not keep the image's aspect ratio "
                                 f"({self.width}x{self.height})")
            m = self.model
            m.vis.global_.offwidth = max(m.vis.global_.offwidth, w)
            m.vis.global_.offheight = max(m.vis.global_.offheight, h)
            r = mujoco.Renderer(m, h, w)
            r.enable_depth_rendering()
            self._renderers[(w, h)] = r
        return self._renderers[(w, h)]

    def depth(self, w: int | None = None, h: int | None = None) -> np.ndarray:
        """float32 (h, w) depth along the optical axis; inf where the robot is not."""
        r = self._renderer(w or self.width, h or self.height)
        mujoco.mj_camlight(self.model, self.data)  # camera pose changed on the model: refresh cam_xpos
        r.update_scene(self.data, 0)
        d = r.render().astype(np.float32)
        d[d >= 0.999 * self._zfar] = np.inf
        return d

    def mask(self, w: int | None = None, h: int | None = None) -> np.ndarray:
        return np.isfinite(self.depth(w, h))

    def close(self) -> None:
        for r in self._renderers.values():
            r.close()
        self._renderers.clear()

    def __enter__(self) -> "RobotSilhouette":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
