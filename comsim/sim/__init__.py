"""MuJoCo scenes from YAML specs, headless rendering, IK.

    spec = load_scene_spec("configs/twin/panda_cell.yaml")
    scene = Scene(spec)                       # or Scene(spec, mjspec=build_mjspec(spec) + edits)
    with SceneRenderer(scene, "front") as r:
        rgb, seg, depth = r.rgb(), r.segmentation(), r.depth()
    q = solve_ik(scene, pos, top_down_quat(yaw)).q
    state = scene.step(np.concatenate([q, [1.0]]))
"""
import os

# Headless machines have no display for GLFW (MuJoCo's default); EGL works there. This
# must happen before mujoco picks its GL backend, i.e. before mujoco is first imported.
if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")

from comsim.sim.camera import look_at, opencv_to_mujoco, project_points, scale_K  # noqa: E402
from comsim.sim.ik import IKResult, solve_ik, top_down_quat  # noqa: E402
from comsim.sim.render import SceneRenderer  # noqa: E402
from comsim.sim.scene import Scene, build_mjspec, geom_labels  # noqa: E402
from comsim.sim.spec import SceneSpec, load_scene_spec, scene_spec_from_dict, spec_hash  # noqa: E402

__all__ = [
    "IKResult", "Scene", "SceneRenderer", "SceneSpec", "build_mjspec", "geom_labels", "load_scene_spec",
    "look_at", "opencv_to_mujoco", "project_points", "scale_K", "scene_spec_from_dict", "solve_ik",
    "spec_hash", "top_down_quat",
]
