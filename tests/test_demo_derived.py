"""Demo-derived generation (`comsim generate --from-demos`): lab demonstrations replayed in the twin,
their segments moved onto new layouts, executed in the twin's physics, kept only when they succeed.

The fixture records two lab push demonstrations and replays them in the twin (physics). It gives
the replay the lab's own camera (``true_calibration``), so that the test is about generation, not
about calibrating a camera from 2 episodes; the generator itself reads only the paired dataset.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from comsim.episode import Episode, Provenance, episode_seed
from comsim.errors import ComSimError
from comsim.factory.demo_derived import (DemoDerivedError, check_demos, generate_from_demos, plan_actions,
                                         plan_attempt, run_actions)
from comsim.factory.expert import robot_only_scene
from comsim.factory.layout import sample_setup
from comsim.factory.program import ProgramError
from comsim.io.lerobot import DatasetWriter, LeRobotDataset

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "configs" / "tasks"
ENV = {**os.environ, "MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1"}


def record_and_replay(root: Path, task: str, episodes: int = 2, seed: int = 3) -> Path:
    """Lab demonstrations of ``task`` and their physics replay in the twin: a paired dataset."""
    from comsim.config import PANDA_CELL, PANDA_PUSH_CELL
    from comsim.lab.record import record_dataset
    from comsim.lab.pairs import true_calibration
    from comsim.twin.replay import replay_dataset

    lab = record_dataset(task, episodes=episodes, out=root / f"lab_{task}", seed=seed, calibration_stills=0)
    return replay_dataset(lab, PANDA_PUSH_CELL if task == "push" else PANDA_CELL, root / f"paired_{task}",
                          mode="physics", calibration=true_calibration(lab), channels=(), report=False,
                          refine=False, log=lambda *a: None)


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    return record_and_replay(tmp_path_factory.mktemp("demos"), "push")


@pytest.fixture(scope="module")
def generated(paired, tmp_path_factory):
    """Two episodes made by two worker processes, with the factory's control videos."""
    out = tmp_path_factory.mktemp("gen") / "two_workers"
    report = generate_from_demos(paired, 2, out, workers=2, seed=5, controls=("seg", "normal"), progress=False)
    return out, report


def edited_task(tmp_path: Path, *edits: tuple[str, str], base: str = "lab_push") -> Path:
    text = (TASKS / f"{base}.yaml").read_text().replace("../twin/", str(ROOT / "configs" / "twin") + "/")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{base}_edited.yaml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------ the transform


def test_a_demo_moved_to_a_new_cube_pose_pushes_it_onto_the_goal(paired, tmp_path):
    """The cube of a demonstration moved by (+4 cm, -2 cm) and turned by 0.3 rad: the planned hand
    keeps its pose relative to the cube (the push direction turned onto the new one), and in the
    twin's physics the cube ends on the goal. The demo's own layout gives its own hand poses back."""
    program, sources = check_demos(paired, "lab_push", "id", tmp_path)
    robot = robot_only_scene(program)
    demo = sources.usable[0]
    seg = demo.segments[0]
    src = demo.pos["cube"][seg.start]  # where the demonstration's cube was: known from the twin's replay
    setup = sample_setup(program, 0, "id")
    setup.distractors = []  # nothing else on the table: this test is about the cube and the goal
    goal = setup.targets["goal"]
    np.testing.assert_allclose(demo.goals["goal"], goal)  # the twin's target sticker is the task's goal

    # the demonstration's own layout: its own hand poses, the same joints, success
    setup.poses = {"cube": (src[0], src[1], float(demo.yaw["cube"][seg.start]))}
    plan = plan_attempt(demo, setup)
    np.testing.assert_allclose(plan.pos, demo.tcp_pos, atol=1e-9)
    np.testing.assert_allclose(plan.rot, demo.tcp_rot, atol=1e-9)
    assert np.abs(plan_actions(plan, robot, demo.action[0, :7]) - demo.action).max() < 0.02

    # a new pose
    new = (src[0] + 0.04, src[1] - 0.02, float(demo.yaw["cube"][seg.start]) + 0.3)
    setup.poses = {"cube": new}
    plan = plan_attempt(demo, setup)
    d_src, d_new = goal - src[:2], goal - np.asarray(new[:2])
    turn = np.arctan2(d_new[1], d_new[0]) - np.arctan2(d_src[1], d_src[0])
    c, s = np.cos(turn), np.sin(turn)
    for t, tol in ((seg.start, 1e-9), (seg.anchor[0], 1e-3)):  # the approach; the first touch (the stroke
        # stretches with the cube's progress, which has barely begun)
        expected = np.array([[c, -s], [s, c]]) @ (demo.tcp_pos[t, :2] - src[:2]) + new[:2]
        np.testing.assert_allclose(plan.pos[t, :2], expected, atol=tol)
    np.testing.assert_allclose(plan.pos[:, 2], demo.tcp_pos[:, 2])  # heights are the demonstrator's
    cube = plan.transforms["cube"]
    assert cube["dx"] == pytest.approx(0.04, abs=1e-5) and cube["dy"] == pytest.approx(-0.02, abs=1e-5)
    assert cube["dyaw"] == pytest.approx(turn, abs=1e-5)
    actions = plan_actions(plan, robot, demo.action[0, :7])
    rec = run_actions(program, setup, actions, render=False)
    ok, verdicts = rec.judge()
    final = rec.scene.object_pose("cube")[0]
    assert ok, (verdicts, final, goal)
    assert np.linalg.norm(final[:2] - goal) <= program.targets["goal"].radius
    assert np.linalg.norm(final[:2] - new[:2]) > 0.1  # it was pushed there, not found there


# ------------------------------------------------------------------ generation


def test_failed_attempts_are_counted_and_never_written(paired, tmp_path):
    """Goals drawn along a 20 cm line, success judged at its middle (the twin's target sticker,
    where the demonstrations pushed): most attempts fail by construction. Each kept episode
    succeeded; every failure is counted (report and provenance); an episode with no successful
    attempt stops the run and writes nothing."""
    judged_at_the_sticker = ("- at: {object: cube, target: goal}", "- at: {object: cube, target: [0.5, 0.12]}")
    goal_line = "goal: {x: [0.50, 0.50], y: [0.12, 0.12]}"
    task = edited_task(tmp_path, (goal_line, "goal: {x: [0.40, 0.60], y: [0.12, 0.12]}"), judged_at_the_sticker)
    out = tmp_path / "some_fail"
    report = generate_from_demos(paired, 2, out, task=task, seed=1, max_attempts=30, progress=False)
    ds = LeRobotDataset(out)
    assert len(ds) == 2 and report["successes"] == 2
    assert report["failures"] == report["attempts"] - 2 > 0 and report["failures_by_reason"] == {
        "predicate": report["failures"]}
    discarded = []
    for i in range(2):
        info = ds.episode_info(i)
        extra = info["provenance"].extra
        assert info["success"] is True and extra["checks"] and all(extra["checks"].values())
        assert extra["attempt"] == len(extra["discarded_attempts"])
        discarded += extra["discarded_attempts"]
    assert len(discarded) == report["failures"] and all(d["failure"] == "predicate" for d in discarded)
    assert sum(v["attempts"] for v in report["per_source"].values()) == report["attempts"]

    # the demonstrations (pushed onto the sticker) pass the check; no goal drawn 12+ cm from it can
    never = edited_task(tmp_path, (goal_line, "goal: {x: [0.62, 0.66], y: [0.12, 0.12]}"), judged_at_the_sticker)
    out = tmp_path / "never"
    with pytest.raises(DemoDerivedError, match=r"episode 0: none of 2 attempts succeeded \(failures: \{'predicate': 2"):
        generate_from_demos(paired, 1, out, task=never, max_attempts=2, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["generation.json", "task.yaml"]  # no episode, staged or not


def test_provenance_names_the_source_demo_and_the_transform(paired, generated):
    out, report = generated
    ds = LeRobotDataset(out)
    assert report["episodes"] == 2 and report["successes"] == 2 and report["workers"] == 2
    assert ds.camera_keys == ["front_sim", "front_sim_normal", "front_sim_seg"]  # the factory's keys
    assert set(ds.features) >= {"action", "observation.state", "observation.environment_state"}
    twin_hash = json.loads((paired / "twin_alignment.json").read_text())["spec_hash"]
    for i in range(2):
        info = ds.episode_info(i)
        prov, extra = info["provenance"], info["provenance"].extra
        assert prov.source == "sim" and prov.task == "lab_push" and prov.twin_spec_hash == twin_hash
        assert prov.seed == episode_seed(5, i, extra["attempt"]) and extra["setup"]["split"] == "id"
        assert extra["generator"] == "demo_derived" and extra["episode_index"] == i
        src = extra["source_demo"]
        assert src["dataset"] == str(paired) and src["episode"] in (0, 1)
        assert src["replays"] == {"dataset": str(paired.parent / "lab_push"), "episode": src["episode"]}
        assert set(extra["transform"]) == {"cube", "goal"}
        assert set(extra["transform"]["cube"]) == {"dx", "dy", "dyaw", "about"}
        assert extra["segments"][0]["subtask"] == "push cube to goal"
        # the cube's start in the episode is the demonstration's, moved by the transform
        demo_cube = LeRobotDataset(paired).read_columns(src["episode"], ["twin_object_pos"])["twin_object_pos"]
        env = ds.read_columns(i, ["observation.environment_state"])["observation.environment_state"]
        t = extra["transform"]["cube"]
        assert np.linalg.norm(env[0, :2] - (np.asarray(t["about"]) + [t["dx"], t["dy"]])) < 0.005
        assert np.linalg.norm(np.asarray(t["about"]) - demo_cube[0, :2]) < 0.005


def test_same_seed_same_bytes_with_one_worker_and_after_an_interruption(paired, generated, tmp_path):
    """One worker, interrupted after staging episode 1, then resumed: the files of two workers."""
    from comsim.factory import demo_derived

    out2, _ = generated
    out1 = tmp_path / "one"
    generate_from_demos(paired, 1, out1, seed=5, controls=("seg", "normal"), progress=False)
    with pytest.raises(ValueError, match="holds a finished dataset of 1 episodes"):
        generate_from_demos(paired, 2, out1, seed=5, controls=("seg", "normal"), progress=False)
    manifest = (out1 / "generation.json").read_text()  # written first: it makes the folder this run's
    shutil.rmtree(out1)
    out1.mkdir()
    (out1 / "generation.json").write_text(manifest)
    program, sources = check_demos(paired, "lab_push", "id", tmp_path)
    shutil.copyfile(program.path, out1 / "task.yaml")
    demo_derived._init_worker(str(out1 / "task.yaml"), sources)
    demo_derived._work((str(out1), 1, 5, "id", 50, ("seg", "normal")))  # stage episode 1 only
    again = generate_from_demos(paired, 2, out1, seed=5, controls=("seg", "normal"), progress=False)
    assert again["generated_now"] == 1 and again["successes"] == 2
    files = sorted(p.relative_to(out2) for p in out2.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out1) for p in out1.rglob("*") if p.is_file())
    differ = [f for f in files if (out1 / f).read_bytes() != (out2 / f).read_bytes()]
    assert differ == [Path("generation_report.json")]  # only the timing and the worker count
    with pytest.raises(ValueError, match="was generated with"):
        generate_from_demos(paired, 2, out1, seed=6, controls=("seg", "normal"), progress=False)


# ------------------------------------------------------------------ bad input, before anything is written


def _copy_paired(paired: Path, dst: Path) -> Path:
    shutil.copytree(paired, dst)
    return dst


def test_bad_inputs_are_named_before_anything_is_written(paired, tmp_path):
    out = tmp_path / "out"
    no_twin = _copy_paired(paired, tmp_path / "no_twin")
    (no_twin / "twin_aligned.yaml").unlink()
    with pytest.raises(ComSimError, match=r"no_twin/twin_aligned.yaml: expected the aligned twin"):
        generate_from_demos(no_twin, 1, out, progress=False)

    stale = _copy_paired(paired, tmp_path / "stale")
    al = json.loads((stale / "twin_alignment.json").read_text())
    (stale / "twin_alignment.json").write_text(json.dumps({**al, "spec_hash": "0123456789abcdef"}))
    with pytest.raises(ComSimError, match=r"twin_alignment.json: spec_hash: expected \w+ \(the hash of"):
        generate_from_demos(stale, 1, out, progress=False)

    with pytest.raises(ProgramError, match="no such file, and not a built-in task"):
        generate_from_demos(paired, 1, out, task="lab_pusher", progress=False)
    # the generic push's cube is red, orange or blue: not one of the twin's objects
    with pytest.raises(ProgramError, match=r"push.yaml:\d+: objects.cube: which object of the twin .*'red_cube'"):
        generate_from_demos(paired, 1, out, task="push", progress=False)

    # episodes whose object poses were never recorded (no twin_object_pos, nothing in the provenance)
    bare = tmp_path / "bare"
    src = LeRobotDataset(paired).read_episode(0)
    prov = Provenance(source="lab", task="push", twin_spec_hash=src.provenance.twin_spec_hash)
    with DatasetWriter(bare, 10) as w:
        w.add_episode(Episode(frames={"front": src.frames["front"]}, action=src.action, state=src.state, fps=10,
                              provenance=prov))
    for f in ("twin_aligned.yaml", "twin_alignment.json"):
        shutil.copyfile(paired / f, bare / f)
    with pytest.raises(ComSimError, match=r"bare: episode 0: twin_object_pos: expected where the twin found the objects"):
        generate_from_demos(bare, 1, out, progress=False)
    assert not out.exists()

    r = subprocess.run([sys.executable, "-m", "comsim.cli", "generate", "--from-demos", str(tmp_path / "nothing"),
                        "--out", str(out)], capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "nothing/meta/info.json: file not found" in r.stderr and not out.exists()


# ------------------------------------------------------------------ long


@pytest.mark.slow
def test_kill_9_then_rerun_gives_the_same_bytes(paired, generated, tmp_path):
    out2, _ = generated
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "comsim.cli", "generate", "--from-demos", str(paired), "--episodes", "2",
           "--seed", "5", "--controls", "seg", "normal", "--workers", "2", "--out", str(out), "--no-progress"]
    p = subprocess.Popen(cmd, env=ENV, cwd=ROOT, start_new_session=True)
    try:
        for _ in range(600):
            if list(out.glob(".staging/episode_*")):
                break
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert not (out / "meta" / "info.json").exists()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    files = sorted(p.relative_to(out2) for p in out2.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert [f for f in files if (out / f).read_bytes() != (out2 / f).read_bytes()] == [Path("generation_report.json")]


@pytest.mark.slow
@pytest.mark.parametrize("split", ["id", "ood"])
def test_stack_from_demos(split, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"stack_{split}")
    stack = record_and_replay(root, "stack")
    report = generate_from_demos(stack, 2, root / "gen", split=split, seed=2, progress=False)
    ds = LeRobotDataset(root / "gen")
    assert report["task"] == "lab_stack" and len(ds) == 2 and report["successes"] == 2
    extra = ds.episode_info(0)["provenance"].extra
    assert [s["subtask"] for s in extra["segments"]] == ["grasp top", "place top on base"]
    assert set(extra["transform"]) == {"top", "base"} and extra["setup"]["split"] == split
