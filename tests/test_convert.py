"""Batch conversion sim -> pseudo-real with a micro translator built here (nothing downloads).

The input is a real (short) factory dataset; the translator is randomly initialized: these
tests check plumbing, determinism, resumption and provenance, not image quality.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from comsim.config import from_dict
from comsim.convert import HEADER_FILE, REPORT_FILE, ConversionError, convert_dataset, episode_seed, translator_hash
from comsim.factory.generate import generate_dataset
from comsim.io.lerobot import LeRobotDataset
from comsim.io.video import read_video
from comsim.translator.codec import PixelCodec
from comsim.translator.data import ActionNormalizer
from comsim.translator.pipeline import TranslatorPipeline
from comsim.translator.sampling import SamplingParams
from comsim.translator.training import TranslatorConfig, build_model, make_pipeline

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1"}
N_EPISODES = 10
ARGS = dict(sampling=SamplingParams(w_action=1.5, w_sim=2.0, num_steps=6, strength=1.0), seed=3)

SHORT_TASK = """\
task: reach
instruction: "Reach above the {{cube.color}} cube."
scene: {scene}
max_seconds: 6
speed: 0.35
objects:
  cube: {{shape: cube, side: [0.04, 0.05], colors: [red, blue]}}
layout:
  in_distribution: {{cube: {{x: [0.45, 0.55], y: [-0.1, 0.1]}}}}
program:
  - move: {{to: cube, height: [0.12, 0.2]}}
success:
  - at: {{object: cube, target: [0.5, 0.0], radius: 0.2}}
"""


def save_micro_translator(path: Path, action_dim: int = 8, camera: str = "front", seed: int = 0,
                          sampling: dict | None = None) -> Path:
    """A randomly initialized pixel-space translator: dim 32, depth 2, 4 frames of 32x32, patch 8
    (the tiny configs' size, where resume must be byte-identical too).

    (16-48 px frames used to encode to different bytes now and then, from x264's lookahead;
    comsim.io.video now turns it off and tests/test_io.py checks those widths.)
    """
    torch.manual_seed(seed)
    cfg = from_dict(TranslatorConfig, {"model": {"dim": 32, "depth": 2, "heads": 2, "patch_size": [1, 8, 8]},
                                       "data": {"num_frames": 4, "resolution": [32, 32], "camera": camera},
                                       "sampling": sampling or {}})
    model = build_model(cfg, PixelCodec(), action_dim)
    with torch.no_grad():  # AdaLN-Zero starts at zero: randomize so the conditions matter
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.05)
    normalizer = ActionNormalizer(np.zeros(action_dim), np.ones(action_dim))
    return make_pipeline(cfg, model.eval(), PixelCodec(), normalizer, fps=10).save_pretrained(path)


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    task = d / "reach.yaml"
    task.write_text(SHORT_TASK.format(scene=ROOT / "configs" / "twin" / "panda_cell.yaml"))
    generate_dataset(task, N_EPISODES, d / "data", seed=1, progress=False)
    return d / "data"


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return save_micro_translator(tmp_path_factory.mktemp("model") / "micro")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sim_dataset, micro):
    """An uninterrupted single-process conversion."""
    out = tmp_path_factory.mktemp("ref") / "pseudo"
    report = convert_dataset(micro, sim_dataset, out, progress=False, **ARGS)
    assert report["converted_now"] == N_EPISODES and report["closed"]
    timing = json.loads((out / REPORT_FILE).read_text())
    assert timing["frames_now"] > 0 and timing["frames_per_second"] > 0
    return out


def _files(root: Path) -> list[Path]:
    # the header names its inputs' paths and the report holds wall-clock timing: the data must match without them
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and p.name not in (HEADER_FILE, REPORT_FILE))


def assert_same_dataset(a: Path, b: Path):
    """Byte-identical parquet and metadata, frame-identical videos."""
    assert _files(a) == _files(b)
    differ = []
    for rel in _files(a):
        if rel.suffix == ".mp4":
            fa, fb = read_video(a / rel), read_video(b / rel)
            if fa.shape != fb.shape or not np.array_equal(fa, fb):
                bad = np.nonzero((fa != fb).reshape(len(fa), -1).any(1))[0] if fa.shape == fb.shape else "shape"
                differ.append((str(rel), bad, (a / rel).read_bytes() == (b / rel).read_bytes(),
                               np.array_equal(read_video(a / rel), fa), np.array_equal(read_video(b / rel), fb)))
        elif (a / rel).read_bytes() != (b / rel).read_bytes():
            differ.append((str(rel), "bytes"))
    assert not differ, differ


def test_converted_episodes_keep_sim_and_record_provenance(reference, sim_dataset, micro):
    src, out = LeRobotDataset(sim_dataset), LeRobotDataset(reference)
    assert len(out) == len(src) == N_EPISODES and sorted(out.camera_keys) == ["front", "front_sim"]
    for i in (0, N_EPISODES - 1):
        s, e = src[i], out[i]
        assert e.frames["front"].shape == (len(s), 32, 32, 3)  # the translator's resolution
        assert np.array_equal(e.frames["front_sim"].shape, s.frames["front_sim"].shape)
        assert np.array_equal(e.action, s.action) and np.array_equal(e.state, s.state) and e.success == s.success
        assert np.array_equal(e.extra["observation.environment_state"], s.extra["observation.environment_state"])
        p = e.provenance
        assert p.source == "pseudo_real" and p.translator_hash == translator_hash(micro)
        assert p.translator_hash == TranslatorPipeline.from_pretrained(micro).checkpoint_hash
        # overlap: the pipeline's half window (num_frames 4), resolved and recorded
        assert p.guidance == {"w_action": 1.5, "w_sim": 2.0, "num_steps": 6, "strength": 1.0, "overlap": 2}
        assert p.seed == episode_seed(3, i) and p.task == "reach" and p.twin_spec_hash == s.provenance.twin_spec_hash
        assert p.extra["source_episode"] == i and p.extra["sim_seed"] == s.provenance.seed


def test_guidance_defaults_to_the_translators_own_sampling(sim_dataset, tmp_path):
    """Without --steps / --w-action / --w-sim / --overlap a conversion samples as the translator's
    training config says."""
    model = save_micro_translator(tmp_path / "m", sampling={"num_steps": 2, "w_action": 0.5, "w_sim": 1.5,
                                                            "overlap": 1})
    out = tmp_path / "pseudo"
    report = convert_dataset(model, sim_dataset, out, num_shards=N_EPISODES, shard_index=0, progress=False)
    assert report["converted_now"] == 1 and not report["closed"]
    header = json.loads((out / HEADER_FILE).read_text())
    assert (header["num_steps"], header["w_action"], header["w_sim"], header["overlap"]) == (2, 0.5, 1.5, 1)
    # and an explicit value wins
    report = convert_dataset(model, sim_dataset, tmp_path / "explicit", sampling=SamplingParams(num_steps=3, overlap=3),
                             num_shards=N_EPISODES,
                             shard_index=0, progress=False)
    header = json.loads((tmp_path / "explicit" / HEADER_FILE).read_text())
    assert (header["num_steps"], header["w_action"], header["w_sim"], header["overlap"]) == (3, 0.5, 1.5, 3)
    # an overlap the window cannot hold is refused before anything is written
    with pytest.raises(ConversionError, match=r"overlap must be in \[1, 4\) frames"):
        convert_dataset(model, sim_dataset, tmp_path / "bad", sampling=SamplingParams(overlap=4), progress=False)
    assert not (tmp_path / "bad").exists()


def test_same_episode_same_frames_and_resume_is_a_no_op(reference, sim_dataset, micro, tmp_path):
    from comsim.convert import convert_episode

    pipe = TranslatorPipeline.from_pretrained(micro)
    ep = LeRobotDataset(sim_dataset)[2]
    guidance = ARGS["sampling"].to_dict()
    a = convert_episode(pipe, ep, 2, 3, guidance, "x").frames["front"]
    b = convert_episode(pipe, ep, 2, 3, guidance, "x").frames["front"]
    assert np.array_equal(a, b)
    import comsim.convert
    import torch

    comsim.convert._WORKER.clear()  # the translator is loaded again, with convert's own thread count (1)
    caller = torch.get_num_threads()
    torch.set_num_threads(caller + 1)
    try:
        again = convert_dataset(micro, sim_dataset, reference, progress=False, **ARGS)
        assert torch.get_num_threads() == caller + 1  # the caller's thread count is back after convert
    finally:
        torch.set_num_threads(caller)
    assert again["converted_now"] == 0
    with pytest.raises(ConversionError, match="holds a conversion made with"):
        convert_dataset(micro, sim_dataset, reference, progress=False, seed=ARGS["seed"],
                        sampling=SamplingParams(w_action=1.5, w_sim=1.0, num_steps=6))


def test_shards_give_the_same_dataset(reference, sim_dataset, micro, tmp_path):
    shards = tmp_path / "shards"
    r0 = convert_dataset(micro, sim_dataset, shards, num_shards=2, shard_index=1, progress=False, **ARGS)
    assert r0["converted_now"] == N_EPISODES // 2 and not r0["closed"] and r0["episodes_left"] == N_EPISODES // 2
    assert not (shards / "meta" / "info.json").exists()
    r1 = convert_dataset(micro, sim_dataset, shards, num_shards=2, shard_index=0, progress=False, **ARGS)
    assert r1["converted_now"] == N_EPISODES // 2
    convert_dataset(micro, sim_dataset, shards, progress=False, **ARGS)  # closes
    assert_same_dataset(reference, shards)


@pytest.mark.slow  # two spawned processes each import torch: ~40 s on a busy 2-core machine
def test_local_workers_give_the_same_dataset(reference, sim_dataset, micro, tmp_path):
    workers = tmp_path / "workers"
    convert_dataset(micro, sim_dataset, workers, workers=2, progress=False, **ARGS)
    assert_same_dataset(reference, workers)


def test_killed_conversion_resumes_to_identical_files(reference, sim_dataset, micro, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "comsim.cli", "convert", "--model", str(micro), "--input", str(sim_dataset),
           "--output", str(out), "--w-action", "1.5", "--w-sim", "2.0", "--steps", "6", "--seed", "3", "--no-progress"]
    proc = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    staged = []
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        staged = list((out / ".staging").glob("episode_*")) if (out / ".staging").is_dir() else []
        if len(staged) >= 3:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"finished before it could be killed: {proc.stderr.read()}"
    assert not (out / "meta" / "info.json").exists() and 3 <= len(staged) < N_EPISODES

    r = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert '"converted_now": ' in r.stdout and f'"converted_now": {N_EPISODES}' not in r.stdout
    assert_same_dataset(reference, out)


def test_mismatched_inputs_are_refused_before_converting(sim_dataset, reference, tmp_path):
    seven = save_micro_translator(tmp_path / "seven", action_dim=7)
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=r"action has 8 values per frame but the translator .* action_dim=7"):
        convert_dataset(seven, sim_dataset, out, progress=False)
    assert not out.exists()
    r = subprocess.run([sys.executable, "-m", "comsim.cli", "convert", "--model", str(seven), "--input",
                        str(sim_dataset), "--output", str(out)], env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "action_dim=7; refusing before converting anything" in r.stderr
    assert not out.exists()

    wrist = save_micro_translator(tmp_path / "wrist", camera="wrist")
    with pytest.raises(ConversionError, match=r"no video feature \['observation.images.wrist_sim'\]"):
        convert_dataset(wrist, sim_dataset, out, progress=False)
    with pytest.raises(ConversionError, match="already has observation.images.front"):
        convert_dataset(save_micro_translator(tmp_path / "eight"), reference, out, progress=False)
    assert not out.exists()


def test_bf16_conversion_is_close_to_fp32_recorded_and_not_mixed_on_resume(reference, sim_dataset, micro, tmp_path):
    out = tmp_path / "bf16"
    report = convert_dataset(micro, sim_dataset, out, progress=False, precision="bf16", **ARGS)
    assert report["converted_now"] == N_EPISODES
    ref, bf = LeRobotDataset(reference), LeRobotDataset(out)
    for i in (0, N_EPISODES - 1):
        a, b = ref[i].frames["front"].astype(np.int32), bf[i].frames["front"].astype(np.int32)
        assert a.shape == b.shape and not np.array_equal(a, b)  # autocast did run in bf16
        # grey levels: the same picture (a random model whose guidance, w 1.5 and 2, weighs the unconditional
        # branch -2.5, amplifies rounding: ~2.4 here)
        assert np.abs(a - b).mean() < 4.0
        assert bf[i].provenance.guidance["precision"] == "bf16"
    assert json.loads((out / HEADER_FILE).read_text())["precision"] == "bf16"
    # a bf16 folder is not resumed in fp32: the episodes would mix precisions
    with pytest.raises(ConversionError, match="precision"):
        convert_dataset(micro, sim_dataset, out, progress=False, **ARGS)
    with pytest.raises(ConversionError, match="precision: expected fp32 or bf16, got 'fp16'"):
        convert_dataset(micro, sim_dataset, tmp_path / "fp16", progress=False, precision="fp16", **ARGS)
    assert not (tmp_path / "fp16").exists()


@pytest.mark.slow
def test_accelerate_launch_splits_episodes_over_processes(reference, sim_dataset, micro, tmp_path):
    out = tmp_path / "accel"
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "comsim" / "cli.py"), "convert",
           "--model", str(micro), "--input", str(sim_dataset), "--output", str(out), "--w-action", "1.5",
           "--w-sim", "2.0", "--steps", "6", "--seed", "3", "--no-progress"]
    env = {**ENV, "ACCELERATE_USE_CPU": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_dataset(reference, out)
