"""The twin checks itself (comsim.twin.selfcheck): residuals without truth, refuse or mark.

Real lab recordings and real MuJoCo rendering throughout. The low-contrast cell is
configs/lab/cool_studio.yaml with its table recoloured to the blue cube's hue (a blue-grey
top): the lab's truth scores what the twin did (the twin never reads it), and every object
must be within 2 cm of the truth or named unreliable. The fast tests give the replay the
lab's true camera (``--calibration``) so that they test localization and the self-check,
not calibration; `-m slow` calibrates from the stills as a user's run does.
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
from comsim.sim.spec import load_scene_spec  # noqa: E402
from comsim.twin.selfcheck import (OBJECT_IOU_MIN, UnreliableTwinError, camera_check,  # noqa: E402
                                   check_alignment, unreliable_message)

ROOT = Path(__file__).resolve().parents[1]
TWIN = ROOT / "configs" / "twin" / "panda_cell_push.yaml"
COOL = ROOT / "configs" / "lab" / "cool_studio.yaml"
# cool_studio's blue cube is [0.10, 0.36, 0.66] (hue 212 deg): a blue-grey table of that hue
BLUE_TABLE = ["scene.table.rgba=[0.36,0.46,0.60,1.0]", "look.table.rgb1=[0.30,0.40,0.52]",
              "look.table.rgb2=[0.45,0.55,0.68]"]
QUIET = dict(log=lambda *a: None)


def record(out: Path, cell, overrides=(), episodes: int = 2, stills: int = 1, seed: int = 0) -> Path:
    from comsim.lab.cell import load_lab_cell
    from comsim.lab.record import record_dataset
    return record_dataset("push", episodes=episodes, out=out, seed=seed, cell=load_lab_cell(cell, list(overrides)),
                          calibration_stills=stills)


def truth_errors(real: Path, found: dict[str, dict], episode: int) -> dict[str, float]:
    from comsim.lab.truth import read_episode_truth
    tr = read_episode_truth(real, episode)
    names = [str(n) for n in tr["object_names"]]
    return {n: (float(np.linalg.norm(np.asarray(f["pos"][:2]) - tr["object_pos"][0][names.index(n)][:2]))
                if f["found"] else np.inf) for n, f in found.items()}


def with_yellow_can():
    """The twin's nominal cell with a yellow can on the table that the lab's cell does not have."""
    from comsim.sim.spec import ObjectSpec
    spec = load_scene_spec(TWIN)
    spec.objects.append(ObjectSpec(name="yellow_can", shape="cylinder", size=[0.03, 0.08], rgba=[0.9, 0.8, 0.1, 1.0],
                                   pos=[0.6, 0.1]))
    return spec


@pytest.fixture(scope="module")
def blue_table(tmp_path_factory):
    return record(tmp_path_factory.mktemp("blue") / "lab", COOL, BLUE_TABLE)


@pytest.fixture(scope="module")
def default_lab(tmp_path_factory):
    return record(tmp_path_factory.mktemp("default") / "lab", None, seed=3)


# ----------------------------------------------------------------- the checks themselves


def test_camera_check_names_the_frames_under_the_threshold():
    ok = camera_check({"per_frame_iou": {"000": 0.91, "001": 0.72, "002": 0.88}, "outlier_frames": ["001"]})
    assert ok["frames_under_threshold"] == ["001"] and ok["reliable"] and ok["trusted_mean_iou"] == pytest.approx(0.895)
    bad = camera_check({"per_frame_iou": {"000": 0.75, "001": 0.72, "002": 0.88}, "outlier_frames": []})
    assert bad["reliable"] is False and bad["frames_under_threshold"] == ["000", "001"]
    assert camera_check({"source": "calibration.json"})["reliable"] is None  # a given calibration without IoUs
    check = check_alignment({"per_frame_iou": {"000": 0.75, "001": 0.72, "002": 0.88}},
                            {0: {"cube": {"silhouette_iou": 0.1, "visible": 1.0, "own_colour": 0.5,
                                          "other_colour": 0.0, "other_object": None}}},
                            {0: {"moved": True, "offset_px": [2.6, 0.4], "drift_px": 0.1, "residual_px": 0.05,
                                 "offset_sd_px": 0.02}})
    msg = unreliable_message(check, "OUT/twin_alignment.json")
    for text in ("the camera: calibration IoU under 0.8 in 2 of 3 frames", "the camera in episode 0: the camera moved "
                 "by 2.6 px", "cube in episode 0: silhouette IoU 0.10", f"(threshold {OBJECT_IOU_MIN})"):
        assert text in msg, msg


def test_an_object_whose_bound_crosses_2cm_is_named_and_one_well_inside_is_not():
    """The position uncertainty decides by itself: the same residual, once with a 95% bound of 2.6 cm (named,
    with the bound and its parts) and once with 0.9 cm (trusted)."""
    base = {"silhouette_iou": 0.7, "visible": 1.0, "own_colour": 0.5, "other_colour": 0.0, "other_object": None}
    unc = {"m_per_px": 0.018, "parts_px": {"camera": 0.1, "fit": 0.1, "floor": 0.4, "motion": 0.05}}
    check = check_alignment({}, {0: {"far": {**base, "uncertainty": {**unc, "bound_95_m": 0.026}},
                                     "near": {**base, "uncertainty": {**unc, "bound_95_m": 0.009}}}})
    assert [u["object"] for u in check["unreliable_objects"]] == ["far"], check["unreliable_objects"]
    msg = unreliable_message(check, "OUT/twin_alignment.json")
    assert "far in episode 0: its position is only known to 2.6 cm (95% bound; threshold 2 cm)" in msg, msg
    assert "near" not in msg and check["objects"]["0"]["near"]["reliable"]


# ----------------------------------------------------------------- the low-contrast cell


def test_low_contrast_table_every_object_within_2cm_or_refused(blue_table, tmp_path):
    """The blue cube on a table of its own hue: the twin's colour cue sees almost nothing there (it
    placed the cube 65-71 cm off, on the table's edge, and said nothing). Now each object is within
    2 cm of the lab's truth or named unreliable; here both cubes are found."""
    from comsim.lab.twin_truth import replay_and_score
    out = replay_and_score(blue_table, TWIN, tmp_path / "paired", mode="kinematic", channels=("seg",), refine=False,
                           calibration=true_calibration(blue_table), **QUIET)
    rep = json.loads((out / "alignment_report.json").read_text())
    assert rep["self_check"]["reliable"], rep["self_check"]["unreliable_objects"]
    for row in rep["episodes"]:
        for name, err in row["object_initial_error_m"].items():
            assert err <= 0.02 or name in row.get("unreliable_objects", {}), (row["episode"], name, err)
        assert row["object_initial_error_m"]["blue_cube"] < 0.03, row  # found, not on the table's edge
    sc = rep["summary"]["self_check_vs_truth"]["object_initial_error_m"]
    assert sc["trusted"] == 4 and sc["trusted_within_2cm"] == 4, sc


def test_refuses_by_name_before_writing_then_marks(default_lab, tmp_path):
    """A twin spec with an object the cell does not have (a yellow cylinder): the self-check names it,
    the replay refuses before any episode is written (the self-check kept in alignment_report.json),
    and with on_unreliable="mark" it replays and marks the episodes in their provenance. The cubes,
    which are there, pass."""
    from comsim.twin.replay import replay_dataset
    spec = with_yellow_can()
    cal, out = true_calibration(default_lab), tmp_path / "paired"
    kw = dict(mode="kinematic", channels=("seg",), refine=False, calibration=cal, **QUIET)
    with pytest.raises(UnreliableTwinError) as e:
        replay_dataset(default_lab, spec, out, **kw)
    msg = str(e.value)
    assert "yellow_can in episode 0" in msg and "yellow_can in episode 1" in msg and "twin_alignment.json" in msg
    assert "red_cube" not in msg and "blue_cube" not in msg, msg
    assert sorted(p.name for p in out.iterdir()) == ["alignment_report.json", "twin_aligned.yaml",
                                                    "twin_alignment.json"]  # no episode, no staging
    report = json.loads((out / "alignment_report.json").read_text())
    assert report["refused"] in msg and not report["self_check"]["reliable"]
    with pytest.raises(UnreliableTwinError):  # a rerun refuses again, from the kept alignment
        replay_dataset(default_lab, spec, out, **kw)
    replay_dataset(default_lab, spec, out, on_unreliable="mark", **kw)
    ds = LeRobotDataset(out)
    assert len(ds) == 2
    for e in range(2):
        marked = ds.read_episode(e, cameras=[]).provenance.extra["twin_unreliable"]
        assert list(marked["objects"]) == ["yellow_can"], marked
    report = json.loads((out / "alignment_report.json").read_text())  # rewritten whole after the replay
    assert "refused" not in report and report["episodes"][0]["unreliable_objects"].keys() == {"yellow_can"}


def test_default_lab_passes_and_its_bytes_do_not_depend_on_the_option(default_lab, tmp_path):
    """No false alarm on the built-in lab; a twin that passes writes the same files either way."""
    from comsim.twin.replay import replay_dataset
    cal = true_calibration(default_lab)
    kw = dict(mode="kinematic", channels=("seg",), refine=False, calibration=cal, **QUIET)
    a = replay_dataset(default_lab, TWIN, tmp_path / "refuse", **kw)
    b = replay_dataset(default_lab, TWIN, tmp_path / "mark", on_unreliable="mark", **kw)
    al = json.loads((a / "twin_alignment.json").read_text())
    assert al["self_check"]["reliable"], al["self_check"]
    ious = [r["silhouette_iou"] for per in al["self_check"]["objects"].values() for r in per.values()]
    assert min(ious) > OBJECT_IOU_MIN, ious
    for e in range(2):
        errs = truth_errors(default_lab, al["objects"][str(e)], e)
        assert max(errs.values()) < 0.015, errs  # the localization the twin's numbers rest on
        assert "twin_unreliable" not in LeRobotDataset(a).read_episode(e, cameras=[]).provenance.extra
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != "alignment_report.json")
    assert [f for f in files if (a / f).read_bytes() != (b / f).read_bytes()] == []


def test_bad_option_is_refused_before_anything_is_written(default_lab, tmp_path):
    from comsim.errors import InputError
    from comsim.twin.replay import replay_dataset
    with pytest.raises(InputError, match="on_unreliable: expected one of"):
        replay_dataset(default_lab, TWIN, tmp_path / "out", on_unreliable="ignore", **QUIET)
    assert not (tmp_path / "out").exists()


def test_a_refused_twin_fails_the_run_stage_with_its_message(default_lab, tmp_path):
    """`comsim run` / `comsim demo`: the twin stage fails with the refusal in stages.json, the stages after it
    are skipped, and the report's twin section shows the self-check."""
    from comsim.pipeline import stages as st
    from comsim.pipeline.run import StageLog
    from comsim.report.run import build_report
    from comsim.run_layout import TRANSLATOR, TWIN as TWIN_STAGE, RunLayout
    import dataclasses

    import yaml
    twin = tmp_path / "twin.yaml"  # the nominal cell with an object the lab does not have
    twin.write_text(yaml.safe_dump(dataclasses.asdict(with_yellow_can())))
    run = RunLayout(tmp_path / "run")
    log = StageLog(run, log=lambda *a: None)
    log.step(TWIN_STAGE, lambda: st.align_twin(default_lab, twin, run.paired, run.twin_summary, workers=1,
                                               calibration=true_calibration(default_lab)))
    log.step(TRANSLATOR, lambda: None, needs=[TWIN_STAGE])
    log.write()
    failures = json.loads(run.stages.read_text())["failures"]
    twin_failure = failures[TWIN_STAGE]
    assert twin_failure.startswith("UnreliableTwinError: ") and "yellow_can in episode 0" in twin_failure
    assert failures[TRANSLATOR] == f"skipped: needs {TWIN_STAGE}"
    page = build_report(run.root).read_text()
    twin_html = page[page.index("<h2>Twin alignment</h2>"):]
    for text in ("Self-check", "The replay refused", "yellow_can silhouette IoU", "UNRELIABLE"):
        assert text in twin_html, text


def test_cli_flag(default_lab, tmp_path, capsys):
    from comsim.cli import main
    with pytest.raises(SystemExit):
        main(["twin", "replay", "--real", str(default_lab), "--twin", str(TWIN), "--out", str(tmp_path / "o"),
              "--on-unreliable", "ignore"])
    assert "invalid choice: 'ignore'" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_demo_flag_reaches_the_twin_stage(tmp_path, monkeypatch, capsys):
    """`comsim demo --on-unreliable mark` hands "mark" to the twin stage (default: "refuse"). The stages
    around it are replaced by stand-ins that finish at once (the lab recording, and the policy experiment
    that needs only it); the twin stage's entry point records what it was asked and fails, so the
    translator and later stages are skipped."""
    import comsim.pipeline.demo as demo
    import comsim.pipeline.stages as stages
    from comsim.cli import main

    asked = []

    def twin_stage(real, twin, paired, summary_path, workers=2, calibration=None, on_unreliable="refuse"):
        asked.append(on_unreliable)
        raise UnreliableTwinError("stand-in: the twin stage was reached")

    monkeypatch.setattr(stages, "record_lab", lambda *a, **k: Path(a[0]))
    monkeypatch.setattr(stages, "align_twin", twin_stage)
    monkeypatch.setattr(demo, "_policy", lambda p, run: {})
    for flag, expected in (([], "refuse"), (["--on-unreliable", "mark"], "mark")):
        assert main(["demo", "--out", str(tmp_path / expected), *flag]) != 0
        assert "UnreliableTwinError: stand-in" in capsys.readouterr().err
        assert asked[-1] == expected
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "x"), "--on-unreliable", "ignore"])
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------- as a user runs it


@pytest.mark.slow
def test_low_contrast_table_calibrated_from_its_stills(tmp_path):
    """The blue-grey table with the camera calibrated from 12 stills and the physics replay with the
    whole-video refinement: each object within 2 cm of the truth or refused by name."""
    from comsim.lab.twin_truth import replay_and_score
    real = record(tmp_path / "lab", COOL, BLUE_TABLE, episodes=4, stills=12)
    try:
        out = replay_and_score(real, TWIN, tmp_path / "paired", mode="physics", on_unreliable="refuse", **QUIET)
    except UnreliableTwinError as e:  # refused by name: allowed, and then it says so
        assert "in episode" in str(e)
        return
    rep = json.loads((out / "alignment_report.json").read_text())
    for key in ("object_initial_error_m", "object_initial_error_m_refined"):
        sc = rep["summary"]["self_check_vs_truth"][key]
        assert sc["trusted"] == 8 and sc["trusted_max_m"] <= 0.02, sc  # measured: 1.9 cm max, 1.2 cm camera error
