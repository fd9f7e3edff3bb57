"""No-network baselines (comsim/translator/compositor.py) and object-crop scores (comsim/metrics/crops.py).

A constructed pair where the truth is known: the real frame is an exact affine colour map of the twin's
render per twin label (robot, object) and a fixed background plate wherever the twin shows backdrop.
The compositor must recover the maps and the plate (and so the real frames, up to the rounding of the
construction), the global colour map can only average the labels' maps, and the raw render is as far
off as the construction put it.
"""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from comsim.episode import Episode  # noqa: E402
from comsim.io.keys import seg_key, sim_key  # noqa: E402
from comsim.io.lerobot import DatasetWriter, LeRobotDataset  # noqa: E402
from comsim.metrics.crops import object_crop_scores, object_crops, pool_crop_scores  # noqa: E402
from comsim.metrics.frame import mean_psnr, psnr  # noqa: E402
from comsim.translator.compositor import (fit_baseline, fit_baselines, load_baseline,  # noqa: E402
                                          training_pairs)
from comsim.io.labels import seg_to_rgb  # noqa: E402

CAM = "front"
H = W = 32
# real = A @ [r, g, b, 1] per twin label: the robot's plastic is warmer and darker, the cube duller
MAPS = {1: np.array([[0.8, 0.1, 0.0, 20.0], [0.0, 0.7, 0.1, 10.0], [0.0, 0.0, 0.6, 5.0]]),
        2: np.array([[0.5, 0.0, 0.0, 60.0], [0.1, 0.6, 0.0, 20.0], [0.0, 0.1, 0.5, 30.0]])}


def constructed_pair(seed: int, T: int = 6):
    """(real, sim, seg palette frames, labels) of one episode: a robot block and a cube that move."""
    rng = np.random.default_rng(seed)
    plate = np.random.default_rng(99).integers(0, 256, (H, W, 3))  # the real backdrop: the same every episode
    sim = rng.integers(0, 256, (T, H, W, 3))
    labels = np.zeros((T, H, W), np.int32)
    for t in range(T):
        x = int(rng.integers(0, W - 12))
        labels[t, 4:20, x:x + 12] = 1  # the arm
        y, x = (int(v) for v in rng.integers(0, H - 6, 2))
        labels[t, y:y + 6, x:x + 6] = 2  # the cube, in front of the arm where they meet
    labels[:, 28:, :4] = 1  # the robot's base: never backdrop
    real = np.broadcast_to(plate, sim.shape).astype(np.float64).copy()
    X = np.concatenate([sim, np.ones((*sim.shape[:3], 1))], -1)
    for lab, A in MAPS.items():
        m = labels == lab
        real[m] = X[m] @ A.T
    real = np.clip(np.round(real), 0, 255).astype(np.uint8)
    return real, sim.astype(np.uint8), seg_to_rgb(labels), labels


def episode(real, sim, seg):
    T = len(real)
    return Episode(frames={CAM: real, sim_key(CAM): sim, seg_key(CAM): seg}, action=np.zeros((T, 8), np.float32),
                   state=np.zeros((T, 8), np.float32), fps=10, task="constructed")


def test_compositor_reproduces_the_constructed_real_frames(tmp_path):
    train = [constructed_pair(s)[:3] for s in range(3)]
    real, sim, seg, labels = constructed_pair(7)
    bases = fit_baselines(train, CAM)
    ep = episode(real, sim, seg)
    out = {k: b.apply(ep) for k, b in bases.items()}
    scores = {k: mean_psnr([(v, real)]) for k, v in out.items()}
    # the construction's own rounding is the only error left: real and compositor agree to a grey level
    assert np.abs(out["compositor"].astype(int) - real.astype(int)).max() <= 1
    assert scores["compositor"] > 50
    assert np.array_equal(out["raw"], sim) and scores["raw"] == pytest.approx(mean_psnr([(sim, real)]))
    assert scores["raw"] < 9 and scores["raw"] < scores["global_color"] < 12 < scores["compositor"]
    for lab, A in MAPS.items():
        assert np.allclose(bases["compositor"].label_maps[lab], A, atol=0.05)
    comp = bases["compositor"]
    assert not comp.plate_valid[28:, :4].any() and comp.plate_valid.mean() > 0.9
    never = ~comp.plate_valid  # backdrop pixels no training frame showed: the global map there
    assert np.array_equal(out["compositor"][:, never][labels[:, never] == 0],
                          out["global_color"][:, never][labels[:, never] == 0])
    # saved (json + safetensors) and loaded: the same frames
    comp.save(tmp_path / "comp")
    assert sorted(p.name for p in (tmp_path / "comp").iterdir()) == ["baseline.json", "baseline.safetensors"]
    assert np.array_equal(load_baseline(tmp_path / "comp").apply(ep), out["compositor"])
    assert np.array_equal(bases["global_color"].save(tmp_path / "g") and load_baseline(tmp_path / "g").apply(ep),
                          out["global_color"])
    with pytest.raises(FileNotFoundError, match="baseline.json"):
        load_baseline(tmp_path / "nothing")


def test_baselines_fit_on_a_paired_dataset(tmp_path):
    """Through a LeRobot paired dataset (lossy video): the order compositor > global colour > raw holds."""
    writer = DatasetWriter(tmp_path / "paired", 10)
    for i in range(4):
        real, sim, seg, _ = constructed_pair(i, T=8)
        writer.add_episode(episode(real, sim, seg), episode_index=i)
    writer.close()
    ds = LeRobotDataset(tmp_path / "paired")
    comp = fit_baseline("compositor", ds, CAM, episodes=[0, 1, 2])
    assert comp.fit_info["episodes"] == 3 and comp.fit_info["frames"] == 24
    held = ds.read_episode(3)
    got = {k: mean_psnr([(fit_baseline(k, ds, CAM, [0, 1, 2]).apply(held), held.frames[CAM])])
           for k in ("raw", "global_color")}
    got["compositor"] = mean_psnr([(comp.apply(held), held.frames[CAM])])
    assert got["compositor"] > got["global_color"] + 5 > got["raw"] + 5
    with pytest.raises(ValueError, match="kind"):
        fit_baseline("paint", ds, CAM, [0])
    with pytest.raises(ValueError, match="side_sim_seg"):
        list(training_pairs(ds, "side", [0]))


def test_compose_sim_turns_sim_episodes_into_compositor_frames_and_resumes(tmp_path):
    """stages.compose_sim: the policy experiment's no-network rival to the translator (``build: compose``)."""
    import json

    from comsim.pipeline.stages import compose_sim

    pairs, sim = DatasetWriter(tmp_path / "paired", 10), DatasetWriter(tmp_path / "sim", 10)
    reals = []
    for i in range(3):
        real, s, seg, _ = constructed_pair(i, T=8)
        pairs.add_episode(episode(real, s, seg), episode_index=i)
    for i in range(2):  # sim episodes: the twin's render and labels only, like a factory dataset
        real, s, seg, _ = constructed_pair(10 + i, T=8)
        reals.append(real)
        sim.add_episode(Episode(frames={sim_key(CAM): s, seg_key(CAM): seg}, action=np.zeros((8, 8), np.float32),
                                state=np.zeros((8, 8), np.float32), fps=10, task="constructed"), episode_index=i)
    pairs.close()
    sim.close()
    out = compose_sim(tmp_path / "paired", tmp_path / "sim", tmp_path / "comp")
    ds, src = LeRobotDataset(out), LeRobotDataset(tmp_path / "sim")
    assert len(ds) == 2 and set(ds.camera_keys) == {CAM, sim_key(CAM)}
    comp = fit_baseline("compositor", tmp_path / "paired", CAM, episodes=[0, 1, 2])  # what compose_sim fits
    for i, real in enumerate(reals):
        ep, sim_ep = ds.read_episode(i), src.read_episode(i)
        direct, raw = comp.apply(sim_ep), sim_ep.frames[sim_key(CAM)]
        # the compositor's frames (one more round of lossy video), far closer to the real ones than the render
        assert mean_psnr([(ep.frames[CAM], direct)]) > mean_psnr([(raw, direct)]) + 10
        assert mean_psnr([(ep.frames[CAM], real)]) > mean_psnr([(raw, real)]) + 3
        assert ep.provenance.source == "pseudo_real" and ep.provenance.extra["baseline"]["kind"] == "compositor"
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    compose_sim(tmp_path / "paired", tmp_path / "sim", tmp_path / "comp")  # finished: nothing is redone
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    with pytest.raises(ValueError, match="front_sim_seg"):  # a sim dataset without labels cannot be composed
        only = DatasetWriter(tmp_path / "nolabels", 10)
        only.add_episode(Episode(frames={sim_key(CAM): reals[0]}, action=np.zeros((8, 8), np.float32),
                                 state=np.zeros((8, 8), np.float32), fps=10, task="constructed"), episode_index=0)
        only.close()
        compose_sim(tmp_path / "paired", tmp_path / "nolabels", tmp_path / "comp2")
    assert not (tmp_path / "comp2").exists()
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 2


def test_object_crops_score_where_the_objects_are():
    real, sim, seg, labels = constructed_pair(3)
    boxes = object_crops(real, labels, size=16)
    assert {lab for _, lab, _, _ in boxes} == {2}  # objects only (label >= 2), one crop per frame
    assert len(boxes) == len(real)
    for t, _, y, x in boxes:
        assert 0 <= y <= H - 16 and 0 <= x <= W - 16
        ys, xs = np.nonzero(labels[t] == 2)
        assert y <= ys.min() and ys.max() < y + 16 and x <= xs.min() and xs.max() < x + 16
    same = pool_crop_scores([object_crop_scores(real, real, labels)])
    assert same["identical_crops"] == len(real) and same["psnr"] is None
    # a prediction perfect everywhere but the cube: the frame PSNR stays high, the crops show it
    wrong = real.copy()
    wrong[labels == 2] = 255 - wrong[labels == 2]
    frame = float(np.mean(psnr(wrong, real)))
    crops = pool_crop_scores([object_crop_scores(wrong, real, labels)])
    assert crops["crops"] == len(real) and crops["psnr"] < frame - 5
    assert set(crops["psnr_per_label"]) == {2}
    assert object_crops(real, labels, size=16, objects=[3]) == []  # only the labels asked for


def test_object_crop_lpips_with_a_small_network():
    """LPIPS on the crops (upsampled to 64 px); a random trunk: the package's network without weights."""
    lpips = pytest.importorskip("lpips")
    model = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False).eval()  # shipped linear layers
    real, sim, seg, labels = constructed_pair(4)
    same = object_crop_scores(real, real, labels, lpips_model=model)
    other = object_crop_scores(sim, real, labels, lpips_model=model)
    assert np.allclose(same["lpips_per_crop"], 0, atol=1e-6)
    assert min(other["lpips_per_crop"]) > 0
    pooled = pool_crop_scores([same, other])
    assert pooled["crops"] == 2 * len(real) and pooled["lpips"] > 0
