"""Data factory: task programs, their errors, layouts, the scripted expert, generation.

Fast tests run a handful of real episodes; ``-m slow`` measures each task's success rate.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from comsim.episode import episode_seed
from comsim.factory.expert import prepare_setup, robot_only_scene, run_episode, vet_setup
from comsim.factory.generate import generate_dataset
from comsim.factory.layout import ood_fraction, sample_setup
from comsim.factory.program import ProgramError, load_program
from comsim.io.lerobot import LeRobotDataset
from comsim.sim.camera import project_points

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "configs" / "tasks"
ENV = {**os.environ, "MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1"}

# A short task for the pipeline tests: reach above a cube (about 2 s of video).
REACH = """\
task: reach
instruction: "Reach above the {{cube.color}} cube."
scene: {scene}
max_seconds: 6
speed: 0.3
objects:
  cube: {{shape: cube, side: [0.04, 0.05], colors: [red, blue]}}
distractors: {{count: [0, 1], size: [0.03, 0.04], colors: [grey], region: {{x: [0.3, 0.65], y: [-0.3, 0.3]}}}}
layout:
  in_distribution: {{cube: {{x: [0.45, 0.55], y: [-0.1, 0.1]}}}}
  out_of_distribution: {{cube: {{x: [0.35, 0.65], y: [-0.25, 0.25]}}}}
program:
  - move: {{to: cube, height: {height}}}
success:
  - at: {{object: cube, target: {target}, radius: 0.2}}
"""


def reach_task(tmp_path, name="reach.yaml", height=0.15, target="[0.5, 0.0]") -> Path:
    p = tmp_path / name
    p.write_text(REACH.format(scene=ROOT / "configs" / "twin" / "panda_cell.yaml", height=height, target=target))
    return p


# ------------------------------------------------------------------ task files


def test_builtin_tasks_load_with_both_splits():
    names = sorted(p.stem for p in TASKS.glob("*.yaml"))
    assert {"stack", "push", "pick_place", "tower"} <= set(names)
    for name in names:
        prog = load_program(name)
        assert prog.name == name and set(prog.layout) == {"id", "ood"} and prog.steps and prog.success
        assert load_program(TASKS / f"{name}.yaml").hash == prog.hash


def _edited(tmp_path, old: str, new: str, base: str = "stack") -> tuple[Path, int]:
    """A copy of a built-in task with one line replaced; returns (path, that line's number)."""
    text = (TASKS / f"{base}.yaml").read_text()
    assert old in text, old
    line = text[:text.index(old)].count("\n") + 1
    path = tmp_path / f"{base}.yaml"
    path.write_text(text.replace(old, new, 1).replace("../twin/", str(ROOT / "configs" / "twin") + "/"))
    return path, line


@pytest.mark.parametrize("old, new, expected", [  # the error is on the edited line unless said otherwise
    ("- grasp: {object: top}", "- grab: {object: top}", "primitive 'grab' unknown; known: ['grasp', 'home', 'lift'"),
    ("- stack: {on: base}", "- stack: {on: bsae}", "stack.on: object 'bsae' unknown; known: ['base', 'top']"),
    ("- lift: {height: [0.10, 0.14]}", "- lift: {height: [0.10, 0.9]}",
     "lift.height: [0.1, 0.9] is out of range; allowed [0.02, 0.3]"),
    ("- lift: {height: [0.10, 0.14]}", "- lift: {hieght: 0.1}", "lift: unknown parameter 'hieght'"),
    ("- release: {retreat: 0.10}", "- move: {to: [1.2, 0.0, 0.1]}",
     "move.to: [1.2, 0.0, 0.1] is outside the workspace"),
    ("- grasp: {object: top}", "- wait: {seconds: 1}", "+2 stack: nothing is held here; add a grasp before it"),
    ("colors: [red, orange, yellow]", "colors: [red, ornage]", "objects.top.colors[1]: colour 'ornage' unknown"),
    ("colors: [red, orange, yellow]", "colors: ['scene:green_cube']",
     "colour 'scene:green_cube': the scene"),
    ("top:  {x: [0.42, 0.58], y: [-0.20, -0.05]}", "top:  {x: [0.42, 0.58], y: [-0.20, -0.05], z: 1}",
     "layout.in_distribution.top: unknown key 'z'"),
    ("base: {x: [0.42, 0.58], y: [0.05, 0.20]}", "base: {x: [0.42, 0.95], y: [0.05, 0.20]}",
     "leaves the workspace"),
    ("- stacked: {top: top, base: base}", "- stacked_on: {top: top, base: base}", "predicate 'stacked_on' unknown"),
    ("- stacked: {top: top, base: base}", "- stacked: {top: top, base: base, tolerance: [0.01, 0.02]}",
     "stacked.tolerance: a success condition takes a number, not a range"),
    ("base: {shape: cube, side: [0.050, 0.060]", "base: 5\n  unused: {shape: cube, side: [0.050, 0.060]",
     "objects.base: expected a mapping, got 5"),
    ("shapes: [cube, cylinder]", "shapes: [cube, cone]", "distractors.shapes[1]: 'cone' unknown"),
])
def test_bad_task_names_the_line(tmp_path, old, new, expected):
    path, line = _edited(tmp_path, old, new)
    if expected.startswith("+"):  # the error belongs to a later line
        offset, expected = expected[1:].split(" ", 1)
        line += int(offset)
    with pytest.raises(ProgramError) as e:
        load_program(path)
    assert str(e.value).startswith(f"{path}:{line}: "), str(e.value)
    assert expected in str(e.value)


def test_the_lab_push_program_takes_its_colours_from_the_scene(tmp_path):
    """configs/tasks/lab_push.yaml: the lab's push as a factory program. Its cube and blue cube take
    the scene's own colours (in an aligned twin: the colours the twin estimated for the real ones),
    its goal disc the look of the scene's push_target marker and replaces it (one disc, not two),
    the target stays at the lab's (0.50, 0.12), and OOD starts leave the lab's cube region."""
    import dataclasses

    import mujoco
    import yaml

    from comsim.sim.spec import load_scene_spec
    from comsim.factory.program import task_in_scene
    cell = dataclasses.asdict(load_scene_spec(ROOT / "configs" / "twin" / "panda_cell_push.yaml"))
    cell["objects"][0]["rgba"] = [0.9, 0.3, 0.2, 1.0]  # an aligned red
    cell["markers"][0]["rgba"] = [0.2, 0.7, 0.3, 1.0]
    scene = tmp_path / "aligned.yaml"
    scene.write_text(yaml.safe_dump(cell))
    prog = load_program(task_in_scene(TASKS / "lab_push.yaml", scene, tmp_path / "task.yaml"))
    spec = load_scene_spec(scene)
    for seed in range(4):
        for split in ("id", "ood"):
            setup = sample_setup(prog, seed, split)
            objs = {o.name: o for o in setup.scene_spec(prog).objects}
            assert list(objs) == ["cube", "distractor_0"]  # labels 2 and 3, as the lab's red and blue cubes
            assert objs["cube"].rgba == [0.9, 0.3, 0.2, 1.0] and objs["distractor_0"].rgba == spec.objects[1].rgba
            np.testing.assert_allclose(setup.targets["goal"], [0.50, 0.12])
            x, y = setup.poses["cube"][:2]
            in_id = 0.42 <= x <= 0.60 and -0.12 <= y <= -0.03
            assert in_id == (split == "id"), (seed, split, x, y)
    m = setup.build_scene(prog).model
    discs = [m.geom(i) for i in range(m.ngeom) if m.geom(i).name.startswith("marker/")]
    assert [d.name for d in discs] == ["marker/goal"]
    np.testing.assert_allclose(discs[0].rgba, [0.2, 0.7, 0.3, 1.0], atol=1e-6)
    assert discs[0].type == mujoco.mjtGeom.mjGEOM_CYLINDER and discs[0].contype == 0


def test_unreachable_target_is_a_task_error_naming_the_line(tmp_path):
    # Inside the workspace box but beyond the arm: every layout fails IK, so it is the task's fault.
    path, line = _edited(tmp_path, "- release: {retreat: 0.10}",
                         "- release: {retreat: 0.10}\n  - move: {to: [0.79, 0.44, 0.02]}")
    prog = load_program(path)  # statically fine
    with pytest.raises(ProgramError, match=rf"^{re.escape(str(path))}:{line + 1}: move: 20 layouts in a row .* out of "
                                           "the arm's reach"):
        prepare_setup(prog, 0, "id", robot_only_scene(prog))
    # and the CLI says the same before writing anything
    r = subprocess.run([sys.executable, "-m", "comsim.cli", "generate", "--task", str(path), "--episodes", "1",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert r.returncode == 2 and f"{path}:{line + 1}: move:" in r.stderr
    assert not (tmp_path / "out").exists()


def test_yaml_booleans_are_only_true_false(tmp_path):
    # `on:` is a key here, not YAML 1.1's boolean
    prog = load_program("stack")
    step = next(s for s in prog.steps if s.primitive == "stack")
    assert step.params["on"].name == "base" and step.params["align"] is True


# ------------------------------------------------------------------ layouts


def test_layouts_are_seeded_and_split_into_id_and_ood():
    prog = load_program("pick_place")
    a, b = sample_setup(prog, 7, "id"), sample_setup(prog, 7, "id")
    assert a.describe() == b.describe()
    assert sample_setup(prog, 8, "id").describe() != a.describe()
    id_regions = prog.layout["id"]
    colours, sizes, n_distractors = set(), [], set()
    for s in range(60):
        ind, ood = sample_setup(prog, s, "id"), sample_setup(prog, s, "ood")
        assert ood_fraction(ind, prog) == 0.0 and ood_fraction(ood, prog) == 1.0
        for setup in (ind, ood):
            pts = [np.array(p[:2]) for p in setup.poses.values()] + list(setup.targets.values())
            gaps = [np.linalg.norm(p - q) for i, p in enumerate(pts) for q in pts[i + 1:]]
            assert min(gaps, default=1) >= 0.06 - 1e-9  # task things keep 0.12, distractors at least 0.06
        cube = ind.roles["cube"]
        colours.add(cube.color)
        sizes.append(cube.size[0])
        n_distractors.add(len(ind.distractors))
        assert id_regions["cube"].contains(*ind.poses["cube"][:2])
        assert 0.04 <= cube.size[0] <= 0.055
    assert len(colours) >= 3 and np.ptp(sizes) > 0.01 and len(n_distractors) >= 3


def test_episode_seeds_do_not_collide():
    seeds = {episode_seed(0, k, a) for k in range(500) for a in range(3)}
    assert len(seeds) == 1500 and episode_seed(1, 0) != episode_seed(0, 0)


def test_vetting_rejects_unreachable_layouts_of_one_seed(tmp_path):
    # A region half out of reach: unlucky layouts are redrawn (counted), the task stays valid.
    path = reach_task(tmp_path)
    path.write_text(path.read_text().replace("{cube: {x: [0.45, 0.55], y: [-0.1, 0.1]}}",
                                             "{cube: {x: [0.55, 0.8], y: [0.3, 0.4]}}"))
    prog = load_program(path)
    robot = robot_only_scene(prog)
    verdicts = [vet_setup(prog, _homed(sample_setup(prog, s, "id"), robot), robot) for s in range(12)]
    assert any(v is None for v in verdicts) and any(v is not None for v in verdicts)
    bad = next(v for v in verdicts if v is not None)
    assert bad.line == prog.steps[0].param_lines["to"]
    redraws = [prepare_setup(prog, s, "id", robot)[1] for s in range(12)]
    assert max(redraws) > 0


def _homed(setup, robot):
    from comsim.factory.layout import home_pose

    setup.home_tcp, setup.home_yaw = home_pose(robot)
    return setup


# ------------------------------------------------------------------ the expert and the frames


def _mask(seg_rgb: np.ndarray, label: int) -> np.ndarray:
    from comsim.io.labels import rgb_to_seg

    return rgb_to_seg(seg_rgb) == label


def _centroid(mask):
    v, u = np.nonzero(mask)
    return np.array([u.mean(), v.mean()]), v.min(), v.max()


def _stacked_in_frame(seg, top_label, base_label) -> bool:
    """The top object's pixels sit right on the base object's pixels, horizontally centred."""
    top, base = _mask(seg, top_label), _mask(seg, base_label)
    if top.sum() < 5 or base.sum() < 5:
        return False
    (ct, _, t_max), (cb, b_min, _) = _centroid(top), _centroid(base)
    cols = np.nonzero(base.any(0))[0]
    return bool(ct[1] < cb[1] and t_max >= b_min - 2 and t_max <= b_min + 4
                and cols.min() - 2 <= ct[0] <= cols.max() + 2)


def _on_target_in_frame(seg, label, target_xy, radius, cam) -> bool:
    """The object's pixels are centred on the projected target disc."""
    m = _mask(seg, label)
    if m.sum() < 5:
        return False
    c, _, v_max = _centroid(m)
    centre = project_points(cam.K, cam.T_cam_from_base, [[*target_xy, 0.0]])[0]
    edge = project_points(cam.K, cam.T_cam_from_base, [[target_xy[0], target_xy[1] + radius, 0.0]])[0]
    r_px = np.linalg.norm(edge - centre)
    return bool(abs(c[0] - centre[0]) <= r_px + 1 and v_max <= centre[1] + r_px + 2)


def _judge_frames(task: str, prog, setup, seg) -> bool:
    cam = prog.scene.camera(prog.camera)
    if task == "stack":
        return _stacked_in_frame(seg, 2, 3)
    if task == "tower":
        return _stacked_in_frame(seg, 3, 2) and _stacked_in_frame(seg, 4, 3)
    return _on_target_in_frame(seg, 2, setup.targets["goal"], setup.target_radius["goal"], cam)


@pytest.mark.parametrize("task, seed", [("stack", 1), ("push", 3), ("pick_place", 2), ("tower", 0)])
def test_expert_succeeds_and_the_frames_agree(task, seed):
    prog = load_program(task)
    setup, _ = prepare_setup(prog, episode_seed(0, seed), "id", robot_only_scene(prog))
    r = run_episode(prog, setup, controls=("seg", "normal"))
    ep = r.episode
    assert r.success and ep.success and r.failure is None, r.detail
    assert set(ep.frames) == {"front_sim", "front_sim_seg", "front_sim_normal"}
    assert ep.frames["front_sim"].shape[1:] == (128, 128, 3) == ep.frames["front_sim_normal"].shape[1:]
    normals = ep.frames["front_sim_normal"].astype(np.float32) / 127.5 - 1.0
    up_in_cam = np.asarray(prog.scene.camera(prog.camera).T_cam_from_base)[:3, :3] @ [0.0, 0.0, 1.0]
    table = (ep.frames["front_sim_seg"][0] == 0).all(-1)[70:100, 40:90]  # mid table: black in the label video
    assert np.median(normals[0, 70:100, 40:90][table] @ up_in_cam) > 0.99  # the table top faces up
    assert ep.action.shape == (len(ep), 8) and ep.state.shape == (len(ep), 8) and ep.fps == 10
    assert ep.provenance.source == "sim" and ep.provenance.seed == setup.seed and ep.provenance.twin_spec_hash
    assert _judge_frames(task, prog, setup, ep.frames["front_sim_seg"][-1])
    assert not _judge_frames(task, prog, setup, ep.frames["front_sim_seg"][0])  # not done at the start


def test_a_failed_attempt_is_flagged_with_its_reason_and_the_frames_agree(tmp_path):
    path, _ = _edited(tmp_path, "- place: {at: goal}", "- place: {at: [0.40, -0.26]}", base="pick_place")
    prog = load_program(path)
    setup, _ = prepare_setup(prog, episode_seed(0, 2), "id", robot_only_scene(prog))
    r = run_episode(prog, setup, controls=("seg",))
    assert not r.success and r.failure == "predicate" and "at@" in r.detail
    assert r.episode.provenance.extra["failure"] == "predicate"
    assert not _judge_frames("pick_place", prog, setup, r.episode.frames["front_sim_seg"][-1])
    assert _on_target_in_frame(r.episode.frames["front_sim_seg"][-1], 2, [0.40, -0.26], 0.045,
                               prog.scene.camera(prog.camera))  # it is where it was put


def test_same_seed_same_episode(tmp_path):
    prog = load_program(reach_task(tmp_path))
    robot = robot_only_scene(prog)
    a = run_episode(prog, prepare_setup(prog, 5, "id", robot)[0]).episode
    b = run_episode(prog, prepare_setup(prog, 5, "id", robot)[0]).episode
    assert np.array_equal(a.frames["front_sim"], b.frames["front_sim"]) and np.array_equal(a.action, b.action)
    assert a.provenance.to_dict() == b.provenance.to_dict()


# ------------------------------------------------------------------ generation


def test_generate_cli_parallel_resumable_and_independent_of_workers(tmp_path):
    task = reach_task(tmp_path)
    out2 = tmp_path / "two"
    cmd = [sys.executable, "-m", "comsim.cli", "generate", "--task", str(task), "--episodes", "3", "--seed", "4"]
    r = subprocess.run(cmd + ["--workers", "2", "--out", str(out2)], capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "generate reach" in r.stderr  # the progress bar
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 3 and report["attempts"] == 3 and report["successes"] == 3
    assert json.loads((out2 / "generation_report.json").read_text())["successes"] == 3
    ds = LeRobotDataset(out2)
    assert ds.camera_keys == ["front_sim"] and ds.features["action"]["shape"] == [8]
    assert ds.features["observation.state"]["shape"] == [8] and ds.fps == 10
    for i in range(3):
        info = ds.episode_info(i)
        assert info["success"] is True and info["provenance"].source == "sim"
        assert info["provenance"].seed == episode_seed(4, i) and info["tasks"][0].startswith("Reach above the")

    # one worker, in two goes (as if interrupted after the first episode), gives the same files
    out1 = tmp_path / "one"
    generate_dataset(task, 1, out1, seed=4, progress=False)  # a finished 1-episode dataset...
    with pytest.raises(ValueError, match="holds a finished dataset of 1 episodes"):
        generate_dataset(task, 3, out1, seed=4, progress=False)
    import shutil

    manifest = (out1 / "generation.json").read_text()  # written first: it makes the folder this run's
    shutil.rmtree(out1)
    out1.mkdir()
    (out1 / "generation.json").write_text(manifest)
    from comsim.factory.generate import _work

    _work((str(task.resolve()), str(out1), 10, 1, 4, "id", False, 1, ()))  # stage episode 1 only
    again = generate_dataset(task, 3, out1, seed=4, progress=False)
    assert again["generated_now"] == 2 and again["successes"] == 3
    for f in sorted(out2.glob("data/**/*.parquet")) + sorted(out2.glob("meta/episodes/**/*.parquet")):
        assert f.read_bytes() == (out1 / f.relative_to(out2)).read_bytes(), f
    with pytest.raises(ValueError, match="was generated with"):
        generate_dataset(task, 3, out1, seed=5, progress=False)


def test_failures_are_counted_not_dropped(tmp_path):
    task = reach_task(tmp_path, target="[0.2, 0.35]")  # the predicate can never hold
    kept = generate_dataset(task, 2, tmp_path / "kept", progress=False)
    assert kept["attempts"] == 2 and kept["successes"] == 0 and kept["failures_by_reason"] == {"predicate": 2}
    assert kept["failed_episodes_kept"] == 2
    ds = LeRobotDataset(tmp_path / "kept")
    assert [ds.episode_info(i)["success"] for i in range(2)] == [False, False]
    assert ds.episode_info(0)["provenance"].extra["failure"] == "predicate"

    retried = generate_dataset(task, 2, tmp_path / "retried", only_success=True, max_attempts=3, progress=False)
    assert retried["attempts"] == 6 and retried["failures"] == 6 and retried["gave_up"] == 2
    assert retried["failures_by_reason"] == {"predicate": 6}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["stack", "push", "pick_place", "tower"])
def test_expert_succeeds_on_90_percent_of_in_distribution_seeds(task, tmp_path):
    report = generate_dataset(task, 20, tmp_path / task, workers=2, seed=1000, progress=False)
    assert report["attempts"] == 20 and report["success_rate"] >= 0.9, report


def test_generate_in_another_scene_keeps_the_program_and_changes_the_look(tmp_path):
    # The pseudo-real pipeline generates in the ALIGNED twin (calibrated camera and colours).
    import yaml

    from comsim.sim.spec import load_scene_spec, spec_hash
    cell = yaml.safe_load((ROOT / "configs" / "twin" / "panda_cell.yaml").read_text())
    cell["table"]["rgba"] = [0.1, 0.2, 0.9, 1.0]  # a blue table
    cell["robot"]["tint"] = [1.0, 0.7, 0.4]  # and the aligned twin's robot tint (a cream arm)
    scene = tmp_path / "aligned.yaml"
    scene.write_text(yaml.safe_dump(cell))
    task = reach_task(tmp_path)
    plain = generate_dataset(task, 1, tmp_path / "plain", seed=3, progress=False, controls=("seg",))
    moved = generate_dataset(task, 1, tmp_path / "moved", seed=3, scene=scene, progress=False, controls=("seg",))
    assert plain["successes"] == moved["successes"] == 1

    copy = (tmp_path / "moved" / "task.yaml").read_text().splitlines()
    original = task.read_text().splitlines()
    scene_line = [i for i, t in enumerate(original) if t.startswith("scene:")][0]
    assert copy[scene_line].startswith(f"scene: {scene.resolve()}")  # same line: errors still name the task's lines
    header = json.loads((tmp_path / "moved" / "generation.json").read_text())
    assert header["twin_spec_hash"] == spec_hash(load_scene_spec(scene))

    a = LeRobotDataset(tmp_path / "plain").read_episode(0)
    b = LeRobotDataset(tmp_path / "moved").read_episode(0)
    assert np.array_equal(a.action, b.action)  # the same layout and expert
    table = (slice(100, 128), slice(30, 100))  # below the arm: table pixels in the front camera
    blue_a = a.frames["front_sim"][0][table].astype(float)
    blue_b = b.frames["front_sim"][0][table].astype(float)
    assert (blue_b[..., 2] - blue_b[..., 0]).mean() > (blue_a[..., 2] - blue_a[..., 0]).mean() + 40
    from comsim.metrics.action import robot_masks_from_labels
    robot = robot_masks_from_labels(a.frames["front_sim_seg"][:1])[0]  # the same pose in both
    assert robot.sum() > 200
    warm = lambda f: (f[0][robot][:, 0].astype(float) - f[0][robot][:, 2]).mean()  # noqa: E731 red minus blue
    assert warm(b.frames["front_sim"]) > warm(a.frames["front_sim"]) + 20
    assert spec_hash(load_scene_spec(ROOT / "configs" / "twin" / "panda_cell.yaml")) == "b2ee4c3e353bb1d9"  # untinted


def test_task_files_are_read_with_a_safe_loader(tmp_path):
    # Task YAML comes from users (or a language model): Python object tags must not run.
    marker = tmp_path / "ran"
    bad = tmp_path / "evil.yaml"
    bad.write_text(f"task: !!python/object/apply:os.system ['touch {marker}']\n")
    from comsim.config import ConfigError
    with pytest.raises(ConfigError, match="could not determine a constructor") as e:
        load_program(bad)
    assert "evil.yaml" in str(e.value) and not marker.exists()
