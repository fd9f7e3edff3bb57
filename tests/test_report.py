"""`comsim report RUN_DIR`: the page is built from a small real run folder (LeRobot datasets
whose mp4s come from comsim.io.video.write_video, and the JSON that the metrics and policy
stages write), then opened from file:// in headless Chromium: a screenshot must show the
videos, and the DOM must hold the tables and report that every video decoded."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from comsim.cli import main as cli_main
from comsim.episode import Episode, Provenance
from comsim.io.lerobot import write_dataset
from comsim.report.run import build_report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MAGENTA = (255, 0, 255)  # the sim clips' square: a colour the page itself never uses
H = W = 48
T = 8


def _frames(seed: int, square=None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = np.empty((T, H, W, 3), np.uint8)
    f[:] = rng.integers(40, 200, size=3, dtype=np.uint8)
    for t in range(T):  # a moving square so the clip is not a still
        x = 4 + 3 * t
        f[t, 12:36, x:x + 20] = square if square is not None else rng.integers(0, 255, size=3, dtype=np.uint8)
    return f


def _episode(frames: dict[str, np.ndarray], source: str) -> Episode:
    return Episode(frames=frames, action=np.zeros((T, 8), np.float32), state=np.zeros((T, 8), np.float32),
                   fps=10, task="push", success=True, provenance=Provenance(source=source, task="push"))


def _run_dir(root: Path) -> Path:
    run = root / "run"
    held = run / "heldout_pseudo_real"
    for name, source, square in (("sim_only", "sim", MAGENTA), ("pseudo", "pseudo_real", None), ("real", "lab", None)):
        write_dataset(held / name, [_episode({"front": _frames(10 * i + len(name), square)}, source)
                                    for i in range(2)], fps=10)
    write_dataset(run / "pseudo_real", [_episode({"front": _frames(7), "front_sim": _frames(8, MAGENTA)},
                                                 "pseudo_real")], fps=10)
    (run / "twin").mkdir()
    (run / "twin" / "summary.json").write_text(json.dumps({"mean_iou": 0.91, "episodes": 2, "per_episode": [1, 2]}))
    (run / "translator" / "final").mkdir(parents=True)
    (run / "translator" / "final" / "translator.json").write_text("{}")
    metrics = {name: {"pred": "p", "ref": "r", "episodes": 2, "frames": 16,
                      "metrics": {"psnr": psnr, "ssim": ssim, "fid": fid, "fid_samples": {"pred": 16, "ref": 16}},
                      "unavailable": {"fvd": "no I3D weights given"}}
               for name, psnr, ssim, fid in (("pseudo_real_vs_real", 24.5, 0.81, 61.0),
                                             ("raw_sim_vs_real", 14.2, 0.42, 190.5))}
    (run / "metrics.json").write_text(json.dumps(metrics))
    arms = [{"name": "real10", "status": "done", "label": "10 real", "synthetic_fraction_requested": 0.0,
             "panels": {"id": {"success_rate": 0.3, "ci95": [0.11, 0.6], "successes": 3, "n_trials": 10},
                        "ood": {"success_rate": 0.1, "ci95": [0.02, 0.4], "successes": 1, "n_trials": 10}}},
            {"name": "real10_pseudo", "status": "done", "label": "10 real + pseudo-real",
             "synthetic_fraction_requested": 0.5,
             "panels": {"id": {"success_rate": 0.6, "ci95": [0.31, 0.83], "successes": 6, "n_trials": 10},
                        "ood": {"success_rate": 0.4, "ci95": [0.17, 0.69], "successes": 4, "n_trials": 10}}}]
    rows = [{"arm": "10 real", "synthetic fraction (asked / drawn)": "0 / 0.000",
             "id success [95% CI]": "30% [11, 60] (3/10)", "ood success [95% CI]": "10% [2, 40] (1/10)"},
            {"arm": "10 real + pseudo-real", "synthetic fraction (asked / drawn)": "0.5 / 0.498",
             "id success [95% CI]": "60% [31, 83] (6/10)", "ood success [95% CI]": "40% [17, 69] (4/10)"}]
    (run / "policy").mkdir()
    (run / "policy" / "results.json").write_text(json.dumps({
        "experiment": "demo", "task": "push", "config": {"eval": {"panels": {"id": {}, "ood": {}}}}, "arms": arms,
        "claim": {"arm": "real10_pseudo", "beats": ["real10"], "panels": ["id", "ood"], "holds": False,
                  "checks": [], "rule": "lower end above upper end"}, "rows": rows}))
    (run / "stages.json").write_text(json.dumps({"timings": {"convert": 1.5},
                                                 "failures": {"factory generate": "RuntimeError: IK failed"}}))
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    return build_report(_run_dir(tmp_path_factory.mktemp("report")))


def test_report_page_from_a_run_dir(report):
    page = report.read_text()
    assert report.name == "report.html"
    srcs = re.findall(r"<video src='([^']+)'", page)
    assert len(srcs) == 2 * 3 + 2  # held-out: sim | pseudo-real | real; factory: sim | pseudo-real
    for s in srcs:
        assert not os.path.isabs(s) and (report.parent / s).is_file()
    assert "not available" in page  # the factory episode has no real counterpart
    for text in ("Failed or skipped stages", "IK failed", "pseudo_real_vs_real", "24.500", "n/a: no I3D",
                 "30% [11, 60] (3/10)", "40% [17, 69] (4/10)", "does not hold", "<svg", "mean_iou"):
        assert text in page, text
    stages = page[page.index("class='stages'"):page.index("</table>", page.index("class='stages'"))]
    rows = dict(re.findall(r"<tr><td>([^<]+)</td><td>[^<]*</td><td[^>]*>([^<]+)</td>", stages))
    assert rows == {"lab record": "not run", "twin calibrate + replay": "not run", "translator training": "done",
                    "factory generate": "failed: RuntimeError: IK failed", "convert": "done (1 episodes)",
                    "video metrics": "done", "policy experiment": "done"}, rows
    # rebuilding replaces the page atomically and drops clips it no longer uses
    stale = report.parent / "report_media" / "clip_9999.mp4"
    stale.write_bytes(b"x")
    assert build_report(report.parent, max_episodes=1) == report
    assert not stale.exists() and len(list((report.parent / "report_media").glob("clip_*.mp4"))) == 3 + 2
    assert not list(report.parent.glob(".report.html.tmp*"))
    build_report(report.parent)  # back to the full page for the browser test


def test_report_missing_parts_and_missing_dir(tmp_path, capsys):
    run = tmp_path / "empty_run"
    run.mkdir()
    page = build_report(run).read_text()
    assert page.count("not run") >= 7 + 4  # every stage, plus videos, metrics, policy and twin sections
    assert "<video" not in page
    with pytest.raises(FileNotFoundError, match="run folder not found"):
        build_report(tmp_path / "nope")
    assert cli_main(["report", str(tmp_path / "nope")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    assert cli_main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str((run / "report.html").resolve())


def _chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        # Without the background-networking flags Chromium's connections are refused many at a time here.
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--mute-audio", f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                    reason=f"{CHROMIUM} not found: `bash scripts/setup_system.sh` (run by `make setup`) installs it")
def test_report_renders_in_headless_chromium(report, tmp_path):
    from PIL import Image

    url = report.resolve().as_uri()
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))
    assert attrs.get("videos") == "8", attrs
    assert attrs.get("videos-failed") == "0" and attrs.get("videos-loaded") == "8", attrs  # H.264 decoded
    assert len(re.findall(r'data-state="loaded 48x48"', dom.stdout)) == 8
    assert dom.stdout.count("<table") >= 5 and "<svg" in dom.stdout
    assert "60% [31, 83] (6/10)" in dom.stdout

    shot = tmp_path / "shot.png"
    r = _chromium("--virtual-time-budget=5000", "--window-size=1200,1400", "--hide-scrollbars",
                  f"--screenshot={shot}", url)
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(np.int16)
    assert img.shape[:2] == (1400, 1200)
    assert img.std() > 20, "the screenshot is (nearly) blank"
    # The sim clips' magenta square is on screen: the browser painted decoded video frames.
    magenta = (img[..., 0] > 200) & (img[..., 1] < 80) & (img[..., 2] > 200)
    assert magenta.sum() > 500, f"no video frames painted ({magenta.sum()} magenta pixels)"
