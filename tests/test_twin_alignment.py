"""The twin lines up with a camera that moved after its calibration, and says how sure it is of each object.

Real lab recordings, real MuJoCo rendering, the lab's truth only to score (the twin never reads it):
comsim.twin.camera_motion (each frame registered to the robot-free still), the replay following it frame by
frame, a static camera left exactly as without this step, the position uncertainty
(comsim.twin.uncertainty) and its place in the self-check and the report. `-m slow`: the sharper
calibration on cool_studio's stills.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from comsim.io.lerobot import LeRobotDataset  # noqa: E402
from comsim.lab.pairs import true_calibration  # noqa: E402
from comsim.sim.spec import load_scene_spec, scene_spec_from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TWIN = ROOT / "configs" / "twin" / "panda_cell_push.yaml"
# the built-in lab with its camera bumped after the stills (1.2 px) and drifting (0.4 px) within an episode
BUMPED = ["look.camera_motion.offset_px=[1.0,-0.7]", "look.camera_motion.drift_px=0.4",
          "look.camera_motion.drift_period_s=[20.0,30.0]"]
QUIET = dict(log=lambda *a: None)


def record(out: Path, overrides=(), episodes: int = 2, stills: int = 1, seed: int = 0, cell=None) -> Path:
    from comsim.lab.cell import load_lab_cell
    from comsim.lab.record import record_dataset
    return record_dataset("push", episodes=episodes, out=out, seed=seed, cell=load_lab_cell(cell, list(overrides)),
                          calibration_stills=stills)


@pytest.fixture(scope="module")
def bumped(tmp_path_factory):
    return record(tmp_path_factory.mktemp("bumped") / "lab", BUMPED, seed=4)


@pytest.fixture(scope="module")
def still_camera(tmp_path_factory):
    return record(tmp_path_factory.mktemp("static") / "lab", seed=4)


def alignment(real: Path) -> dict:
    """The replay's alignment of ``real`` with the lab's true still camera (calibration is not under test)."""
    from comsim.twin.replay import align
    return align(real, load_scene_spec(TWIN), true_calibration(real), **QUIET)


# ----------------------------------------------------------------- the camera's motion


def test_register_shift_recovers_a_known_sub_pixel_shift(still_camera):
    from comsim.twin.align import stills_background
    from comsim.twin.camera_motion import register_shift, shifted_image
    still = stills_background(still_camera, 128, 128)
    K = [110.0, 110.0, 63.5, 63.5]
    moved = shifted_image(still, (0.37, -0.81), K)
    est = register_shift(still, moved, np.ones(still.shape[:2], bool), K)
    assert np.allclose(est["shift"], (0.37, -0.81), atol=0.02), est


def test_camera_motion_follows_the_lab_camera_and_a_still_one_is_left_alone(bumped, still_camera):
    """Every frame's shift against the lab's own (px at the image centre): a bumped and drifting camera is
    followed to a tenth of a pixel; a camera that stood still is not moved at all."""
    from comsim.lab.twin_truth import camera_motion_vs_truth
    al = alignment(bumped)
    m = camera_motion_vs_truth(bumped, al)
    for e, row in m["episodes"].items():
        assert row["moved"] and np.hypot(*row["true_mean_px"]) > 0.9, row
        assert al["camera_motion"][e]["drift_px"] > 0.05, al["camera_motion"][e]  # the drift within it is there
    assert m["error_px_max"] < 0.25 and m["error_px_rms"] < 0.15, m
    assert "camera moved" not in json.dumps(al["self_check"]["camera"]["episodes_moved"])  # 1.2 px is not too far
    al0 = alignment(still_camera)
    for e, mo in al0["camera_motion"].items():
        assert not mo["moved"] and np.hypot(*mo["offset_px"]) < 0.1, mo
    assert al0["episode_K"]["0"] == al0["K"]  # objects localized through the calibrated camera as before


def robot_iou(real: Path, paired_episode, e: int) -> float:
    """Mean IoU of a replayed episode's robot labels with the lab's true masks (4 frames)."""
    from comsim.io.keys import seg_key
    from comsim.io.labels import rgb_to_seg
    from comsim.lab.truth import load_lab_truth
    from comsim.lab.twin_truth import TrueMasks
    from comsim.twin.pose_fit import iou
    tm = TrueMasks(load_lab_truth(real))
    try:
        seg = paired_episode.frames[seg_key("front")]
        ks = np.unique(np.linspace(0, len(seg) - 1, 4).astype(int))
        return float(np.mean([iou(rgb_to_seg(seg[k]) == 1, tm.mask(e, k, paired_episode.state[k])) for k in ks]))
    finally:
        tm.close()


def test_replay_follows_a_moved_camera_and_not_a_still_one(bumped, still_camera):
    """The pairs of a bumped camera sit on the real frames (robot IoU against the true masks well above the same
    replay through the calibrated camera alone); a camera that stood still gets the same frames as a replay
    without the camera-motion step."""
    from comsim.twin.replay import replay_episode
    al = alignment(bumped)
    spec = scene_spec_from_dict(al["spec"])
    ds = LeRobotDataset(bumped)
    kw = dict(mode="kinematic", channels=("seg",), refine=False)
    followed = replay_episode(ds, 0, al, spec, **kw)
    assert followed.provenance.extra["camera_motion_px"]["offset"] == al["camera_motion"]["0"]["offset_px"]
    fixed = replay_episode(ds, 0, {**al, "camera_motion": {}}, spec, **kw)
    a, b = robot_iou(bumped, followed, 0), robot_iou(bumped, fixed, 0)
    assert a > 0.95 and a > b + 0.03, (a, b)
    al0 = alignment(still_camera)
    spec0 = scene_spec_from_dict(al0["spec"])
    ds0 = LeRobotDataset(still_camera)
    x, y = replay_episode(ds0, 1, al0, spec0, **kw), replay_episode(ds0, 1, {**al0, "camera_motion": {}}, spec0, **kw)
    assert all(np.array_equal(x.frames[k], y.frames[k]) for k in x.frames)
    assert "camera_motion_px" not in x.provenance.extra


# ----------------------------------------------------------------- the position uncertainty


def test_radius_95_holds_95_percent_of_a_2d_normal():
    from comsim.twin.uncertainty import radius_95
    rng = np.random.default_rng(0)
    for cov in (np.diag([1e-4, 1e-4]), np.array([[4e-4, 1e-4], [1e-4, 0.5e-4]]), np.diag([9e-4, 1e-6])):
        r = radius_95(cov)
        e = rng.multivariate_normal([0, 0], cov, 200_000)
        assert np.mean(np.linalg.norm(e, axis=1) <= r) == pytest.approx(0.95, abs=0.003), cov


def test_every_object_has_an_uncertainty_from_what_the_twin_knows(bumped, tmp_path):
    """Each found object carries its position uncertainty (the parts in pixels, the bound) in the self-check,
    twin_alignment.json and alignment_report.json; scored against the truth in the report's summary."""
    from comsim.lab.twin_truth import replay_and_score
    out = replay_and_score(bumped, TWIN, tmp_path / "paired", mode="kinematic", channels=("seg",), refine=False,
                           calibration=true_calibration(bumped), on_unreliable="mark", **QUIET)
    rep = json.loads((out / "alignment_report.json").read_text())
    for per in rep["self_check"]["objects"].values():
        for r in per.values():
            u = r["uncertainty"]
            assert 0.002 < u["bound_95_m"] < 0.05 and set(u["parts_px"]) == {"camera", "fit", "floor", "motion"}, u
            assert u["parts_px"]["motion"] < 0.1  # the motion was followed: its standard error, not the shift
    s = rep["summary"]["uncertainty_vs_truth"]
    assert s["placements"] == 4 and s["with_bound"] == 4 and s["over_limit_trusted"] == [], s
    assert rep["summary"]["camera_motion_vs_truth"]["error_px_max"] < 0.25


def test_the_report_shows_the_motion_and_the_bounds(bumped, tmp_path):
    from comsim.lab.twin_truth import replay_and_score
    from comsim.report.html import Report
    from comsim.report.twin import twin_section
    run = tmp_path / "run"
    replay_and_score(bumped, TWIN, run / "paired", mode="kinematic", channels=("seg",), refine=False,
                     calibration=true_calibration(bumped), on_unreliable="mark", **QUIET)
    rep = Report(run / "report")
    twin_section(rep, run)
    html = rep.write().read_text()
    for text in ("camera shift from the stills", "(followed)", "red_cube 95% bound", "95% bound holds",
                 "since the stills as the replay followed it, against the lab"):
        assert text in html, text


# ----------------------------------------------------------------- the sharper calibration


def test_markers_are_found_where_the_true_camera_puts_them_in_the_still(still_camera):
    """The push sticker of the twin spec, located in the robot-free still, sits where the lab's true camera
    projects it; from a camera a few px off it is found at the same place; a colour not there is not found."""
    import dataclasses
    from comsim.lab.truth import load_lab_truth
    from comsim.sim.camera import shifted_camera
    from comsim.twin.calibrate import locate_markers, marker_error_px
    from comsim.twin.frames import load_calibration_folder

    fr = load_calibration_folder(still_camera / "calibration")
    T, markers = load_lab_truth(still_camera).T_cam_from_base, load_scene_spec(TWIN).markers
    found = locate_markers(fr.background, fr.K, T, markers)
    assert set(found) == {"push_target"} and marker_error_px(fr.K, T, markers, found) < 0.6
    off = shifted_camera(T, fr.K, (3.0, -2.0))
    assert np.allclose(locate_markers(fr.background, fr.K, off, markers)["push_target"], found["push_target"])
    assert 3.0 < marker_error_px(fr.K, off, markers, found) < 4.0
    red = dataclasses.replace(markers[0], name="red", rgba=[0.9, 0.1, 0.1, 1.0])
    assert locate_markers(fr.background, fr.K, T, [red]) == {}


@pytest.mark.parametrize("stage_helps", [True, False])
def test_the_sharper_stage_is_kept_only_when_it_brings_the_markers_closer(still_camera, monkeypatch, stage_helps):
    """``sharpen_by_markers``: both calibrations are made and the one whose pose puts the located markers closer
    is kept, with both errors in the result; the one not kept leaves the result as it was before the stage."""
    import comsim.twin.calibrate as cal
    from comsim.lab.truth import load_lab_truth
    from comsim.sim.camera import shifted_camera
    from comsim.twin.frames import load_calibration_folder

    fr = load_calibration_folder(still_camera / "calibration")
    T_true = np.asarray(load_lab_truth(still_camera).T_cam_from_base)
    near, far = shifted_camera(T_true, fr.K, (0.5, 0.0)), shifted_camera(T_true, fr.K, (2.5, 1.5))
    before, after = (far, near) if stage_helps else (near, far)

    def stage(frames, res, *args, **kw):  # the stage's own fit is under test elsewhere: here, where it lands
        res.update(T_cam_from_base=after.tolist(), mean_iou_trusted=0.95, sharpened={"why": "forced"})
        return "sharpened frames"
    monkeypatch.setattr(cal, "sharpen", stage)
    res = {"T_cam_from_base": before.tolist(), "mean_iou_trusted": 0.99, "converged": True}
    plain = dict(res)
    out = cal.sharpen_by_markers(fr, res, load_scene_spec(TWIN), "light", log=lambda *a: None)
    if stage_helps:
        assert out == "sharpened frames" and res["T_cam_from_base"] == near.tolist()
        assert res["sharpened"]["marker_error_px"] < res["sharpened"]["marker_error_px_without"]
        assert res["sharpened"]["markers"] == ["push_target"]
    else:
        assert out is fr and "sharpened" not in res
        assert {k: res[k] for k in plain} == plain
        assert res["not_sharpened"]["marker_error_px"] > res["not_sharpened"]["marker_error_px_without"]
    # a spec without markers: the stills' IoU decides, as before (0.99 is over the gate: no stage)
    bare = load_scene_spec(TWIN)
    bare.markers = []
    res = dict(plain)
    assert cal.sharpen_by_markers(fr, res, bare, "light", log=lambda *a: None) is fr and res == plain


def test_points_of_known_place_alone_pin_the_camera():
    """``refine_contour``'s ``points``: with masks that say nothing (unknown everywhere), four table points seen
    where the true camera puts them bring a camera 2 cm and 1 deg off back onto it, as a PnP would."""
    from comsim.sim.camera import look_at, project_points
    from comsim.twin.pose_fit import MaskTargets, SilhouetteScorer, perturb, pose_error, refine_contour
    from comsim.twin.silhouette import RobotSilhouette

    K, W, H = [110.0, 110.0, 63.5, 63.5], 128, 128
    T_true = look_at([1.4, 0.3, 0.8], [0.4, 0.0, 0.2])
    X = np.array([[0.3, -0.2, 0.0], [0.6, -0.2, 0.0], [0.6, 0.25, 0.0], [0.35, 0.2, 0.0]])
    uv = project_points(K, T_true, X)
    start = perturb(T_true, [0.01, -0.01, 0.005, 0.02, -0.01, 0.01])
    q = np.zeros((1, 7))
    with RobotSilhouette("panda", K, W, H, visual="light") as sil:
        scorer = SilhouetteScorer(sil, q, np.zeros((1, 2)), MaskTargets(np.zeros((1, H, W), np.float32),
                                                                         np.zeros((1, H, W), np.float32)))
        T_fit, _ = refine_contour(scorer, start, [0], (W, H), outer=8, points=(X, uv, 1.0))
        T_none, _ = refine_contour(scorer, start, [0], (W, H), outer=8)
    assert pose_error(start, T_true)[0] > 0.02
    d_m, d_deg = pose_error(T_fit, T_true)
    assert d_m < 1e-4 and d_deg < 0.01, (d_m, d_deg)
    assert np.allclose(T_none, start)  # nothing known, nothing moves


def test_the_markers_take_part_in_the_last_fit_and_are_recorded(still_camera):
    """``fit_markers``: the still's masks drawn at the true camera and a start 1.5 px off: the last fit brings the
    sticker back onto where it shows, keeps the outline on the masks, and records both marker errors and the move;
    a spec without markers leaves the result as it was."""
    import dataclasses
    from comsim.lab.truth import load_lab_truth
    from comsim.sim.camera import shifted_camera
    from comsim.twin.calibrate import fit_markers
    from comsim.twin.frames import load_calibration_folder
    from comsim.twin.silhouette import RobotSilhouette

    fr = load_calibration_folder(still_camera / "calibration")
    spec = load_scene_spec(TWIN)
    T_true = np.asarray(load_lab_truth(still_camera).T_cam_from_base)
    W, H = fr.size
    with RobotSilhouette(spec, fr.K, W, H, visual="light") as sil:
        sil.set_camera(T_true)
        sil.set_joints(fr.joints[0], fr.fingers[0])
        fr = dataclasses.replace(fr, masks=sil.mask()[None].astype(np.float32), valid=None)
    start = shifted_camera(T_true, fr.K, (1.2, -0.9))
    res = {"T_cam_from_base": start.tolist(), "trusted_frames": list(fr.names)}
    fit_markers(fr, res, spec, "light", **QUIET)
    mk = res["markers_fitted"]
    assert mk["markers"] == ["push_target"] and mk["weight"] == 1.0
    assert mk["marker_error_px_before"] > 1.0 and mk["marker_error_px"] < 0.5, mk
    assert mk["moved_mm"] > 0 and res["mean_iou_trusted"] > 0.97
    assert {"contour_residual_px", "pose_covariance"} <= set(res)
    bare = dataclasses.replace(spec, markers=[])
    res = {"T_cam_from_base": start.tolist(), "trusted_frames": list(fr.names)}
    fit_markers(fr, res, bare, "light", **QUIET)
    assert res == {"T_cam_from_base": start.tolist(), "trusted_frames": list(fr.names)}


@pytest.mark.slow
def test_sharper_calibration_on_a_cell_whose_masks_lose_the_rim(tmp_path, monkeypatch):
    """cool_studio's stills give masks that miss the shaded rim of the links (trusted mean IoU under
    SHARPEN_BELOW_IOU): the sharper stage runs and brings the objects' table positions through the camera
    closer to the truth; with the stage off, the calibration is the one it always was."""
    import comsim.twin.calibrate as cal
    from comsim.lab.truth import load_lab_truth
    from comsim.sim.camera import project_points
    from comsim.twin.align import calibrate_stills
    from comsim.twin.localize import _ray_to_plane
    real = record(tmp_path / "cool", episodes=1, stills=12, cell=ROOT / "configs" / "lab" / "cool_studio.yaml")
    spec = load_scene_spec(TWIN)
    sharp = calibrate_stills(real / "calibration", spec, "front", **QUIET)  # the sticker decides: kept
    assert sharp["sharpened"]["marker_error_px"] < sharp["sharpened"]["marker_error_px_without"], sharp["sharpened"]
    fitted = sharp["markers_fitted"]  # and the sticker takes part in the last fit
    assert fitted["marker_error_px"] < fitted["marker_error_px_before"], fitted
    spec.markers = []  # no marker: the stills' IoU decides, here switched off
    monkeypatch.setattr(cal, "SHARPEN_BELOW_IOU", 0.0)
    plain = calibrate_stills(real / "calibration", spec, "front", **QUIET)
    assert "sharpened" not in plain, plain["mean_iou"]
    T_true, K = load_lab_truth(real).T_cam_from_base, [110.0, 110.0, 63.5, 63.5]

    def table_error(T):  # how far table points seen by the true camera land through T (m)
        pts = np.array([[x, y, 0.025] for x in (0.3, 0.45, 0.6) for y in (-0.1, 0.1, 0.25)])
        uv = project_points(K, T_true, pts)
        return float(np.mean([np.linalg.norm(_ray_to_plane(K, np.asarray(T), u, 0.025)[:2] - p[:2])
                              for u, p in zip(uv, pts)]))
    assert table_error(sharp["T_cam_from_base"]) < table_error(plain["T_cam_from_base"]) - 0.002
