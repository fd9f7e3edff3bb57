"""The lab: a stand-in for reality (the first stage of the README's tour).

The same MuJoCo physics as the twin, a different look (procedural textures, lights with
shadows, a tinted robot, a real sensor: distortion, blur, vignetting, white balance, noise,
compression) and hidden ground truth that the twin never reads.

    from comsim.lab import LabEnv, record_dataset, load_lab_truth, load_camera_intrinsics

    record_dataset("stack", episodes=10, out="runs/lab_stack")       # scripted teleop -> LeRobotDataset
    env = LabEnv(task="push"); obs = env.reset(seed=0)              # closed loop, for policies
    obs, success, done = env.step(action)

Modules: cell (YAML -> LabCell), look (textures, lights, LabCamera), effects (sensor model),
realism (what no twin models, off by default: prints, clutter, distractors, light and exposure
that change between episodes, a camera that moves, motion blur, physics drift), tasks (layouts,
success predicates), teleop (scripted operator), env (LabEnv), record (datasets), truth (hidden
truth and public intrinsics files).
"""
from comsim.lab.cell import DEFAULT_CELL, LabCell, load_lab_cell
from comsim.lab.env import LabEnv
from comsim.lab.record import episode_seed, record_dataset, record_episode
from comsim.lab.tasks import TASKS, TaskState, make_task
from comsim.lab.teleop import ScriptedTeleoperator
from comsim.lab.truth import LabTruth, camera_intrinsics, load_camera_intrinsics, load_lab_truth

__all__ = ["DEFAULT_CELL", "LabCell", "LabEnv", "LabTruth", "ScriptedTeleoperator", "TASKS", "TaskState",
           "camera_intrinsics", "episode_seed", "load_camera_intrinsics", "load_lab_cell", "load_lab_truth",
           "make_task", "record_dataset", "record_episode"]
