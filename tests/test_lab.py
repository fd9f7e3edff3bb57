"""comsim.lab: the reality stand-in. Real MuJoCo, real EGL rendering, real datasets.

Fast by default (~1 min): one recorded episode per task is shared by several tests.
`pytest -m slow tests/test_lab.py` records 10 episodes of each task through the CLI.
"""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from comsim.cli import main as cli_main  # noqa: E402
from comsim.config import ConfigError  # noqa: E402
from comsim.io.lerobot import LeRobotDataset  # noqa: E402
from comsim.lab import (LabEnv, TaskState, episode_seed, load_camera_intrinsics, load_lab_cell,  # noqa: E402
                        load_lab_truth, make_task, record_dataset)
from comsim.lab.look import render_intrinsics  # noqa: E402
from comsim.lab.teleop import ScriptedTeleoperator  # noqa: E402
from comsim.lab.env import OPERATOR_STREAM  # noqa: E402
from comsim.sim.camera import invert_rigid  # noqa: E402
from comsim.sim.render import SceneRenderer  # noqa: E402
from comsim.sim.scene import Scene  # noqa: E402
from comsim.sim.spec import CameraSpec, load_scene_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAB_CELL = ROOT / "configs" / "lab" / "default.yaml"
TWIN_CELL = ROOT / "configs" / "twin" / "panda_cell.yaml"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One recorded episode of each task (seed 3), shared by the tests below."""
    root = tmp_path_factory.mktemp("lab")
    return {task: record_dataset(task, episodes=1, out=root / task, seed=3) for task in ("push", "stack")}


# ---------------------------------------------------------------- the cell


def test_lab_cell_is_the_twin_cell_with_a_hidden_truth():
    cell, twin = load_lab_cell(), load_scene_spec(TWIN_CELL)
    assert cell.fps == 10 and cell.scene.camera("front").width == 128
    # Same physical cell ...
    assert [(o.name, o.shape, o.size) for o in cell.scene.objects] == [(o.name, o.shape, o.size) for o in twin.objects]
    assert cell.scene.table == twin.table and cell.scene.robot.init_qpos == twin.robot.init_qpos
    # ... but the true camera pose is >= 5 cm and >= 5 deg from the twin's nominal one,
    B_true = invert_rigid(np.asarray(cell.scene.camera("front").T_cam_from_base))
    B_nom = invert_rigid(np.asarray(twin.camera("front").T_cam_from_base))
    R = B_nom[:3, :3].T @ B_true[:3, :3]
    assert np.linalg.norm(B_true[:3, 3] - B_nom[:3, 3]) >= 0.05
    assert np.degrees(np.arccos((np.trace(R) - 1) / 2)) >= 5.0
    # ... and the colours differ somewhat.
    for lab_o, twin_o in zip(cell.scene.objects, twin.objects):
        assert 0.04 < np.abs(np.subtract(lab_o.rgba, twin_o.rgba)).max() < 0.3


def _edited_cell(tmp_path, edit) -> Path:
    data = yaml.safe_load(LAB_CELL.read_text())
    edit(data)
    path = tmp_path / "bad_lab.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["look"].update(sparkle=True), ["look", "unknown key", "sparkle"]),
    (lambda d: d["look"]["table"].update(pattern="marble"), ["look.table.pattern", "marble"]),
    (lambda d: d["tasks"]["push"]["regions"].update(green_cube={"x": [0, 1], "y": [0, 1]}),
     ["tasks.push.regions.green_cube", "no object"]),
    (lambda d: d["tasks"]["stack"]["regions"]["red_cube"].update(x=[0.6, 0.4]), ["tasks.stack.regions.red_cube.x"]),
    (lambda d: d["scene"]["objects"][0].update(size=[0.05]), ["scene.objects[0].size"]),
    (lambda d: d.update(camera="side"), ["camera", "side"]),
    (lambda d: d["operator"].update(speed=[1.3, 0.8]), ["operator.speed"]),
])
def test_malformed_cell_yaml_names_file_and_key(tmp_path, edit, expected):
    with pytest.raises(ConfigError) as e:
        load_lab_cell(_edited_cell(tmp_path, edit))
    msg = str(e.value)
    assert "bad_lab.yaml" in msg, msg
    for part in expected:
        assert part in msg, msg


def test_unknown_task_lists_the_known_ones(tmp_path, capsys):
    with pytest.raises(ValueError, match="known tasks: push, stack"):
        record_dataset("pour", episodes=1, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()  # failed before touching the disk
    assert cli_main(["lab", "record", "--task", "pour", "--out", str(tmp_path / "y")]) == 2
    assert "known tasks: push, stack" in capsys.readouterr().err


def test_success_predicates():
    cell = load_lab_cell()
    push, stack = make_task("push", cell), make_task("stack", cell)
    tx, ty = cell.tasks.push.target

    def state(red, blue, width=0.08, touching=False):
        return TaskState({"red_cube": np.array(red), "blue_cube": np.array(blue)},
                         {"red_cube": np.array([1.0, 0, 0, 0]), "blue_cube": np.array([1.0, 0, 0, 0])},
                         width, {"red_cube": touching, "blue_cube": False})

    far = [0.3, 0.3, 0.025]
    assert push.success(state([tx + 0.03, ty, 0.025], far))
    assert not push.success(state([tx + 0.05, ty, 0.025], far))
    assert not push.success(state([tx, ty, 0.2], far))  # held above the target is not on it
    assert stack.success(state([0.51, 0.1, 0.075], [0.5, 0.1, 0.025]))
    assert not stack.success(state([0.53, 0.1, 0.075], [0.5, 0.1, 0.025]))  # off by more than half a side
    assert not stack.success(state([0.5, 0.1, 0.095], [0.5, 0.1, 0.025]))  # still in the air
    assert not stack.success(state([0.5, 0.1, 0.075], [0.5, 0.1, 0.025], width=0.05))  # not released
    assert not stack.success(state([0.5, 0.1, 0.075], [0.5, 0.1, 0.025], touching=True))


# ---------------------------------------------------------------- the look


def test_look_differs_from_the_twin_but_geometry_lines_up():
    """Same state, true camera: the twin's render, put through the published lens, matches the
    lab's segmentation; the pictures themselves look very different."""
    with LabEnv(task="stack") as env:
        env.reset(seed=1)
        q = [0.3, -0.2, 0.1, -2.1, 0.1, 2.0, 0.5]
        env.scene.set_robot_qpos(q, 0.08)
        lab_rgb, lab_seg = env.camera.rgb(np.random.default_rng(0)), env.segmentation()
        poses = {n: env.scene.object_pose(n) for n in env.scene.object_names}
        sensor = env.camera.sensor

        cam = env.cell.scene.camera("front")
        K, w, h = render_intrinsics(env.cell)
        twin_spec = load_scene_spec(TWIN_CELL)
        twin_spec.cameras = [CameraSpec("front", w, h, K.tolist(), cam.T_cam_from_base)]
        twin = Scene(twin_spec)
        twin.set_robot_qpos(q, 0.08)
        for n, (p, quat) in poses.items():
            twin.set_object_pose(n, p, quat)
        with SceneRenderer(twin, "front") as r:
            twin_rgb, twin_seg = sensor.warp(r.rgb()), sensor.warp_labels(r.segmentation())

    for label in (1, 2, 3):  # robot, red cube, blue cube
        a, b = lab_seg == label, twin_seg == label
        assert a.sum() > 20
        assert (a & b).sum() / (a | b).sum() > 0.97, label
    diff = np.abs(lab_rgb.astype(float) - twin_rgb.astype(float)).mean()
    assert diff > 20, diff  # textures, lights, shadows, tint, sensor

    # The public intrinsics + the hidden pose, through OpenCV's own projection, hit the cubes.
    intr = {"K": np.asarray(sensor.K), "dist": sensor.dist}
    T = np.asarray(cam.T_cam_from_base)
    rvec, _ = cv2.Rodrigues(T[:3, :3])
    for label, name in ((2, "red_cube"), (3, "blue_cube")):
        top = poses[name][0] + [0, 0, 0.025]
        uv, _ = cv2.projectPoints(top[None], rvec, T[:3, 3], intr["K"], intr["dist"])
        u, v = np.round(uv.ravel()).astype(int)
        assert lab_seg[v, u] == label, (name, u, v)


def test_overrides_index_lists_and_reach_the_render():
    """``look.lights.1.castshadow=true`` switches one light of the list; the render shows it
    (a second shadow) and nothing else of the cell changes; a wrong index names the list."""
    cell = load_lab_cell()
    shadowed = load_lab_cell(None, ["look.lights.1.castshadow=true"])
    assert [l.castshadow for l in cell.look.lights] == [True, False, False]
    assert [l.castshadow for l in shadowed.look.lights] == [True, True, False]
    assert shadowed.look.lights[0] == cell.look.lights[0] and shadowed.scene == cell.scene
    images = []
    for c in (cell, shadowed):
        with LabEnv(c, task="push") as env:
            env.reset(seed=2)
            images.append(env.camera.clean().astype(int))
    changed = np.abs(images[0] - images[1]).max(axis=-1) > 8
    assert 0.002 < changed.mean() < 0.2, changed.mean()  # the rim light's shadow, not a new scene
    with pytest.raises(ConfigError, match="'3' is not an index of lights, a list of 3"):
        load_lab_cell(None, ["look.lights.3.castshadow=true"])


# ---------------------------------------------------------------- determinism


def _first_frames(env, seed, n=12):
    obs = env.reset(seed)
    op = ScriptedTeleoperator(env, np.random.default_rng([seed, OPERATOR_STREAM]))
    images, actions = [obs["image"]], []
    for action, _ in zip(op.demonstrate(), range(n)):
        actions.append(action)
        images.append(env.step(action)[0]["image"])
    return np.stack(images), np.stack(actions), {k: env.scene.object_pose(k)[0] for k in env.scene.object_names}


def test_same_seed_same_episode():
    with LabEnv(task="push") as env:
        img_a, act_a, obj_a = _first_frames(env, 7)
        img_b, act_b, obj_b = _first_frames(env, 7)
        img_c, act_c, obj_c = _first_frames(env, 8)
    np.testing.assert_array_equal(act_a, act_b)
    np.testing.assert_array_equal(img_a, img_b)
    assert not np.array_equal(obj_a["red_cube"], obj_c["red_cube"])  # another seed, another layout
    assert not np.array_equal(act_a, act_c)
    assert episode_seed(0, 1) == episode_seed(0, 1) != episode_seed(0, 2) != episode_seed(1, 1)


def test_operator_holds_the_hand_one_way_on_both_sides_of_the_target():
    """Cubes a few cm either side of the line through the target along the home yaw: the pushing hand's
    wrist (joint 7) differs by the small change in push direction, not by half a turn, and stays inside
    the joint's range. Two wrist poses for neighbouring layouts are a two-mode demonstration set."""
    target_x = load_lab_cell().tasks.push.target[0]
    q7 = {}
    with LabEnv(task="push") as env:
        for seed in range(40):
            env.reset(seed)
            side = env.scene.object_pose("red_cube")[0][0] > target_x
            x = env.scene.object_pose("red_cube")[0][0]
            if side in q7 or abs(x - target_x) > 0.03 or abs(x - target_x) < 0.005:
                continue
            op = ScriptedTeleoperator(env, np.random.default_rng([seed, OPERATOR_STREAM]))
            actions = [a for a, _ in zip(op.demonstrate(), range(45))]  # past the move to above the cube
            q7[side] = actions[-1][6]
            if len(q7) == 2:
                break
    assert len(q7) == 2, "no seed put the cube near the target's line on both sides"
    assert abs(q7[True] - q7[False]) < 0.6, q7
    assert all(abs(q) < 2.8 for q in q7.values()), q7  # joint 7: +-2.9 rad


def test_env_errors():
    with LabEnv(task="push") as env:
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(8))
        env.reset(0)
        with pytest.raises(ValueError, match="shape"):
            env.step(np.zeros(7))
    with pytest.raises(ConfigError, match="fps"):
        LabEnv(task="push", fps=20)  # 50 ms is not a whole number of 20 ms control steps


# ---------------------------------------------------------------- recordings


def _recomputed_success(task: str, truth_info: dict, t: dict) -> bool:
    """The task's success written out again from the hidden truth (not via comsim.lab.tasks)."""
    names = [str(n) for n in t["object_names"]]
    pos = dict(zip(names, t["final_object_pos"]))
    if task == "push":
        target, radius = np.array(truth_info["task"]["target"]), truth_info["task"]["target_radius"]
        return bool(np.linalg.norm(pos["red_cube"][:2] - target) <= radius and abs(pos["red_cube"][2] - 0.025) < 0.01)
    red, blue = pos["red_cube"], pos["blue_cube"]
    touching = dict(zip(names, t["final_touching_robot"]))
    return bool(np.linalg.norm(red[:2] - blue[:2]) <= 0.025 and abs(red[2] - blue[2] - 0.05) < 0.01
                and t["final_gripper_width"] >= 0.06 and not touching["red_cube"])


@pytest.mark.parametrize("task", ["push", "stack"])
def test_success_flag_agrees_with_the_final_state(recorded, task):
    root = recorded[task]
    ds, truth = LeRobotDataset(root), load_lab_truth(root)
    ep = ds[0]
    t = truth.trajectory(0)
    assert ep.success == bool(t["success"]) == truth.episodes[0]["success"] == _recomputed_success(task, truth.info, t)
    assert ep.success  # the scripted operator does this seed right
    assert 40 <= len(ep) <= 120  # 4-12 s at 10 fps
    assert ep.frames["front"].shape[1:] == (128, 128, 3)
    assert ep.provenance.source == "lab" and ep.provenance.task == task
    assert ep.provenance.seed == episode_seed(3, 0) and ep.provenance.extra["cell_hash"] == truth.info["cell_hash"]
    np.testing.assert_allclose(ep.state[:, 7], t["gripper_width"], atol=1e-6)
    assert t["object_pos"].shape == (len(ep), 2, 3)


def test_truth_and_intrinsics_sit_outside_meta(recorded):
    root = recorded["push"]
    assert (root / "lab_truth.json").is_file() and (root / "camera_intrinsics.json").is_file()
    assert (root / "lab_truth" / "episode_000000.npz").is_file()
    assert not any("truth" in p.name for p in (root / "meta").rglob("*"))
    for p in (root / "meta").rglob("*.json"):
        assert "T_cam_from_base" not in p.read_text()
    intr = load_camera_intrinsics(root)
    assert intr["camera"] == "front" and (intr["width"], intr["height"]) == (128, 128)
    assert intr["dist_coeffs"][0] < 0 and "T_cam_from_base" not in intr
    truth = load_lab_truth(root)
    assert truth.info["complete"] and len(truth.episodes) == 1
    cell = load_lab_cell()
    np.testing.assert_allclose(truth.T_cam_from_base, cell.scene.camera("front").T_cam_from_base)
    assert truth.object_colors["red_cube"] == cell.scene.objects[0].rgba
    assert truth.info["cell"] == json.loads(json.dumps(cell.to_dict()))
    assert not list(root.rglob(".*tmp*")) and not (root / ".staging").exists()


def test_closed_loop_replay_reproduces_the_recording(recorded):
    ep = LeRobotDataset(recorded["push"])[0]
    t = load_lab_truth(recorded["push"]).trajectory(0)
    with LabEnv(task="push") as env:
        obs = env.reset(ep.provenance.seed)
        states = [obs["state"]]
        for a in ep.action:
            obs, success, done = env.step(a)
            states.append(obs["state"])
        final = env.scene.object_pose("red_cube")[0]
    assert success == ep.success
    np.testing.assert_array_equal(np.stack(states[:-1]), ep.state)
    np.testing.assert_allclose(final, t["final_object_pos"][0], atol=1e-9)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() - t0 < timeout, f"{path} did not appear"
        time.sleep(0.05)


def test_interrupted_recording_leaves_whole_episodes_and_resumes(tmp_path):
    out = tmp_path / "push"
    cmd = [sys.executable, "-m", "comsim.cli", "lab", "record", "--task", "push", "--episodes", "2",
           "--out", str(out), "--seed", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        _wait_for(out / ".staging" / "episode_000000", proc, timeout=120)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # Killed mid-recording: whole staged episodes only, no dataset yet, truth not complete.
    assert not (out / "meta" / "info.json").exists()
    staged = [p for p in (out / ".staging").iterdir() if not p.name.startswith(".")]
    assert [p.name for p in staged] == ["episode_000000"]
    assert {"meta.json", "data.parquet", "observation.images.front.mp4"} <= {f.name for f in staged[0].iterdir()}
    assert not json.loads((out / "lab_truth.json").read_text())["complete"]

    with pytest.raises(ValueError, match="seed"):
        record_dataset("push", episodes=2, out=out, seed=6)  # resuming another recording is refused
    record_dataset("push", episodes=2, out=out, seed=5)
    ds = LeRobotDataset(out)
    assert len(ds) == 2 and not (out / ".staging").exists()
    assert [ds[i].provenance.seed for i in range(2)] == [episode_seed(5, 0), episode_seed(5, 1)]
    truth = load_lab_truth(out)
    assert truth.info["complete"] and [e["episode_index"] for e in truth.episodes] == [0, 1]
    assert [e["success"] for e in truth.episodes] == [ds[i].success for i in range(2)]
    assert record_dataset("push", episodes=2, out=out, seed=5) == out  # finished: nothing to do


# ---------------------------------------------------------------- slow: ten episodes through the CLI


@pytest.mark.slow
@pytest.mark.parametrize("task", ["push", "stack"])
def test_cli_records_ten_episodes_with_honest_success_flags(tmp_path, task):
    out = tmp_path / task
    assert cli_main(["lab", "record", "--task", task, "--episodes", "10", "--out", str(out)]) == 0
    ds, truth = LeRobotDataset(out), load_lab_truth(out)
    assert len(ds) == 10 and len(truth.episodes) == 10
    flags = []
    for i in range(10):
        t = truth.trajectory(i)
        flags.append(ds[i].success)
        assert ds[i].success == _recomputed_success(task, truth.info, t)
    assert sum(flags) >= 8, flags
