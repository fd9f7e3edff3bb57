"""`comsim report RUN_DIR`: the page is built from a small real run folder (LeRobot datasets
whose mp4s come from comsim.io.video.write_video, overlay PNGs from the twin's own writer,
a validation grid PNG, rollout mp4s, and the JSON that each stage writes), then opened from
file:// in headless Chromium: a screenshot must show the videos, and the DOM must hold the
tables and report that every video and image decoded and that no plot's text is clipped."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from comsim.cli import main as cli_main
from comsim.episode import Episode, Provenance
from comsim.io.lerobot import write_dataset
from comsim.io.video import write_video
from comsim.report import Report
from comsim.report.run import build_report
from comsim.run_layout import CONVERT, FACTORY
from comsim.twin.overlay import write_overlay

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MAGENTA = (255, 0, 255)  # the sim clips' square: a colour the page itself never uses
H = W = 48
T = 8
ROLLOUT_HW = (48, 64)  # rollout videos: a size no other video of the page has
STILLS = [f"{i:06d}" for i in range(12)]
OUTLIERS = ["000004", "000009"]


def _frames(seed: int, square=None, hw=(H, W)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = np.empty((T, *hw, 3), np.uint8)
    f[:] = rng.integers(40, 200, size=3, dtype=np.uint8)
    for t in range(T):  # a moving square so the clip is not a still
        x = 4 + 3 * t
        f[t, 12:36, x:x + 20] = square if square is not None else rng.integers(0, 255, size=3, dtype=np.uint8)
    return f


def _episode(frames: dict[str, np.ndarray], source: str) -> Episode:
    return Episode(frames=frames, action=np.zeros((T, 8), np.float32), state=np.zeros((T, 8), np.float32),
                   fps=10, task="push", success=True, provenance=Provenance(source=source, task="push"))


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


# -- the stages' outputs -------------------------------------------------------------------------
def _twin(run: Path, truth: bool = True, report: bool = True) -> None:
    """What `comsim twin replay` leaves: twin_alignment.json, alignment_report.json, overlays."""
    paired = run / "paired"
    iou = {n: (0.62 if n == "000004" else 0.71 if n == "000009" else 0.93 + 0.004 * i) for i, n in enumerate(STILLS)}
    calib = {"source": str(run / "lab" / "calibration"), "mean_iou": float(np.mean(list(iou.values()))),
             "converged": True, "per_frame_iou": iou, "outlier_frames": OUTLIERS, "rounds": [],
             "mask_source": "difference to the background still", "seconds": 83.4}
    T_cam = np.eye(4)
    T_cam[:3, 3] = [0.0, 0.0, 1.5]  # camera 1.5 m behind the base along -z, looking along +z
    _write_json(paired / "twin_alignment.json", {
        "real": str(run / "lab"), "camera": "front", "width": W, "height": H, "K": [60.0, 60.0, 24.0, 24.0],
        "dist": None, "T_cam_from_base": T_cam.tolist(), "calibration": calib,
        "colors": {"residual": {"table": 4.2, "cube": 7.9}}})
    if not report:
        return
    eps = [{"episode": e, "real_episode": e, "robot_iou_vs_derived_masks": 0.88 + 0.02 * e} for e in range(2)]
    summary = {"mean_robot_iou_vs_derived_masks": 0.89}
    if truth:
        for e, r in enumerate(eps):
            r.update({"robot_iou_vs_true_masks": 0.9 + 0.01 * e, "object_initial_error_m": {"cube": 0.012},
                      "object_initial_error_m_refined": {"cube": 0.004},
                      "object_trajectory_error_m_mean": {"cube": 0.006 + 0.02 * e},
                      "object_trajectory_error_m_max": {"cube": 0.011 + 0.03 * e}})
        summary.update({"camera_position_error_m": 0.0042, "camera_rotation_error_deg": 0.31,
                        "mean_robot_iou_vs_true_masks": 0.905, "object_initial_error_m_mean": 0.012,
                        "object_initial_error_m_max": 0.012, "object_trajectory_error_m_mean": 0.016,
                        "object_trajectory_error_m_max": 0.041, "episodes_within_2cm": 1,
                        "object_initial_error_m_mean_refined": 0.004, "object_initial_error_m_max_refined": 0.004,
                        "object_yaw_error_deg_mean_first_frame": 12.0, "object_yaw_error_deg_mean_refined": 3.5})
    _write_json(paired / "alignment_report.json", {"paired": str(paired), "real": str(run / "lab"),
                                                   "camera": "front", "calibration": calib, "episodes": eps,
                                                   "summary": summary})
    yy, xx = np.mgrid[:H, :W]
    for e in range(2):  # the twin's own overlay writer: silhouette outline (green), true mask (magenta)
        frame = _frames(50 + e)[0]
        write_overlay(paired / "report" / f"episode{e:04d}_frame0000.png", frame, (xx - 20) ** 2 + (yy - 24) ** 2 < 90,
                      (xx - 21) ** 2 + (yy - 24) ** 2 < 90 if truth else None, f"ep {e} frame 0")
    sy, sx = np.mgrid[:96, :96]  # calibration stills: full resolution (2x the videos)
    for i, n in enumerate(STILLS):  # as `comsim twin calibrate STILLS --out RUN/twin/calibration` writes them
        still = np.full((96, 96, 3), 90 + 10 * i, np.uint8)
        write_overlay(run / "twin" / "calibration" / "overlays" / f"{n}.png", still,
                      (sx - 40 - i) ** 2 + (sy - 48) ** 2 < 300, (sx - 41) ** 2 + (sy - 48) ** 2 < 300,
                      f"{n} IoU {iou[n]:.3f}")


def _translator(run: Path, steps_done: int = 600, planned: int = 600, validation: bool = True,
                psnr_sim: float = 21.5) -> None:
    out = run / "translator"
    rng = np.random.default_rng(0)
    loss = [[s, float(0.5 * np.exp(-s / 150) + 0.02 + 0.01 * rng.random())] for s in range(1, steps_done + 1)]
    val = []
    if validation:
        for step in range(200, steps_done + 1, 200):
            grid = np.zeros((6 * 32, 4 * 32, 3), np.uint8)  # 2 clips x (sim | pseudo-real | real), 4 frames
            for r in range(6):
                grid[r * 32:(r + 1) * 32] = (60 + 30 * r, 140, 200 - 20 * r)
            rel = f"validation/step-{step:06d}.png"
            (out / "validation").mkdir(parents=True, exist_ok=True)
            Image.fromarray(grid).save(out / rel)
            val.append({"step": step, "psnr": 20.0 + step / 100, "psnr_sim": psnr_sim, "grid": rel})
    _write_json(out / "train_summary.json", {
        "steps_planned": planned, "steps_done": steps_done, "stopped_early": steps_done < planned,
        "stop_reason": "max_minutes 9.0 reached" if steps_done < planned else None, "loss": loss,
        "sampling": {"num_steps": 8, "w_action": 1.0, "w_sim": 1.5}, "resolution": [32, 32], "validation": val})
    _write_json(out / "translator_config.json", {"train": {"validation_steps": 200 if validation else 100000}})
    if steps_done == planned:
        _write_json(out / "final" / "translator.json", {"sampling": {"num_steps": 8, "w_action": 1.0, "w_sim": 1.5}})


def _trials(n: int, successes: set[int], videos: dict[int, str] | None) -> list[dict]:
    out = []
    for i in range(n):
        start, final = [0.5 + 0.01 * i, -0.1 + 0.02 * i], [0.62 + 0.005 * i, -0.08 + 0.02 * i]
        out.append({"trial": i, "seed": 1000 + i, "success": i in successes, "start_xy": start,
                    "final_xy": final, "target_xy": [0.65, -0.05 + 0.02 * i], "final_distance": 0.03,
                    "video": (videos or {}).get(i)})
    return out


def _policy(run: Path) -> None:
    exp = run / "policy"
    arms = [{"name": "real10", "status": "done", "label": "10 real", "synthetic_fraction_requested": 0.0,
             "dir": "/elsewhere/runs/demo/policy/arms/real10-1a2b3c4d",  # recorded before the run folder moved
             "train": {"steps": 300, "final_loss": 0.0412, "step_time_s": 0.52, "wall_s": 156.0},
             "panels": {"id": {"success_rate": 0.3, "ci95": [0.11, 0.6], "successes": 3, "n_trials": 10,
                               "wall_s": 44.7},
                        "ood": {"success_rate": 0.1, "ci95": [0.02, 0.4], "successes": 1, "n_trials": 10,
                                "wall_s": 51.2}}},
            {"name": "real10_pseudo", "status": "done", "label": "10 real + pseudo-real",
             "synthetic_fraction_requested": 0.5, "dir": str(exp / "arms" / "real10_pseudo-5e6f7a8b"),
             "train": {"steps": 300, "final_loss": 0.0388, "step_time_s": 0.55, "wall_s": 165.0},
             "panels": {"id": {"success_rate": 0.6, "ci95": [0.31, 0.83], "successes": 6, "n_trials": 10,
                               "wall_s": 40.1},
                        "ood": {"success_rate": 0.4, "ci95": [0.17, 0.69], "successes": 4, "n_trials": 10,
                                "wall_s": 47.0}}}]
    a1, a2 = exp / "arms" / "real10-1a2b3c4d", exp / "arms" / "real10_pseudo-5e6f7a8b"
    for name, seed in (("id_trial000", 1), ("id_trial001", 2), ("ood_trial000", 3)):
        write_video(a1 / "videos" / f"{name}.mp4", _frames(seed, (0, 255, 255), ROLLOUT_HW), fps=10)
    _write_json(a1 / "eval-id-00000000.json", {"panel": "id", "wall_s": 3.0, "trials": []})  # an older eval config
    _write_json(a1 / "eval-id-9f8e7d6c.json", {
        "panel": "id", "n_trials": 10, "successes": 3, "wall_s": 44.7,
        "trials": _trials(10, {1, 4, 7}, {0: "videos/id_trial000.mp4", 1: "videos/id_trial001.mp4"})})
    _write_json(a1 / "eval-ood-9f8e7d6c.json", {"panel": "ood", "n_trials": 10, "successes": 1, "wall_s": 51.2,
                                                "trials": _trials(10, {5}, {0: "videos/ood_trial000.mp4"})})
    _write_json(a2 / "eval-id-9f8e7d6c.json", {"panel": "id", "n_trials": 10, "successes": 6, "wall_s": 40.1,
                                                "trials": _trials(10, {0, 1, 2, 3, 4, 5}, None)})
    _write_json(a2 / "eval-ood-9f8e7d6c.json", {"panel": "ood", "n_trials": 10, "successes": 4, "wall_s": 47.0})
    rows = [{"arm": "10 real", "synthetic fraction (asked / drawn)": "0 / 0.000",
             "id success [95% CI]": "30% [11, 60] (3/10)", "ood success [95% CI]": "10% [2, 40] (1/10)"},
            {"arm": "10 real + pseudo-real", "synthetic fraction (asked / drawn)": "0.5 / 0.498",
             "id success [95% CI]": "60% [31, 83] (6/10)", "ood success [95% CI]": "40% [17, 69] (4/10)"}]
    _write_json(exp / "results.json", {
        "experiment": "demo", "task": "push", "arms": arms,
        "config": {"eval": {"panels": {"id": {}, "ood": {}}, "n_trials": 10}, "train": {"steps": 300, "batch_size": 32},
                   "gap": {"baseline": "real10", "oracle": "real200"}},
        "gap_closed": {"real10": {"id": 0.0, "ood": 0.0}, "real10_pseudo": {"id": 0.5, "ood": None}},
        "sweep": [], "sweep_points": ["real10_pseudo"],  # a main arm with the sweep's mixture is one of its points
        "curve": [{"arm": "real10", "real_episodes": 10, "id": {"success_rate": 0.3, "ci95": [0.11, 0.6]},
                   "ood": {"success_rate": 0.1, "ci95": [0.02, 0.4]}},
                  {"arm": "real200", "real_episodes": 200, "id": {"success_rate": 0.9, "ci95": [0.6, 0.98]},
                   "ood": {"success_rate": 0.6, "ci95": [0.31, 0.83]}}],
        "claim": {"arm": "real10_pseudo", "beats": ["real10"], "panels": ["id", "ood"], "holds": False,
                  "checks": [], "rule": "lower end above upper end"}, "rows": rows})


def _robot_region() -> dict:
    """metrics.json's robot_region as the video-metrics stage writes it: a blurred arm and the real frames."""
    from comsim.metrics.evaluate import to_json_safe
    from comsim.metrics.robot_region import pool_robot_region, robot_region_scores

    real = _frames(3, MAGENTA)
    mask = np.all(real == MAGENTA, axis=-1)
    blurred = np.clip(real.astype(int) // 2 + 40, 0, 255).astype(np.uint8)
    return {"translator": to_json_safe(pool_robot_region([robot_region_scores(blurred, real, mask)])),
            "real": to_json_safe(pool_robot_region([robot_region_scores(real, real, mask)])),
            "mask_source": "lab truth (x/lab)"}


def _run_dir(root: Path) -> Path:
    run = root / "run"
    held = run / "heldout_pseudo_real"
    for name, source, square in (("sim_only", "sim", MAGENTA), ("pseudo", "pseudo_real", None), ("real", "lab", None)):
        write_dataset(held / name, [_episode({"front": _frames(10 * i + len(name), square)}, source)
                                    for i in range(2)], fps=10)
    write_dataset(run / "pseudo_real", [_episode({"front": _frames(7), "front_sim": _frames(8, MAGENTA)},
                                                 "pseudo_real")], fps=10)
    _write_json(run / "pseudo_real" / "conversion.json", {
        "model": "/x/translator/final", "translator_hash": "0123456789abcdef", "input": "/x/sim", "input_episodes": 1,
        "w_action": 1.0, "w_sim": 1.5, "num_steps": 8, "strength": 1.0, "seed": 0, "threads": 1})
    _twin(run)
    _translator(run)
    metrics = {name: {"pred": "p", "ref": "r", "episodes": 2, "frames": 16,
                      "metrics": {"psnr": psnr, "ssim": ssim, "fid": fid, "fid_samples": {"pred": 16, "ref": 16}},
                      "unavailable": {"fvd": "no I3D weights given"}}
               for name, psnr, ssim, fid in (("pseudo_real_vs_real", 24.5, 0.81, 61.0),
                                             ("raw_sim_vs_real", 14.2, 0.42, 190.5))}
    metrics["object_fidelity"] = {"factory_pseudo_real_ood": {"episodes": 6, "object_frames": 1386,
                                                              "object_within": 0.543, "robot_iou": 0.71,
                                                              "object_error_px_median_of_episodes": 1.88,
                                                              "objects": {"2": {"frames": 700, "within": 0.61},
                                                                          "3": {"frames": 686, "within": 0.475}}}}
    metrics["robot_region"] = _robot_region()
    _write_json(run / "metrics.json", metrics)
    (run / "paired" / "twin_aligned.yaml").write_text("objects:\n- {name: red_cube}\n- {name: blue_cube}\n")
    _policy(run)
    _write_json(run / "stages.json", {"timings": {"convert": 44.7, "twin calibrate + replay": 125.0},
                                      "failures": {"factory generate": "RuntimeError: IK failed"}})
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    return build_report(_run_dir(tmp_path_factory.mktemp("report")))


def _section(page: str, heading: str) -> str:
    start = page.index(f"<h2>{heading}</h2>")
    end = page.find("<h2>", start + 1)
    return page[start:end if end > 0 else None]


def test_report_page_from_a_run_dir(report):
    page = report.read_text()
    assert report.name == "report.html"
    srcs = re.findall(r"<video src='([^']+)'", page)
    assert len(srcs) == 2 * 3 + 2 + 3  # held-out: sim | pseudo-real | real; factory: sim | pseudo-real; 3 rollouts
    imgs = re.findall(r"<img class='media' src='([^']+)'", page)
    assert len(imgs) == 4 + 2 + 1  # calibration overlays, episode overlays, the latest validation grid
    for s in srcs + imgs:  # everything lies in the report's media folder, linked relatively
        assert s.startswith("report_media/") and (report.parent / s).is_file(), s
    assert "not available" in page  # the factory episode has no real counterpart
    assert "<td>factory_pseudo_real_ood</td>" in page and "<td>54%</td>" in page  # object fidelity table
    assert "<th>red_cube within 2 px</th>" in page and "<td>61%</td>" in page and "<td>48%</td>" in page
    region = page[page.index("the robot region on the held-out frames"):]
    region = region[:region.index("</table>")]
    for text in ("lab truth (x/lab)", "<th>PSNR still</th>", "<th>sharpness</th>", "<th>seam near robot</th>",
                 "<td>inf (identical)</td>", "<td>translator</td>"):
        assert text in region, text
    for text in ("Failed or skipped stages", "IK failed", "pseudo_real_vs_real", "24.5", "n/a: no I3D",
                 "30% [11, 60] (3/10)", "40% [17, 69] (4/10)", "does not hold", "<svg"):
        assert text in page, text
    stages = page[page.index("class='stages'"):page.index("</table>", page.index("class='stages'"))]
    rows = dict(re.findall(r"<tr><td>([^<]+)</td><td>[^<]*</td><td[^>]*>([^<]+)</td>", stages))
    assert rows == {"lab record": "not run", "twin calibrate + replay": "not run",
                    "translator training": "done (600 of 600 steps)",
                    "factory generate": "failed: RuntimeError: IK failed", "convert": "done (1 episode)",
                    "video metrics": "done", "mix": "not run", "policy experiment": "done"}, rows
    assert "44.7 s" in stages and "2 min 5 s" in stages and "44.700" not in page  # times for people

    twin = _section(page, "Twin alignment")
    assert "Calibration IoU per frame (12 frames, 2 outliers)" in twin
    assert twin.count("r='4' fill='#c44e52'") == 2  # the two outlier frames are marked
    for text in ("000004", "0.62", "0.000, 0.000, -1.500", "4.2 mm", "0.31 deg", "0.4 cm / 0.4 cm",
                 "1 of 2", "cube 2.6 cm", "table 4.2", "(outlier)", "true robot mask in magenta"):
        assert text in twin, text
    assert "no truth available" not in twin
    translator = _section(page, "Translator training")
    for text in ("Trained all 600 planned steps", "600 / 600", "32x32", "Training loss", "running mean of 30",
                 "Validation PSNR", "raw sim vs real", "Validation at step 600: PSNR 26.0 dB (raw sim 21.5 dB)",
                 "native 128x192 px"):
        assert text in translator, text
    assert "Stopped early" not in translator and "does not yet improve" not in translator
    convert = _section(page, "Convert")
    assert "0.18" in convert and "convert records no timing of its own" in convert  # 8 frames / 44.7 s
    assert ">1.5<" in convert and ">8<" in convert and "0123456789abcdef" in convert
    policy = _section(page, "Policy experiment")
    assert policy.count("aria-label='id:") + policy.count("aria-label='ood:") == 3  # top views with positions
    for text in ("no per-trial list in this eval file", "no video of a successful trial recorded",
                 "id: successful rollout: trial 1, seed 1001", "id: failed rollout: trial 0, seed 1000",
                 "ood: failed rollout: trial 0", "2 min 36 s", "ends 3.0 cm from the target",
                 "Oracle curve: success vs real demonstrations", "Gap closed = (arm - real10) / (real200 - real10)",
                 "Synthetic-fraction sweep", "Size: 300 training steps of batch 32 per arm, 10 trials per panel (demo)"):
        assert text in policy, text

    # rebuilding replaces the page atomically and drops media it no longer uses
    media = report.parent / "report_media"
    for stale in ("clip_9999.mp4", "img_9999.png", "vid_9999.mp4"):
        (media / stale).write_bytes(b"x")
    (media / "notes.txt").write_text("a user's file")  # not the report's: kept
    assert build_report(report.parent, max_episodes=1) == report
    assert not any((media / s).exists() for s in ("clip_9999.mp4", "img_9999.png", "vid_9999.mp4"))
    assert (media / "notes.txt").is_file()
    assert len(list(media.glob("clip_*.mp4"))) == 3 + 2 and len(list(media.glob("vid_*.mp4"))) == 3
    assert not list(report.parent.glob(".report.html.tmp*"))
    build_report(report.parent)  # back to the full page for the browser test


def test_report_missing_parts_and_missing_dir(tmp_path, capsys):
    run = tmp_path / "empty_run"
    run.mkdir()
    page = build_report(run).read_text()
    assert page.count("not run") >= 7 + 6  # every stage, plus videos, twin, translator, convert, metrics, policy
    assert "<video" not in page and "<img" not in page
    with pytest.raises(FileNotFoundError, match="run folder not found"):
        build_report(tmp_path / "nope")
    assert cli_main(["report", str(tmp_path / "nope")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    assert cli_main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str((run / "report.html").resolve())


def test_report_names_the_stages_a_profile_leaves_out(tmp_path):
    """`comsim demo --profile lab_table` makes no demo-scale factory episodes: the stage table and the
    convert section say so, instead of "not run"."""
    run = tmp_path / "run"
    run.mkdir()
    why = "the policy experiment generates and converts its own sim episodes (under policy/data/)"
    _write_json(run / "stages.json", {"profile": "lab_table", "timings": {}, "failures": {},
                                      "left_out": {FACTORY: why, CONVERT: why}})
    page = html.unescape(build_report(run).read_text())
    stages = _section(page, "Stages")
    assert stages.count("not in this profile: " + why) == 2
    assert "not in this profile: " + why in _section(page, "Convert")
    assert "no pseudo_real/" not in _section(page, "Convert")


def test_report_says_why_a_part_is_missing(tmp_path):
    """A real cell (no truth), a replay without its report, a translator stopped by its time
    cap, a conversion without its header, older eval files: each part says what is missing."""
    run = tmp_path / "run"
    _twin(run, report=False)
    _translator(run, steps_done=300, planned=900, validation=False)
    write_dataset(run / "pseudo_real", [_episode({"front": _frames(7), "front_sim": _frames(8)}, "pseudo_real")],
                  fps=10)
    _policy(run)
    shutil.rmtree(run / "policy" / "arms" / "real10_pseudo-5e6f7a8b")
    (run / "policy" / "arms" / "real10-1a2b3c4d" / "eval-ood-9f8e7d6c.json").write_text("{not json")
    page = build_report(run).read_text()
    twin = _section(page, "Twin alignment")
    for text in ("alignment report not written", "without --no-report", "episode overlays not written",
                 "calibration overlays not written", "errors against the truth not computed"):
        assert text in twin, text
    translator = _section(page, "Translator training")
    assert "<p class='warn'>Stopped early at step 300 of 900: max_minutes 9.0 reached." in translator
    assert "no validation samples: train.validation_steps is 100000, more than the 300 steps done" in translator
    assert "stopped early at step 300 of 900: max_minutes 9.0 reached" in _section(page, "Stages")
    convert = _section(page, "Convert")
    assert "guidance not recorded" in convert and "frames/s not recorded" in convert
    policy = _section(page, "Policy experiment")
    assert "arm folder " + str(run / "policy" / "arms" / "real10_pseudo-5e6f7a8b") + " not found" in policy
    assert "eval-ood-9f8e7d6c.json: not valid JSON" in policy  # in its place; the id panel still shows
    assert "id: successful rollout: trial 1" in policy
    assert "<img" not in page

    _twin(run, truth=False)  # now a real cell's replay with its report: no truth to score against
    _translator(run, validation=True, psnr_sim=30.0)  # and a translator that loses to the raw sim
    page = build_report(run).read_text()
    assert ("does not yet improve on the twin's render" in html.unescape(_section(page, "Translator training"))
            and "26.0 dB vs 30.0 dB" in page)
    twin = _section(page, "Twin alignment")
    assert "no truth available" in twin and "lab_truth.json" in twin
    assert "position error vs truth" not in twin and "true robot mask" not in twin
    assert "episode overlays not written" not in twin


def test_report_survives_malformed_inputs(report, tmp_path):
    """Broken JSON in one part costs that part only: it says what broke, the rest still shows."""
    run = Path(shutil.copytree(report.parent, tmp_path / "run"))
    (run / "stages.json").write_text('"not an object"')
    (run / "paired" / "alignment_report.json").write_text("{broken")
    (run / "translator" / "train_summary.json").write_text("[1, 2]")
    page = build_report(run).read_text()
    assert "stage log unreadable" in page and "expected a JSON object" in page
    assert "alignment_report.json: not valid JSON" in _section(page, "Twin alignment")
    assert "train_summary.json: expected a JSON object" in _section(page, "Translator training")
    assert "60% [31, 83] (6/10)" in _section(page, "Policy experiment")


def _chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        # Without the background-networking flags Chromium's connections are refused many at a time here.
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--mute-audio", f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _dom_status(page: Path) -> tuple[dict, str]:
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body)), dom.stdout


needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} not found: `bash scripts/setup_system.sh` (run by `make setup`) installs it")


@needs_chromium
def test_report_renders_in_headless_chromium(report, tmp_path):
    attrs, dom = _dom_status(report)
    assert attrs.get("videos") == "11", attrs
    assert attrs.get("videos-failed") == "0" and attrs.get("videos-loaded") == "11", attrs  # H.264 decoded
    assert len(re.findall(r'<video [^>]*data-state="loaded 48x48"', dom)) == 8
    assert len(re.findall(r'<video [^>]*data-state="loaded 64x48"', dom)) == 3  # the rollouts
    assert attrs.get("images") == "7" and attrs.get("images-loaded") == "7", attrs  # overlays, validation grid
    assert attrs.get("images-failed") == "0", attrs
    assert 'data-state="loaded 128x192"' in dom  # the validation grid at its native size
    # Every plot's text lies inside its SVG (the success-rate title was cut off once).
    assert int(attrs.get("svg-texts", 0)) > 50, attrs  # they were measured
    assert attrs.get("svg-clipped") == "", attrs["svg-clipped"]
    assert dom.count("<table") >= 12 and dom.count("<svg") >= 8
    assert "60% [31, 83] (6/10)" in dom

    shot = tmp_path / "shot.png"
    r = _chromium("--virtual-time-budget=5000", "--window-size=1200,1400", "--hide-scrollbars",
                  f"--screenshot={shot}", report.resolve().as_uri())
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(np.int16)
    assert img.shape[:2] == (1400, 1200)
    assert img.std() > 20, "the screenshot is (nearly) blank"
    # The sim clips' magenta square is on screen: the browser painted decoded video frames.
    magenta = (img[..., 0] > 200) & (img[..., 1] < 80) & (img[..., 2] > 200)
    assert magenta.sum() > 500, f"no video frames painted ({magenta.sum()} magenta pixels)"


@needs_chromium
def test_page_check_catches_clipped_text_and_broken_media(tmp_path):
    """The page's own check is what the browser test relies on: it must see a cut-off label,
    an image that does not decode and a video that does not decode."""
    rep = Report(tmp_path, page="p.html")
    rep.raw("<svg class='plot' xmlns='http://www.w3.org/2000/svg' width='60' height='30'>"
            "<text x='4' y='14' font-size='12'>Policy success rate (95% interval)</text>"
            "<text x='4' y='26' font-size='10'>ok</text></svg>")
    (tmp_path / "media" / "broken.png").write_bytes(b"not a png")
    (tmp_path / "media" / "broken.mp4").write_bytes(b"not an mp4")
    rep.raw("<img src='media/broken.png'><video src='media/broken.mp4' muted></video>")
    attrs, _ = _dom_status(rep.write())
    assert attrs.get("svg-texts") == "2"
    assert "Policy success rate" in attrs.get("svg-clipped", "") and '"ok"' not in attrs["svg-clipped"], attrs
    assert attrs.get("images-failed") == "1" and attrs.get("videos-failed") == "1", attrs
