"""The names a run and a dataset are made of, each defined once: camera keys, the run folder."""
from comsim.io.keys import (control_key, depth_key, is_sim_key, normal_key, seen_cameras, seg_key, sim_key)


def test_camera_keys():
    assert sim_key("front") == "front_sim"
    assert seg_key("front") == control_key("front", "seg") == "front_sim_seg"
    assert depth_key("wrist") == "wrist_sim_depth"
    assert normal_key("front") == "front_sim_normal"
    keys = ["front", "front_sim", "front_sim_seg", "front_sim_depth", "front_sim_normal", "wrist", "wrist_sim", "simple"]
    assert [k for k in keys if is_sim_key(k)] == ["front_sim", "front_sim_seg", "front_sim_depth", "front_sim_normal",
                                                  "wrist_sim"]
    assert seen_cameras(keys) == ["front", "wrist", "simple"]


# -- the run folder ---------------------------------------------------------------------------------
def test_run_layout_names_every_stage_output(tmp_path):
    from comsim.run_layout import CONVERT, LAB_RECORD, STAGES, VIDEO_METRICS, RunLayout

    run = RunLayout(tmp_path)
    assert [s.name for s in STAGES] == ["lab record", "twin calibrate + replay", "translator training",
                                        "factory generate", "convert", "video metrics", "mix", "policy experiment"]
    assert run.lab == run.output(LAB_RECORD) == tmp_path / "lab"
    assert run.pseudo_real == run.output(CONVERT) and run.metrics == run.output(VIDEO_METRICS)
    assert run.translator_final == tmp_path / "translator" / "final"
    assert run.heldout_part("pseudo") == tmp_path / "heldout_pseudo_real" / "pseudo"
    for bad in (lambda: run.output("lab"), lambda: run.heldout_part("fake")):
        try:
            bad()
        except KeyError as e:
            assert "lab record" in str(e) or "sim_only" in str(e)
        else:
            raise AssertionError("an unknown name was accepted")


def test_experiment_layout_is_what_the_runner_writes_and_the_report_reads(tmp_path):
    """The experiment runner names its arm folders, eval files and trial logs through
    ExperimentLayout; the demo's policy folder is one."""
    from comsim.pipeline.experiment import arm_run, eval_key, load_experiment
    from comsim.run_layout import ExperimentLayout, RunLayout
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = load_experiment(root / "configs" / "experiments" / "lab_table.yaml", [f"output_dir={tmp_path}"])
    layout = ExperimentLayout(tmp_path)
    run = arm_run(cfg, cfg.arms[0])
    assert Path(run.output_dir).parent == layout.arms and Path(run.output_dir).name.startswith(cfg.arms[0].name + "-")
    assert Path(run.cache_dir) == layout.cache
    f = layout.eval_file(run.output_dir, "ood", eval_key(cfg, "ood"))
    f.parent.mkdir(parents=True)
    f.write_text("{}")
    assert layout.eval_files(run.output_dir, "ood") == [f] and layout.eval_files(run.output_dir, "id") == []
    assert RunLayout(tmp_path).experiment.results == RunLayout(tmp_path).policy_results


def test_the_demo_logs_the_stages_the_report_lists(tmp_path, monkeypatch):
    """The demo's stage names are the report's: a demo whose first stage fails records every stage
    (failed or skipped) in stages.json, and the report's stage table shows each one, none left over."""
    import json
    import re

    import pytest

    from comsim.pipeline import demo
    from comsim.run_layout import STAGES, RunLayout

    monkeypatch.setitem(demo.PROFILES, "no_such_task", demo.DemoProfile(task="no_such_task"))
    with pytest.raises(RuntimeError, match="failed stages"):
        demo.run_demo(tmp_path, profile="no_such_task")
    run = RunLayout(tmp_path)
    failures = json.loads(run.stages.read_text())["failures"]
    assert list(failures) == [s.name for s in STAGES]
    assert "unknown lab task" in failures["lab record"]
    assert all(v.startswith("skipped: needs") for k, v in failures.items() if k != "lab record")
    page = run.report.read_text()
    table = page[page.index("<h2>Stages</h2>"):page.index("<h2>Failed or skipped stages</h2>")]
    for s in STAGES:
        assert re.search(rf"<td>{re.escape(s.name)}</td>\s*<td>{re.escape(s.output)}</td>", table), s.name
    assert "Other timings" not in page


# -- one definition each: seeds and resizing --------------------------------------------------------
def test_episode_seeds_are_one_stream_everywhere():
    import numpy as np

    from comsim.convert import episode_seed as convert_seed
    from comsim.episode import episode_seed
    from comsim.lab import episode_seed as lab_seed

    assert episode_seed(5, 3) == int(np.random.SeedSequence([5, 3]).generate_state(1)[0])
    assert convert_seed is episode_seed and lab_seed(5, 3) == episode_seed(5, 3)
    # the factory's retries are further streams; its first attempt is the bare (seed, index) seed
    # (a SeedSequence pads its entropy with zeros)
    assert len({episode_seed(0, k, a) for k in range(100) for a in range(3)}) == 300
    assert all(episode_seed(7, k, 0) == episode_seed(7, k) for k in range(10))


def test_resize_frames_averages_areas_and_keeps_leading_axes():
    import numpy as np

    from comsim.episode import resize_frames

    rng = np.random.default_rng(0)
    f = rng.integers(0, 256, (2, 3, 8, 8, 3), dtype=np.uint8)  # (episodes, T, H, W, 3)
    small = resize_frames(f, (4, 4))
    assert small.shape == (2, 3, 4, 4, 3) and small.dtype == np.uint8
    box = f.reshape(2, 3, 4, 2, 4, 2, 3).astype(float).mean(axis=(3, 5))
    assert np.abs(small.astype(float) - box).max() <= 0.5 + 1e-9  # the mean of each 2x2 block, rounded
    assert resize_frames(f, (8, 8)) is not None and np.array_equal(resize_frames(f, (8, 8)), f)
    big = resize_frames(f[0], (16, 12))
    assert big.shape == (3, 16, 12, 3) and abs(big.astype(float).mean() - f[0].mean()) < 2.0
