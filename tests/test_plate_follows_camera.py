"""model.plate_follows_camera: the real background plate moves with the camera's per-frame shift that the twin's
replay measured (its paired dataset's twin_alignment.json), relative to where the plate was fit."""
import json

import numpy as np
import pytest
import torch

from comsim.config import apply_overrides, from_dict
from comsim.errors import InputError
from comsim.translator.data import PairedWindowDataset, camera_shifts
from comsim.translator.model import CompositionalVideoDiT
from comsim.translator.synthetic import make_synthetic_pairs
from comsim.translator.training import TranslatorConfig, train

KW = dict(in_channels=3, sim_channels=3, action_dim=8, num_frames=2, sample_size=(16, 16), patch_size=(1, 4, 4),
          dim=32, depth=1, heads=2, prediction_type="sample", sim_residual=True, background_plate=True,
          plate_tolerance=10.0)  # every sim pixel counts as backdrop: the start is the plate everywhere


def step_plate(model, x_edge: int = 8):
    plate = torch.full((3, 16, 16), -0.5)
    plate[:, :, x_edge:] = 0.5
    model.plate_real.copy_(plate)


def edge_column(start: torch.Tensor) -> float:
    """Where the plate's vertical step sits in (3, H, W): the sub-pixel x of the half-way crossing, row 8."""
    row = start[0, 8].numpy()
    i = int(np.argmax(row > 0))  # first pixel past half way
    return i - 1 + (0.0 - row[i - 1]) / (row[i] - row[i - 1]) + 0.5  # pixel centres at i + 0.5


def test_the_plate_moves_by_the_camera_shift_relative_to_its_fit_frames():
    model = CompositionalVideoDiT(**KW, plate_follows_camera=True)
    still = CompositionalVideoDiT(**KW)
    for m in (model, still):
        step_plate(m)
    sim = torch.zeros(1, 3, 2, 16, 16)
    base = edge_column(model.residual_start(sim)[0, :, 0])
    assert base == pytest.approx(8.0, abs=1e-4)
    shift = torch.tensor([[[2.0, 0.0], [0.5, 1.0]]])  # frame 0: 2 px right; frame 1: half a pixel right, 1 down
    start = model.residual_start(sim, shift)[0]
    assert edge_column(start[:, 0]) == pytest.approx(10.0, abs=1e-4)
    assert edge_column(start[:, 1]) == pytest.approx(8.5, abs=1e-4)
    # a model whose plate does not follow ignores the shift; so does a zero shift at a zero reference
    assert torch.equal(still.residual_start(sim, shift), still.residual_start(sim))
    assert torch.equal(model.residual_start(sim, torch.zeros(1, 2, 2)), still.residual_start(sim))
    # fit on frames whose camera sat 1 px right on average: that is where the plate is, so a shift of 1 px
    # leaves it in place and a factory episode (no shift) sees it 1 px left
    n = 6
    model.fit_background_plate(torch.zeros(n, 3, 16, 16), torch.zeros(n, 3, 16, 16),
                               torch.tensor([[1.0, 0.0]] * n))
    assert model.plate_shift_px.tolist() == [1.0, 0.0]
    step_plate(model)
    assert edge_column(model.residual_start(sim, torch.tensor([[[1.0, 0.0]] * 2]))[0, :, 0]) == pytest.approx(8.0, abs=1e-4)
    assert edge_column(model.residual_start(sim)[0, :, 0]) == pytest.approx(7.0, abs=1e-4)
    with pytest.raises(ValueError, match="plate_follows_camera .* needs background_plate=True"):
        CompositionalVideoDiT(**{**KW, "background_plate": False}, plate_follows_camera=True)


def test_camera_shifts_read_the_replays_alignment_file(tmp_path):
    assert camera_shifts(tmp_path) == {}
    track = [[0.1 * k, -0.2] for k in range(12)]
    (tmp_path / "twin_alignment.json").write_text(json.dumps({"camera_motion": {
        "0": {"moved": True, "track_px": track}, "1": {"moved": False, "track_px": track}}}))
    shifts = camera_shifts(tmp_path)
    assert list(shifts) == [0] and shifts[0].shape == (12, 2) and shifts[0][3].tolist() == pytest.approx([0.3, -0.2])
    # a window of a paired dataset carries its frames' shifts; an episode that did not move carries zeros
    ds = PairedWindowDataset(make_synthetic_pairs(2, 12, 16, seed=0), "front", 4, (16, 16))
    ds.sources[0].camera_shifts = shifts
    windows = {(e, t): i for i, (_, e, t) in enumerate(ds.index)}
    assert ds[windows[(0, 5)]]["camera_shift"].numpy() == pytest.approx(np.asarray(track[5:9], np.float32))
    assert not ds[windows[(1, 5)]]["camera_shift"].any()
    ds.sources[0].camera_shifts = {0: shifts[0][:7]}  # a track that does not cover the episode
    with pytest.raises(InputError, match=r"camera_motion.0.track_px: expected 12 frames"):
        ds[windows[(0, 0)]]
    (tmp_path / "twin_alignment.json").write_text(json.dumps({"camera_motion": {"0": {"moved": True}}}))
    with pytest.raises(InputError, match=r"twin_alignment.json: camera_motion: expected"):
        camera_shifts(tmp_path)


def test_a_model_whose_plate_follows_the_camera_trains_saves_and_translates(tmp_path):
    from comsim.translator.pipeline import TranslatorPipeline

    cfg = from_dict(TranslatorConfig, apply_overrides({
        "model": {"dim": 32, "depth": 1, "heads": 2, "patch_size": [1, 4, 4], "prediction_type": "sample",
                  "sim_residual": True, "background_plate": True, "plate_follows_camera": True},
        "data": {"synthetic": {"episodes": 4, "length": 8, "size": 16, "seed": 0}, "num_frames": 4,
                 "resolution": [16, 16], "val_episodes": 1},
        "train": {"batch_size": 2, "max_steps": 2, "checkpointing_steps": 2, "validation_steps": 1000,
                  "warmup_steps": 0, "loss_target": "sample"},
        "sampling": {"num_steps": 2}}, [f"train.output_dir={tmp_path}"]))
    pipe = TranslatorPipeline.from_pretrained(train(cfg))
    assert pipe.transformer.config.plate_follows_camera and pipe.transformer.plate_shift_px.tolist() == [0.0, 0.0]
    ep = make_synthetic_pairs(1, 6, 16, seed=3)[0]
    plain = pipe.translate_episode(ep, seed=0).frames["front"]
    moved = pipe.translate_episode(ep, seed=0, camera_shift=np.full((6, 2), 3.0, np.float32)).frames["front"]
    assert plain.shape == moved.shape == (6, 16, 16, 3) and not np.array_equal(plain, moved)
    with pytest.raises(ValueError, match=r"camera_shift: expected \(6, 2\) px per frame"):
        pipe.translate_episode(ep, seed=0, camera_shift=np.zeros((5, 2)))
    with pytest.raises(ValueError, match="model.plate_follows_camera .* needs model.background_plate=true"):
        from_dict(TranslatorConfig, apply_overrides({"model": {"plate_follows_camera": True}}, []))


def test_the_compositor_plate_follows_the_camera_too():
    """The no-network baseline gets the same information: its plate sits at its frames' mean shift and moves with
    each frame's; without shifts it is the plate as before, and it survives save/load."""
    from comsim.io.labels import seg_to_rgb
    from comsim.translator.compositor import fit_baselines, load_baseline

    def frames(x_edge, T=10):
        img = np.full((T, 16, 16, 3), 60, np.uint8)
        img[:, :, x_edge:] = 200
        return img

    seg = seg_to_rgb(np.zeros((10, 16, 16), np.int64)).astype(np.uint8)  # all backdrop
    pairs = [(frames(8), frames(8), seg, np.full((10, 2), [1.0, 0.0])),  # camera 1 px right: the wall's edge at 8
             (frames(8), frames(8), seg, np.full((10, 2), [1.0, 0.0]))]
    comp = fit_baselines(pairs, "front")["compositor"]
    assert comp.plate_shift_px == (1.0, 0.0)
    sim = frames(8, T=2)
    assert (comp.apply_frames(sim, seg[:2], np.full((2, 2), [1.0, 0.0]))[:, 8, 7:9, 0] == [60, 200]).all()
    moved = comp.apply_frames(sim, seg[:2], np.full((2, 2), [3.0, 0.0]))  # 2 px further right
    assert (moved[:, 8, 9:11, 0] == [60, 200]).all()
    factory = comp.apply_frames(sim, seg[:2])  # the calibrated camera: 1 px left of the fit frames
    assert (factory[:, 8, 6:8, 0] == [60, 200]).all()
    still = fit_baselines([p[:3] for p in pairs], "front")["compositor"]  # no shifts: the plate as fit, unmoved
    assert still.plate_shift_px == (0.0, 0.0) and np.array_equal(still.apply_frames(sim, seg[:2]), sim)
    with pytest.raises(ValueError, match=r"camera_shift: expected \(2, 2\) px per frame"):
        comp.apply_frames(sim, seg[:2], np.zeros((3, 2)))


def test_a_saved_compositor_keeps_its_plate_shift(tmp_path):
    from comsim.io.labels import seg_to_rgb
    from comsim.translator.compositor import fit_baselines, load_baseline

    seg = seg_to_rgb(np.zeros((4, 16, 16), np.int64)).astype(np.uint8)
    img = np.random.default_rng(0).integers(0, 255, (4, 16, 16, 3), dtype=np.uint8)
    comp = fit_baselines([(img, img, seg, np.full((4, 2), [0.5, -0.25]))], "front")["compositor"]
    comp.save(tmp_path / "c")
    back = load_baseline(tmp_path / "c")
    assert back.plate_shift_px == (0.5, -0.25)
    assert np.array_equal(back.apply_frames(img, seg, np.zeros((4, 2))), comp.apply_frames(img, seg, np.zeros((4, 2))))
