"""`comsim run`: the loop on a recording handed over as if real, and the mixed dataset it ends with."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from comsim.episode import Episode, Provenance
from comsim.io.lerobot import LeRobotDataset, write_dataset
from comsim.pipeline.mix import mix, synthetic_episodes_for


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def _episodes(n: int, length: int, source: str, size: int = 16, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    return [Episode(frames={"front": rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8),
                            **({"front_sim": rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8)}
                               if source == "pseudo_real" else {})},
                    action=rng.normal(size=(length, 8)).astype(np.float32),
                    state=rng.normal(size=(length, 8)).astype(np.float32), fps=10.0, task="push",
                    provenance=Provenance(source=source, task="push", seed=i)) for i in range(n)]


def test_synthetic_episodes_are_chosen_for_the_fraction():
    assert synthetic_episodes_for(100, [50, 50, 50, 50], 0.5) == 2  # 100 / 200
    assert synthetic_episodes_for(100, [50, 50, 50, 50], 0.0) == 0
    assert synthetic_episodes_for(100, [50, 50], 0.9) == 2  # all there is: 100 / 200
    assert synthetic_episodes_for(90, [10] * 20, 0.25) == 3  # 30 / 120


def test_the_mixed_dataset_keeps_one_camera_and_every_episodes_provenance(tmp_path):
    real = write_dataset(tmp_path / "real", _episodes(2, 10, "real", size=16), fps=10)
    pseudo = write_dataset(tmp_path / "pseudo", _episodes(4, 10, "pseudo_real", size=8, seed=1), fps=10)
    before = _tree_hash(tmp_path / "real") + _tree_hash(tmp_path / "pseudo")
    report = mix(real, pseudo, tmp_path / "mixed", 0.5)
    assert report["synthetic_episodes"] == 2 and report["synthetic_fraction_reached"] == 0.5
    ds = LeRobotDataset(tmp_path / "mixed")
    assert len(ds) == 4 and ds.camera_keys == ["front"]
    assert [ds.episode_info(i)["provenance"].source for i in range(4)] == ["real", "real", "pseudo_real", "pseudo_real"]
    assert ds.read_episode(3).frames["front"].shape == (10, 16, 16, 3)  # at the real recording's size
    assert json.loads((tmp_path / "mixed" / "mixture.json").read_text())["synthetic_fraction"] == 0.5
    assert _tree_hash(tmp_path / "real") + _tree_hash(tmp_path / "pseudo") == before
    again = mix(real, pseudo, tmp_path / "mixed", 0.5)  # finished: nothing rewritten
    assert again["synthetic_episodes"] == 2
    from comsim.errors import ComSimError
    with pytest.raises(ComSimError, match="synthetic_fraction"):
        mix(real, pseudo, tmp_path / "mixed", 0.25)  # another mixture in the same folder
    with pytest.raises(ComSimError, match="--synthetic-fraction"):
        mix(real, pseudo, tmp_path / "other", 1.0)
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_comsim_run_on_a_recording_handed_over_as_if_real(tmp_path, monkeypatch):
    """A lab recording without its hidden truth, run from another folder: the twin calibrates and aligns from
    the recording alone, and the run ends with pseudo-real episodes and a mixed dataset; nothing is written
    outside --out and the recording is untouched."""
    from comsim.cli import main
    from comsim.lab.record import record_dataset
    from comsim.run_layout import POLICY, RunLayout

    record_dataset("push", episodes=3, out=tmp_path / "recorded", seed=3, calibration_stills=4)
    mine = tmp_path / "mine"
    shutil.copytree(tmp_path / "recorded", mine)
    (mine / "lab_truth.json").unlink()  # as a real robot's recording: no truth
    before = _tree_hash(mine)
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    rc = main(["run", "--real", str(mine), "--twin", "configs/twin/panda_cell_push.yaml", "--task", "lab_push",
               "--out", "run", "--sim-episodes", "2", "--ood-sim-episodes", "1", "--translator-steps", "2",
               "--translator-override", "train.batch_size=2", "--translator-override", "train.validation_steps=1000",
               "--translator-override", "sampling.num_steps=1", "--synthetic-fraction", "0.4"])
    assert rc == 0
    run = RunLayout(work / "run")
    stages = json.loads(run.stages.read_text())
    assert stages["failures"] == {} and POLICY in stages["left_out"] and "no robot" in stages["left_out"][POLICY]
    assert "camera_position_error_m" not in json.loads(run.twin_summary.read_text())["summary"]  # no truth read
    metrics = json.loads(run.metrics.read_text())
    assert len(LeRobotDataset(run.pseudo_real)) == 2 and metrics["pseudo_real_vs_real"]
    assert metrics["robot_region"]["mask_source"].startswith("twin label")  # no truth: the twin's robot label
    mixed = LeRobotDataset(run.mixed)
    sources = [mixed.episode_info(i)["provenance"].source for i in range(len(mixed))]
    assert sources[:3] == ["lab"] * 3 and set(sources[3:]) == {"pseudo_real"} and len(sources) > 3
    assert mixed.camera_keys == ["front"]
    assert run.report.is_file() and "no robot to score" in run.report.read_text()
    assert sorted(p.name for p in work.iterdir()) == ["run"] and _tree_hash(mine) == before
