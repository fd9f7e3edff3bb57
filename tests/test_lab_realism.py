"""The lab's realism options (comsim/lab/realism.py): what a real cell has and the twin never models.

Real MuJoCo rendering of the built-in lab with one option switched on at a time (dotted overrides,
as any cell would), and the workshop cell that uses them all. Fast by default; the whole workshop
recording, alignment and replay is `pytest -m slow`.
"""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import hashlib  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from comsim.config import PANDA_PUSH_CELL, ConfigError  # noqa: E402
from comsim.lab import LabEnv, load_lab_cell, record_episode  # noqa: E402
from comsim.lab.realism import episode_conditions, print_image  # noqa: E402
from comsim.sim.camera import as_K, project_points  # noqa: E402
from comsim.sim.scene import OBJECT_PREFIX  # noqa: E402
from comsim.sim.spec import load_scene_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "configs" / "lab" / "default.yaml"
COOL = ROOT / "configs" / "lab" / "cool_studio.yaml"
WORKSHOP = ROOT / "configs" / "lab" / "workshop.yaml"
REFERENCE = ROOT / "tests" / "data" / "lab_default_recording.json"
RED = 2  # the red cube's label (objects are 2 + k in the spec's order)


def env_with(*overrides, cell=DEFAULT, task="push"):
    return LabEnv(load_lab_cell(cell, list(overrides)), task)


def gl_renderer() -> str:
    """The OpenGL renderer and Mesa/driver version the lab draws with (frames are only byte-stable on one)."""
    m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom size="1"/></worldbody></mujoco>')
    r = mujoco.Renderer(m, 16, 16)
    try:
        r._gl_context.make_current()
        from OpenGL import GL
        return f"{GL.glGetString(GL.GL_RENDERER).decode()} | {GL.glGetString(GL.GL_VERSION).decode()}"
    finally:
        r.close()


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- defaults: nothing changed


def test_cells_without_realism_keep_their_hash():
    """The options are off by default and left out of the cell's dict: the built-in cells' hashes (written into
    every recording's provenance and truth) are the ones of the cells without the options."""
    assert load_lab_cell(DEFAULT).hash() == "a471d0a9aa59a02f"
    assert load_lab_cell(COOL).hash() == "d79ee644e27b4fad"
    d = load_lab_cell(DEFAULT).to_dict()
    assert "prints" not in d["look"] and "physics_drift" not in d
    on = load_lab_cell(DEFAULT, ["look.light_drift.intensity=0.2"])
    assert on.to_dict()["look"]["light_drift"]["intensity"] == 0.2 and on.hash() != load_lab_cell(DEFAULT).hash()


def test_default_cell_recording_is_unchanged():
    """A default-cell push episode (frames, states, actions, hidden truth) hashes as the one recorded by the lab
    without realism options (tests/data/lab_default_recording.json). States, actions and truth are compared always;
    frames only with the OpenGL renderer the reference was taken with (other drivers rasterize differently)."""
    ref = json.loads(REFERENCE.read_text())
    with LabEnv(load_lab_cell(DEFAULT), "push") as env:
        ep, truth = record_episode(env, ref["seed"])
    assert env.conditions is None
    got = {"state_action": digest(ep.state, ep.action), "truth": digest(*(truth[k] for k in sorted(truth))),
           "frames": digest(ep.frames["front"]), "length": len(ep)}
    assert got["length"] == ref["length"]
    assert got["state_action"] == ref["state_action"] and got["truth"] == ref["truth"]
    if gl_renderer() == ref["gl_renderer"] and mujoco.__version__ == ref["mujoco"]:
        assert got["frames"] == ref["frames"]


# ---------------------------------------------------------------- printed faces, clutter


def test_printed_faces_change_the_object_but_nothing_else():
    stripes = "look.prints={red_cube: {pattern: stripes, rgb: [0.95, 0.95, 0.95], count: 2}}"
    with env_with() as flat, env_with(stripes) as printed:
        a, b = flat.reset(4), printed.reset(4)  # noqa: F841 (same layout, same state)
        ca, cb = flat.clean_image().astype(int), printed.clean_image().astype(int)
        seg = flat.camera.renderer.segmentation()
    cube = seg == RED
    assert cube.sum() > 15
    diff = np.abs(ca - cb).sum(-1)
    assert diff[cube].mean() > 30  # white stripes over red
    assert np.array_equal(ca[~cube], cb[~cube])
    assert cb[cube].std(0).mean() > 1.5 * ca[cube].std(0).mean()  # two tones, not one
    for pattern in ("stripes", "checker", "two_tone", "logo", "label"):
        from comsim.lab.realism import PrintLook
        img = print_image([0.8, 0.1, 0.1, 1], PrintLook(pattern=pattern, text="ACME"))
        assert img.shape == (64, 64, 3) and len(np.unique(img.reshape(-1, 3), axis=0)) >= 2


def test_clutter_is_drawn_labelled_background_and_never_collides():
    item = "look.clutter=[{name: box, shape: box, size: [0.1, 0.1, 0.1], pos: [0.75, -0.3], rgba: [0.9, 0.9, 0.1, 1]}]"
    with env_with() as plain, env_with(item) as cluttered:
        plain.reset(4), cluttered.reset(4)
        a, b = plain.clean_image().astype(int), cluttered.clean_image().astype(int)
        seg = cluttered.camera.renderer.segmentation()
        m = cluttered.scene.model
        g = m.geom("clutter/box")
        assert g.contype == 0 and g.conaffinity == 0
    changed = np.abs(a - b).sum(-1) > 30
    assert changed.sum() > 30
    assert np.all(seg[changed] == 0)  # the twin's labels never see it: background


def test_malformed_realism_options_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="look.prints.green_cube"):
        load_lab_cell(DEFAULT, ["look.prints={green_cube: {pattern: stripes}}"])
    with pytest.raises(ConfigError, match=r"look.clutter\[0\].size"):
        load_lab_cell(DEFAULT, ["look.clutter=[{name: a, shape: cylinder, size: [0.1], pos: [0, 0]}]"])
    with pytest.raises(ConfigError, match="look.motion_blur"):
        load_lab_cell(DEFAULT, ["look.motion_blur.exposure=2"])
    with pytest.raises(ConfigError, match="physics_drift.mass"):
        load_lab_cell(DEFAULT, ["physics_drift.mass=[1.2, 0.8]"])
    bad = tmp_path / "cell.yaml"
    bad.write_text(WORKSHOP.read_text().replace("pattern: label, rgb: [0.93", "pattern: plaid, rgb: [0.93"))
    with pytest.raises(ConfigError, match=f"{bad}.*look.prints.red_cube.pattern"):
        load_lab_cell(bad)


# ---------------------------------------------------------------- episode to episode


def test_light_and_exposure_differ_between_episodes_and_repeat_with_the_seed():
    ov = ["look.light_drift={intensity: 0.3, color: 0.1, direction_deg: 10, position_m: 0.2}",
          "look.exposure={gain: [0.7, 1.4], white_balance: 0.1}"]
    cell = load_lab_cell(DEFAULT, ov)
    c1, c1b, c2 = episode_conditions(cell, 1), episode_conditions(cell, 1), episode_conditions(cell, 2)
    assert np.array_equal(c1.light_factor, c1b.light_factor) and c1.gain == c1b.gain
    assert not np.allclose(c1.light_factor, c2.light_factor) and c1.gain != c2.gain
    with LabEnv(cell, "push") as env, env_with() as plain:
        a1 = env.reset(1)["image"]
        d1 = env.scene.model.light_diffuse.copy()
        a2 = env.reset(2)["image"]
        d2 = env.scene.model.light_diffuse.copy()
        a1b = env.reset(1)["image"]
        p1 = plain.reset(1)["image"]
        env.nominal()  # the calibration stills' light: the cell's own
        assert np.allclose(env.scene.model.light_diffuse, plain.scene.model.light_diffuse)
    assert np.array_equal(a1, a1b)  # same seed, same bytes
    assert not np.allclose(d1, d2)
    wall = (slice(0, 30), slice(0, 128))  # the back wall: no objects, same pixels in every layout
    assert abs(a1[wall].mean() - p1[wall].mean()) > 3 or abs(a2[wall].mean() - p1[wall].mean()) > 3


def test_auto_exposure_pulls_the_brightness_toward_its_target():
    fixed = "look.exposure={gain: [2.0, 2.0]}"
    auto = "look.exposure={auto: 1.0, target: 60, speed: 1.0}"
    with env_with() as plain, env_with(fixed) as bright, env_with(auto) as ae:
        m0, m1, m2 = (float(e.reset(3)["image"].mean()) for e in (plain, bright, ae))
        clean = float(ae.clean_image().mean())
    assert m1 > 1.5 * m0  # twice the exposure (clipped, gamma)
    assert clean > 80 and m2 < 0.85 * m0  # the gain takes the clean render's mean down to 60


def test_distractor_passes_in_some_episodes_only():
    d = ("look.distractors=[{probability: 0.5, shape: box, size: [0.3, 0.2, 0.9], colors: [[0.9, 0.1, 0.9, 1]], "
         "start: [-0.45, -1.2, 0.05], end: [-0.45, 1.2, 0.05], speed: [1.0, 1.0], start_s: [0.0, 0.0]}]")
    cell = load_lab_cell(DEFAULT, [d])
    on = [s for s in range(12) if episode_conditions(cell, s).distractors[0] is not None]
    assert 0 < len(on) < 12
    with LabEnv(cell, "push") as env, env_with() as plain:
        seed = on[0]
        env.reset(seed), plain.reset(seed)
        hold = env.scene.get_state().copy()
        hold[7] = 1.0
        seen = []
        for _ in range(15):  # 1.5 s at 1 m/s: it crosses the view behind the robot
            env.step(hold), plain.step(hold)
            diff = np.abs(env.clean_image().astype(int) - plain.clean_image().astype(int)).sum(-1)
            seen.append(float((diff > 60).mean()))
    assert max(seen) > 0.02 and seen[-1] < max(seen)


# ---------------------------------------------------------------- camera, blur, physics


def _shift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sub-pixel translation of b against a (phase correlation of the grey images)."""
    ga, gb = (cv2.cvtColor(x, cv2.COLOR_RGB2GRAY).astype(np.float64) for x in (a, b))
    (dx, dy), _ = cv2.phaseCorrelate(ga, gb)
    return np.array([dx, dy])


def test_camera_is_about_a_pixel_off_the_stills_and_drifts():
    ov = "look.camera_motion={offset_px: [1.0, -0.5], drift_px: 0.6, drift_period_s: [4.0, 4.0]}"
    with env_with(ov) as env:
        env.reset(6)
        episode = env.clean_image()
        T_episode = env.camera_pose()
        env.nominal()  # the camera of the calibration stills
        still = env.camera.clean()
        cell = env.cell
        T_still = env.camera_pose()
        env.place_camera(T_episode)  # a frame's true pose, from the truth: its true labels are drawn there
        assert np.array_equal(env.camera.clean(), episode)
        env.place_camera(None)
        env.reset(6)
        poses = []
        for k in range(20):
            env.step(env.scene.get_state() * 0 + np.r_[env.scene.get_state()[:7], 1.0])
            poses.append(env.camera_pose())
    cam = cell.scene.camera(cell.camera)
    assert np.allclose(T_still, np.asarray(cam.T_cam_from_base))
    c = episode_conditions(cell, 6)
    expected = c.camera_shift_px(0.0)
    assert 0.6 < np.linalg.norm(expected) < 2.0
    got = _shift(still, episode)
    assert np.allclose(got, expected, atol=0.25), (got, expected)
    pts = np.array([[0.5, 0.0, 0.0], [0.3, 0.2, 0.1]])  # the truth written per frame says the same
    uv = project_points(as_K(cam.K), T_episode, pts) - project_points(as_K(cam.K), T_still, pts)
    assert np.allclose(uv, expected, atol=0.1)
    drift = [np.linalg.norm(project_points(as_K(cam.K), T, pts[:1]) - project_points(as_K(cam.K), poses[0], pts[:1]))
             for T in poses]
    assert 0.2 < max(drift) < 2 * 0.6 + 0.1  # slow: under its amplitude's span, but it moves


def test_motion_blur_smears_the_moving_arm_not_the_background():
    blur = "look.motion_blur={exposure: 1.0, samples: 4}"
    with env_with() as sharp, env_with(blur) as blurred:
        # nothing moved before an episode's first frame: it is the sharp one (same sensor noise too)
        assert np.array_equal(sharp.reset(2)["image"], blurred.reset(2)["image"])
        before = sharp.clean_image().astype(float)
        q = sharp.scene.get_state().copy()
        q[0] += 0.25  # a fast swing of the base joint: several pixels per frame
        q[7] = 1.0
        seg_before = sharp.camera.renderer.segmentation() == 1
        sharp.step(q), blurred.step(q)
        a, b = sharp.clean_image().astype(float), blurred.clean_image().astype(float)
        seg_after = sharp.camera.renderer.segmentation() == 1
        blurred._last_render = (None, None)  # the shutter's first sample re-rendered, not taken from the last frame
        assert np.array_equal(blurred.clean_image(), b.astype(np.uint8))
    arm = cv2.dilate((seg_before | seg_after).astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    # far from where the arm was and is (it sweeps the pixels between), and no shadow moved there
    near = cv2.dilate(arm.astype(np.uint8), np.ones((41, 41), np.uint8)) > 0
    static = (np.abs(a - before).sum(-1) == 0) & ~near
    diff = np.abs(a - b).sum(-1)
    assert static.mean() > 0.3
    assert np.abs(a - b)[static].max() <= 1.0  # the same (up to the rounding of a mean of equal renders)
    assert diff[arm].mean() > 15

    def sharpness(img):
        g = cv2.cvtColor(img.astype(np.uint8), cv2.COLOR_RGB2GRAY).astype(float)
        return np.abs(np.diff(g, axis=1))[arm[:, 1:]].mean()
    assert sharpness(b) < 0.9 * sharpness(a)


def test_physics_differs_from_the_twin_and_between_episodes():
    twin = load_scene_spec(PANDA_PUSH_CELL)
    workshop = load_lab_cell(WORKSHOP)
    nominal = {o.name: o for o in twin.objects}
    for o in workshop.scene.objects:
        assert o.mass != nominal[o.name].mass and o.friction != nominal[o.name].friction
    assert workshop.scene.table.friction != twin.table.friction
    with LabEnv(workshop, "push") as env:
        m = env.scene.model
        g, b = m.geom(OBJECT_PREFIX + "red_cube").id, m.body(OBJECT_PREFIX + "red_cube").id
        masses, frictions = [], []
        for seed in (1, 2, 1):
            env.reset(seed)
            masses.append(float(m.body_mass[b]))
            frictions.append(float(m.geom_friction[g, 0]))
            c = env.conditions
            assert np.isclose(masses[-1], 0.07 * c.mass[0]) and np.isclose(frictions[-1], 0.35 * c.friction[0])
    assert masses[0] == masses[2] and masses[0] != masses[1] and frictions[0] != frictions[1]
    assert all(abs(x - nominal["red_cube"].mass) > 0.01 for x in masses)


def test_workshop_episode_is_the_same_bytes_for_the_same_seed():
    with LabEnv(load_lab_cell(WORKSHOP), "push") as a, LabEnv(load_lab_cell(WORKSHOP), "push") as b:
        frames = []
        for env in (a, b):
            obs = [env.reset(11)["image"]]
            q = env.scene.get_state().copy()
            q[7] = 1.0
            for k in range(4):
                q[0] += 0.05
                obs.append(env.step(q)[0]["image"])
            frames.append(np.stack(obs))
    assert np.array_equal(frames[0], frames[1])


# ---------------------------------------------------------------- the workshop, end to end (slow)


@pytest.mark.slow
def test_the_twin_aligns_on_the_workshop_and_renders_it_as_far_off_as_real_video(tmp_path):
    """The demo's lab and twin stages on the workshop (comsim/demo.py: record_dataset with calibration
    stills, replay_dataset in physics mode from the nominal twin): the camera is calibrated from the
    cell's own stills, the objects are found, and the raw render is in the range of real paired video
    (15-19 dB PSNR, per frame then the mean, 128x128)."""
    from comsim.io.lerobot import LeRobotDataset
    from comsim.lab import record_dataset
    from comsim.metrics.frame import mean_psnr
    from comsim.twin.replay import replay_dataset

    lab = record_dataset("push", 3, tmp_path / "lab", seed=0, cell=WORKSHOP, calibration_stills=12)
    paired = replay_dataset(lab, PANDA_PUSH_CELL, tmp_path / "paired", mode="physics", workers=2)
    summary = json.loads((paired / "alignment_report.json").read_text())["summary"]
    assert summary["camera_position_error_m"] < 0.02 and summary["camera_rotation_error_deg"] < 1.0, summary
    assert summary["object_initial_error_m_max"] < 0.06, summary
    ds = LeRobotDataset(paired)
    eps = [ds.read_episode(e, cameras=["front", "front_sim"]) for e in range(len(ds))]
    psnr = mean_psnr((ep.frames["front_sim"], ep.frames["front"]) for ep in eps)
    assert 15.0 <= psnr <= 19.0, psnr
    truth = np.load(lab / "lab_truth" / "episode_000000.npz")
    assert truth["camera_T_cam_from_base"].shape == (len(eps[0]), 4, 4)  # the moving camera's true poses
