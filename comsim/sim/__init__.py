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


def _load_triton_before_gl() -> None:
    # Triton's own LLVM (libtriton.so) and Mesa's (llvmpipe, the EGL renderer here) clash:
    # loading libtriton AFTER MuJoCo has created a GL context segfaults, and diffusers/torch
    # load it lazily (so `render, then import the translator` crashed). Loaded first, both
    # work. Costs ~0.2 s, only where triton is installed (torch's CUDA wheels bring it).
    try:
        import triton._C.libtriton  # noqa: F401
    except Exception:  # not installed, or a build without _C: nothing to clash with
        pass


_load_triton_before_gl()

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
