"""Faults that are not bad input: a second writer, a full disk, kill -9.

- One writer per output (comsim/io/lock.py): while another process holds an output folder, generate,
  convert, lab record, twin replay and translator training are refused with one line naming its pid
  and host, and change nothing; a lock whose process is gone is taken over, and that is said.
- A full disk (a real tmpfs that fills up, mounted in a user + mount namespace): one clear error, no
  finished-looking dataset, and a rerun with space resumes to the same bytes as an uninterrupted run.
- kill -9 in the middle of each long command: the rerun resumes to the same bytes (convert's is in
  test_convert.py). The lab recording's runs by default; generate's, twin replay's and training's
  take 30-60 s each and are marked slow.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from comsim import cli
from comsim.io.lock import LOCK_FILE, OutputLockedError, output_lock
from test_malformed_inputs import SCENE, _script_main, shared, snapshot, translator_cfg  # noqa: F401  (shared: a fixture)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
RECORD = ["lab", "record", "--task", "push", "--episodes", "2", "--seed", "7", "--calibration-stills", "0"]

HOLD = """\
import sys, time
from comsim.io.lock import output_lock
with output_lock(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def held_elsewhere(out: Path, command: str = "comsim generate"):
    """``out``'s lock, held by another process until the block ends (then that process is killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out), command], stdout=subprocess.PIPE, env=ENV, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == b"held"
        yield p
    finally:
        p.kill()
        p.wait()


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_files(a: Path, b: Path) -> None:
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    assert [k for k in fa if fa[k] != fb[k]] == []


def comsim(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "comsim.cli", *map(str, args)], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, **kw)


def kill_when(path_glob: tuple[Path, str], proc: subprocess.Popen, timeout: float = 300) -> None:
    """SIGKILL ``proc`` as soon as a file or folder matching ``path_glob`` appears."""
    folder, pattern = path_glob
    t0 = time.monotonic()
    while not (folder.is_dir() and any(folder.glob(pattern))):
        assert proc.poll() is None, f"ended before it could be killed: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() - t0 < timeout, f"{folder / pattern} did not appear"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def lab_reference(tmp_path_factory):
    """An uninterrupted `comsim lab record` of 2 push episodes (no calibration stills)."""
    out = tmp_path_factory.mktemp("lab") / "reference"
    assert cli.main([*RECORD, "--out", str(out)]) == 0
    return out


# ----------------------------------------------------------------------------- the lock itself


def test_lock_refuses_a_live_writer_and_takes_over_a_dead_ones(tmp_path):
    out = tmp_path / "out"
    with held_elsewhere(out, "comsim convert") as holder:
        with pytest.raises(OutputLockedError) as e:
            with output_lock(out, "comsim generate"):
                pass
        msg = str(e.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}" in msg and "`comsim convert`" in msg
        holder.send_signal(signal.SIGKILL)  # gone: its lock file stays, naming it
        holder.wait()
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == holder.pid
    said = []
    with output_lock(out, "comsim generate", log=said.append):
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert len(said) == 1 and f"pid {holder.pid}" in said[0] and "taking over" in said[0]
    assert not (out / LOCK_FILE).exists() and out.is_dir()  # released; the folder was not this run's to remove
    # a folder made only to hold the lock goes with it
    with output_lock(tmp_path / "new" / "deeper", "comsim generate"):
        assert (tmp_path / "new" / "deeper" / LOCK_FILE).is_file()
    assert not (tmp_path / "new").exists()


def test_shards_write_side_by_side_but_not_twice_nor_beside_a_closing_run(tmp_path):
    out = tmp_path / "out"
    with output_lock(out, "comsim convert", shard=0) as s0, output_lock(out, "comsim convert", shard=1) as s1:
        with pytest.raises(OutputLockedError, match="comsim convert"):
            with output_lock(out, "comsim convert", shard=0):
                pass
        with pytest.raises(OutputLockedError, match="shard"):
            with output_lock(out, "comsim convert"):  # the run that closes waits for every shard
                pass
        # two shards finishing together: the first to ask is not alone, the other then is (and closes)
        assert not s0.alone() and s1.alone()
    with output_lock(out, "comsim convert"):
        with pytest.raises(OutputLockedError):
            with output_lock(out, "comsim convert", shard=1):
                pass
    assert not out.exists()  # every lock file gone, and the folder made for them


# ----------------------------------------------------------------------------- a second writer, per command


def _generate(t, s, out):
    return cli.main, ["generate", "--task", str(s / "task.yaml"), "--out", str(out), "--episodes", "1",
                      "--no-progress"]


def _convert(t, s, out):
    return cli.main, ["convert", "--model", str(s / "micro"), "--input", str(s / "sim"), "--output", str(out),
                      "--steps", "1", "--no-progress"]


def _lab_record(t, s, out):
    return cli.main, ["lab", "record", "--task", "push", "--episodes", "1", "--out", str(out),
                      "--calibration-stills", "0"]


def _twin_replay(t, s, out):
    return cli.main, ["twin", "replay", "--real", str(s / "real"), "--twin", str(SCENE), "--out", str(out)]


def _train(t, s, out):
    cfg = translator_cfg(t, train__output_dir=str(out), model__dim=32, model__depth=1, model__heads=2,
                         data__synthetic__episodes=3, data__synthetic__length=8, data__val_episodes=1)
    return _script_main("train"), ["--config", str(cfg)]


@pytest.mark.parametrize("command", [_generate, _convert, _lab_record, _twin_replay, _train],
                         ids=["generate", "convert", "lab_record", "twin_replay", "train"])
def test_a_second_writer_is_refused_and_changes_nothing(command, shared, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    main, argv = command(tmp_path, shared, out)
    with held_elsewhere(out) as holder:
        before = snapshot(tmp_path, shared)
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2, err[-2000:]
        lines = [ln for ln in err.splitlines() if ": error: " in ln]
        assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
        assert f"pid {holder.pid} on host {socket.gethostname()}" in lines[0] and str(out) in lines[0]
        assert snapshot(tmp_path, shared) == before, "the refused writer wrote or changed files"


# ----------------------------------------------------------------------------- a full disk


FULL_DISK = """\
import json, subprocess, sys
from pathlib import Path
disk, size, argv, report = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
out = disk / "out"
full = subprocess.run([sys.executable, "-m", "comsim.cli", *argv, "--out", str(out)], capture_output=True, text=True)
left = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []
truth = json.loads((out / "lab_truth.json").read_text()) if (out / "lab_truth.json").is_file() else {}
subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
again = subprocess.run([sys.executable, "-m", "comsim.cli", *argv, "--out", str(out)], capture_output=True, text=True)
subprocess.run(["cp", "-a", str(out), str(report.parent / "resumed")], check=True)
report.write_text(json.dumps({"rc": full.returncode, "err": full.stderr, "left": left,
                              "complete": truth.get("complete"), "rc_again": again.returncode,
                              "err_again": again.stderr}))
"""


def _namespaces() -> bool:
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not shutil.which("unshare") or not _namespaces(),
                    reason="needs user + mount namespaces (unshare -rm) to mount a small tmpfs")
@pytest.mark.parametrize("fill", [0.65, pytest.param(1.3, marks=pytest.mark.slow)], ids=["while_staging", "while_closing"])
def test_a_full_disk_leaves_no_finished_dataset_and_a_rerun_resumes(fill, lab_reference, tmp_path):
    """The lab recording on a real tmpfs that fills up: at 0.65x the finished dataset's size, while the
    second episode is staged; at 1.3x, while the staged episodes are joined (both fit, the joined copy does
    not). One line naming the output, no meta/info.json, no temporaries; with space, the same bytes."""
    size = sum(p.stat().st_size for p in lab_reference.rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    disk.mkdir()
    script, report = tmp_path / "full_disk.py", tmp_path / "report.json"
    script.write_text(FULL_DISK)
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, str(script), str(disk),
                        f"{int(size * fill) // 4096 * 4096}", json.dumps(RECORD), str(report)],
                       capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["rc"] == 2, rep["err"][-3000:]
    lines = [ln for ln in rep["err"].splitlines() if ": error: " in ln]
    assert len(lines) == 1 and "Traceback" not in rep["err"], rep["err"][-3000:]
    assert "no space left on device" in lines[0] and "rerun" in lines[0] and str(disk / "out") in lines[0]
    assert "meta/info.json" not in rep["left"] and not rep["complete"]  # nothing looks finished
    assert not [p for p in rep["left"] if ".tmp-" in p or p.startswith(LOCK_FILE)], rep["left"]
    assert ".staging/episode_000000" in rep["left"]  # what was finished is kept
    assert rep["rc_again"] == 0, rep["err_again"][-3000:]
    assert_same_files(lab_reference, tmp_path / "resumed")


# ----------------------------------------------------------------------------- kill -9, then resume


def test_killed_lab_recording_resumes_to_the_same_bytes(lab_reference, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "comsim.cli", *RECORD, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    kill_when((out / ".staging", "episode_000000"), proc)
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == proc.pid  # left behind by the killed run
    again = comsim(*RECORD, "--out", out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"taking over the lock of `comsim lab record` (pid {proc.pid}" in again.stderr
    assert_same_files(lab_reference, out)


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(stat.parent.name))
    return kids


def _gone(pid: int, timeout: float = 10) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    return False


@pytest.mark.slow  # three generate runs with spawned workers: ~40 s on 2 cores
def test_killed_generation_resumes_to_the_same_bytes_and_its_workers_end(shared, tmp_path):  # noqa: F811
    args = ["generate", "--task", shared / "task.yaml", "--episodes", "3", "--seed", "4", "--no-progress"]
    reference = comsim(*args, "--out", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "comsim.cli", *map(str, args), "--workers", "2", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    workers = []
    while not ((out / ".staging").is_dir() and any((out / ".staging").glob("episode_*"))):
        workers = sorted(set(workers) | set(_children(proc.pid)))
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.02)
    kill_when((out / ".staging", "episode_*"), proc)
    assert workers and all(_gone(w) for w in workers), "a worker outlived the killed generate"
    again = comsim(*args, "--out", out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "taking over the lock" in again.stderr
    timing = {"generation_report.json"}  # seconds and episodes per minute: the one file that may differ
    a, b = files(tmp_path / "reference"), files(out)
    assert sorted(a) == sorted(b) and [k for k in a if a[k] != b[k] and k not in timing] == []


@pytest.mark.slow  # a lab recording and three replays: ~60 s on 2 cores
def test_killed_twin_replay_resumes_to_the_same_bytes(lab_reference, tmp_path):
    cal = tmp_path / "calibration.json"
    cam = json.loads((lab_reference / "camera_intrinsics.json").read_text())
    import yaml

    nominal = yaml.safe_load(SCENE.read_text())["cameras"][0]
    cal.write_text(json.dumps({"T_cam_from_base": nominal["T_cam_from_base"], "K": nominal["K"],
                               "width": cam.get("width", 128), "height": cam.get("height", 128)}))
    args = ["twin", "replay", "--real", lab_reference, "--twin", ROOT / "configs/twin/panda_cell_push.yaml",
            "--mode", "kinematic", "--calibration", cal, "--channels", "seg", "--no-report", "--no-refine"]
    reference = comsim(*args, "--out", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "comsim.cli", *map(str, args), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    kill_when((out / ".staging", "episode_000000"), proc)
    again = comsim(*args, "--out", out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "taking over the lock" in again.stderr and "(1 already staged)" in again.stdout + again.stderr
    assert_same_files(tmp_path / "reference", out)


@pytest.mark.slow  # three short trainings, each in a fresh process: ~60 s on 2 cores
def test_killed_translator_training_resumes_to_the_same_weights(tmp_path):
    def cfg(out):
        return translator_cfg(tmp_path, train__output_dir=str(out), train__max_steps=12, train__checkpointing_steps=2,
                              train__validation_steps=1000, train__warmup_steps=0, train__checkpoints_total_limit=2,
                              model__dim=32, model__depth=1, model__heads=2, data__synthetic__episodes=4,
                              data__synthetic__length=10, data__synthetic__size=16, data__resolution=[16, 16],
                              data__num_frames=4, data__val_episodes=1, train__batch_size=2).read_text()

    script = [sys.executable, str(ROOT / "train" / "train_translator.py")]
    (tmp_path / "full.yaml").write_text(cfg(tmp_path / "full"))
    (tmp_path / "cut.yaml").write_text(cfg(tmp_path / "cut"))
    full = subprocess.run([*script, "--config", str(tmp_path / "full.yaml")], capture_output=True, text=True, env=ENV,
                          cwd=ROOT)
    assert full.returncode == 0, full.stderr[-3000:]
    proc = subprocess.Popen([*script, "--config", str(tmp_path / "cut.yaml")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    kill_when((tmp_path / "cut", "checkpoint-4"), proc)
    again = subprocess.run([*script, "--config", str(tmp_path / "cut.yaml"), "--resume_from_checkpoint", "latest"],
                           capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "taking over the lock" in again.stderr
    for name in ("final/transformer/diffusion_pytorch_model.safetensors", "checkpoint-12/model.safetensors",
                 "checkpoint-12/ema.safetensors", "checkpoint-12/optimizer.bin"):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes(), name
