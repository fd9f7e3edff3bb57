"""comsim.metrics.robot_region: reference checks on frames whose answer is known, on lab renders where it
matters (docs/metrics.md, "Robot region"), and its wiring into `comsim eval video` and the lab's true masks.

The point of the instrument: a soft, doubled or see-through arm (what an MSE loss teaches on misaligned pairs)
can beat a sharp arm a pixel out of line on PSNR, even inside the robot's mask; the sharpness ratio must not."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy import ndimage  # noqa: E402

from comsim.episode import Episode  # noqa: E402
from comsim.io.labels import seg_to_rgb  # noqa: E402
from comsim.io.lerobot import write_dataset  # noqa: E402
from comsim.metrics import robot_region as rr  # noqa: E402


# ----------------------------------------------------------------------------- constructed frames


def textured(T=1, H=64, W=64, seed=0):
    rng = np.random.default_rng(seed)
    base = ndimage.gaussian_filter(rng.uniform(60, 190, (H, W, 3)), (2, 2, 0))
    return np.repeat(np.clip(base, 0, 255).astype(np.uint8)[None], T, 0)


def test_region_psnr_and_ssim_known_answers():
    ref = textured(T=2)
    mask = np.zeros(ref.shape[:3], bool)
    mask[0, 20:30, 20:30] = True  # 100 px in frame 0, none in frame 1
    pred = ref.copy()
    pred[0, 20:30, 20:25] = np.clip(ref[0, 20:30, 20:25].astype(int) + 10, 0, 255)  # half the region off by 10
    pred[0, :5] = 0  # outside the mask: does not count
    exact = ((pred[0].astype(float) - ref[0]) ** 2)[mask[0]].mean()
    got = rr.region_psnr(pred, ref, mask)
    assert got[0] == pytest.approx(10 * np.log10(255**2 / exact)) and np.isnan(got[1])
    assert rr.region_psnr(ref, ref, mask)[0] == np.inf
    # SSIM: skimage's full map, averaged over the mask's pixels
    from skimage.metrics import structural_similarity

    _, full = structural_similarity(pred[0], ref[0], gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                    data_range=255, channel_axis=-1, full=True)
    assert rr.region_ssim(pred, ref, mask)[0] == pytest.approx(full.mean(-1)[mask[0]].mean(), abs=1e-9)
    assert rr.region_ssim(ref, ref, mask)[0] == pytest.approx(1.0) and np.isnan(rr.region_ssim(pred, ref, mask)[1])


def test_identical_frames_score_the_ceiling():
    ref = textured(T=3)
    mask = np.zeros(ref.shape[:3], bool)
    mask[:, 10:40, 12:30] = True
    r = rr.pool_robot_region([rr.robot_region_scores(ref, ref, mask)])
    assert r["psnr"] == np.inf and r["ssim"] == pytest.approx(1.0) and r["sharpness"] == pytest.approx(1.0)
    assert r["seam"] == r["seam_real"] and r["frames_with_robot"] == 3 and r["frames_still"] == 3


def test_seam_score_sees_offsets_on_the_token_grid_and_not_8px_blocks():
    clean = textured(T=2, H=96, W=96, seed=1)
    assert 0.8 < rr.seam_score(rr.seam_sums(clean)) < 1.25
    rng = np.random.default_rng(2)

    def blocks(px):  # a constant offset per px x px block
        off = rng.normal(0, 6, (96 // px, 96 // px))
        return np.clip(clean.astype(float) + np.kron(off, np.ones((px, px)))[None, ..., None], 0, 255).astype(np.uint8)

    tokens, jpeg = blocks(16), blocks(8)
    assert rr.seam_score(rr.seam_sums(tokens)) > 1.5
    assert abs(rr.seam_score(rr.seam_sums(jpeg)) - 1) < 0.2  # 8-px blocks step on and off the grid alike
    # near the robot: only crossings within the mask count
    near = np.zeros(clean.shape[:3], bool)
    near[:, 40:60, 40:60] = True
    seamy_there = clean.copy()
    seamy_there[:, 32:64, 32:64] = tokens[:, 32:64, 32:64]
    assert rr.seam_score(rr.seam_sums(seamy_there, 16, near)) > rr.seam_score(rr.seam_sums(seamy_there)) > 1
    with pytest.raises(ValueError, match="even number"):
        rr.seam_sums(clean, 15)


def test_outline_motion_is_the_outline_displacement_in_px_at_128():
    T, W = 6, 64
    masks = np.zeros((T, W, W), bool)
    for t in range(T):
        x = 10 + 2 * max(0, t - 2)  # still for frames 0-2, then 2 px per frame
        masks[t, 20:40, x:x + 16] = True
    motion = rr.outline_motion(masks)
    assert motion[:2].tolist() == [0.0, 0.0]
    # 2 px per frame on the two vertical sides (40 of the 68 outline px), 0 on the others: a mean of 2 * 40 / 68 px
    # over the outline, x2 for 64 -> 128 px width
    assert motion[2:] == pytest.approx(2 * 40 / 68 * 2)
    assert rr.moving_frames(masks).tolist() == [False, False, True, True, True, True]  # frame 2 moves to 3


def test_sharpness_ratio_on_constructed_edges():
    ref = np.full((1, 64, 64, 3), 60, np.uint8)
    ref[:, 16:48, 16:48] = 200
    mask = np.zeros((1, 64, 64), bool)
    mask[:, 16:48, 16:48] = True

    def sharp(pred):
        return rr.pool_robot_region([rr.robot_region_scores(pred, ref, mask)])["sharpness"]

    assert sharp(np.roll(ref, 1, axis=2)) == pytest.approx(1.0, abs=0.01)  # 1 px off: as sharp (but corners)
    assert sharp(np.roll(ref, 2, axis=2)) == pytest.approx(1.0, abs=0.01)
    blurred = ndimage.gaussian_filter(ref.astype(float), (0, 1, 1, 0)).round().astype(np.uint8)
    assert sharp(blurred) < 0.5
    translucent = np.where(mask[..., None], 0.6 * ref + 0.4 * 60, ref).round().astype(np.uint8)
    assert sharp(translucent) == pytest.approx(0.6, abs=0.01)


# ----------------------------------------------------------------------------- a lab render


@pytest.fixture(scope="module")
def lab_frames():
    """Two lab frames (the built-in lab's look and sensor) of the arm in two poses, and their true robot masks."""
    from comsim.lab import LabEnv

    out = []
    with LabEnv(task="push") as env:
        env.reset(seed=0)
        for q in ([0.3, -0.2, 0.1, -2.1, 0.1, 2.0, 0.5], [-0.6, 0.1, 0.0, -1.6, 0.0, 1.7, 0.8]):
            env.scene.set_robot_qpos(q, 0.08)
            out.append((env.camera.rgb(np.random.default_rng(0)), env.segmentation() == 1))
    return out


def test_a_ghost_arm_wins_psnr_but_loses_sharpness_on_a_lab_frame(lab_frames):
    """Truth: the lab frame of the arm. A sharp arm drawn 1 px off, against the hedge MSE teaches when the arm may be
    1 px either side (the mean of the frame shifted by -1 and +1 px: a soft, doubled outline) and against a
    see-through arm (60% arm over the background that another pose leaves there)."""
    (frame, mask), (other, other_mask) = lab_frames
    ref, m = frame[None], mask[None]
    assert m.sum() > 300
    shifted = np.roll(ref, 1, axis=2)
    ghost = ((np.roll(ref, -1, axis=2).astype(int) + np.roll(ref, 1, axis=2)) / 2).round().astype(np.uint8)
    see_through = np.where(m[..., None] & ~other_mask[None, ..., None], 0.6 * ref + 0.4 * other[None], ref)
    see_through = see_through.round().astype(np.uint8)

    def score(pred):
        return rr.pool_robot_region([rr.robot_region_scores(pred, ref, m)])

    s, g, t = score(shifted), score(ghost), score(see_through)
    assert g["psnr"] > s["psnr"] + 2  # whole-mask PSNR rewards the hedge ...
    assert s["sharpness"] > 0.95 and g["sharpness"] < 0.85  # ... the outline does not
    assert t["sharpness"] < 0.85 < s["sharpness"]
    blurred = ndimage.gaussian_filter(ref.astype(float), (0, 1, 1, 0)).round().astype(np.uint8)
    assert score(blurred)["sharpness"] < 0.7
    # the arm's motion between the two poses: moving frames, the split by frame
    pair = np.stack([mask, other_mask])
    assert rr.moving_frames(pair).tolist() == [True, True]
    assert rr.moving_frames(np.stack([mask, mask])).tolist() == [False, False]


# ----------------------------------------------------------------------------- comsim eval video


def _labelled_dataset(root, frames, masks):
    labels = masks.astype(np.int32)  # robot = 1, background = 0
    st = np.zeros((len(frames), 8), np.float32)
    ep = Episode(frames={"front": frames, "front_sim_seg": seg_to_rgb(labels).astype(np.uint8)}, action=st,
                 state=st, fps=10, task="push")
    return write_dataset(root, [ep], fps=10, pix_fmt="yuv444p")


def test_eval_video_scores_the_robot_region_from_the_twins_labels(tmp_path, lab_frames):
    from comsim.metrics import evaluate_video

    (frame, mask), (other, other_mask) = lab_frames
    ref = np.stack([frame, frame, other])
    masks = np.stack([mask, mask, other_mask])
    blurred = ndimage.gaussian_filter(ref.astype(float), (0, 1, 1, 0)).round().astype(np.uint8)
    _labelled_dataset(tmp_path / "ref", ref, masks)
    _labelled_dataset(tmp_path / "pred", blurred, masks)
    rep = evaluate_video(tmp_path / "pred", tmp_path / "ref", camera="front", metrics=("robot",), progress=False)
    r = rep["metrics"]["robot_region"]
    assert "twin label 1 dilated 2 px" in r["mask_source"] and r["frames_with_robot"] == 3
    assert r["frames_still"] == 1 and r["frames_moving"] == 2  # frames 1-2 change pose; frame 0 repeats frame 1
    assert r["sharpness"] < 0.8 and 10 < r["psnr"] < 40 and r["seam_real"] > 0
    same = evaluate_video(tmp_path / "ref", tmp_path / "ref", camera="front", metrics=("robot",), progress=False)
    assert same["metrics"]["robot_region"]["psnr"] == np.inf and same["metrics"]["robot_region"]["sharpness"] == 1.0
    # frame folders carry no labels: the metric is unavailable, with the reason
    from PIL import Image

    (tmp_path / "frames").mkdir()
    for k, f in enumerate(ref):
        Image.fromarray(f).save(tmp_path / "frames" / f"{k:03d}.png")
    rep = evaluate_video(tmp_path / "frames", tmp_path / "frames", metrics=("robot", "psnr"), progress=False)
    assert rep["metrics"]["robot_region"] is None and "robot masks" in rep["unavailable"]["robot"]


def test_lab_truth_masks_for_a_twin_replay(tmp_path, monkeypatch):
    """A lab recording replayed in the twin: RobotMasks finds the recording from the episodes' provenance (from
    another working directory too) and returns the lab's own robot masks, which the twin's labels overlap."""
    from comsim.config import PANDA_PUSH_CELL
    from comsim.io.lerobot import LeRobotDataset
    from comsim.lab import record_dataset
    from comsim.lab.pairs import true_calibration
    from comsim.lab.twin_truth import replay_and_score
    from comsim.metrics.action import mask_iou, robot_masks_from_labels
    from comsim.pipeline.robot_masks import RobotMasks

    monkeypatch.chdir(tmp_path)
    lab = record_dataset("push", episodes=1, out="run/lab", seed=0)
    paired = replay_and_score(lab, PANDA_PUSH_CELL, "run/paired", mode="kinematic",
                              calibration=true_calibration(tmp_path / "run" / "lab"), refine=False,
                              log=lambda *a: None)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the provenance's relative path resolves from above the dataset
    with RobotMasks(tmp_path / "run" / "paired", "front") as masks:
        assert masks.has_truth and "lab truth" in masks.source
        true, silhouette = masks(0, (128, 128))
    ep = LeRobotDataset(tmp_path / paired)[0]
    assert true.shape == (len(ep), 128, 128) and silhouette is true
    twin = robot_masks_from_labels(ep.frames["front_sim_seg"])
    assert mask_iou(twin, true).mean() > 0.8  # the true camera: the twin's silhouette lies on the truth
    assert rr.moving_frames(true).any() and not rr.moving_frames(true).all()
    # `comsim eval video` takes the same truth for --ref (the twin's render scored as the prediction)
    import json

    from comsim.cli import main
    write_dataset(tmp_path / "twin", [Episode(frames={"front": ep.frames["front_sim"]}, action=ep.action,
                                              state=ep.state, fps=ep.fps, task=ep.task)], fps=10)
    assert main(["eval", "video", "--pred", str(tmp_path / "twin"), "--ref", str(tmp_path / "run" / "paired"),
                 "--camera", "front", "--metrics", "robot", "--out", str(tmp_path / "eval.json")]) == 0
    r = json.loads((tmp_path / "eval.json").read_text())["metrics"]["robot_region"]
    assert r["mask_source"].startswith("lab truth") and r["frames_with_robot"] == len(ep)
    assert 0 < r["sharpness"] and 10 < r["psnr"] < 40 and r["seam_real"] > 0
    assert main(["eval", "video", "--pred", str(tmp_path / "twin"), "--ref", str(tmp_path / "run" / "paired"),
                 "--camera", "front", "--metrics", "robot", "--recording", str(tmp_path / "twin")]) != 0
