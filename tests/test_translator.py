"""Translator tests: a micro model (dim 32, depth 2, 4 frames of 16x16) on synthetic pairs."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from diffusers import FlowMatchEulerDiscreteScheduler
from safetensors.torch import load_file

from comsim.config import ConfigError, apply_overrides, from_dict
from comsim.translator.codec import DiffusersVAECodec, PixelCodec
from comsim.translator.data import (ActionNormalizer, LatentWindowDataset, PairedWindowDataset, build_latent_cache,
                                   video_to_tensor)
from comsim.translator.guidance import compose, guided_velocity
from comsim.translator.model import CompositionalVideoDiT, velocity_from_output
from comsim.translator.pipeline import TranslatorMismatchError, TranslatorPipeline
from comsim.translator.sampling import SamplingParams
from comsim.translator.synthetic import arm_placement, make_synthetic_pairs
from comsim.translator.training import (TranslatorConfig, build_datasets, build_model, fit_on_training_pairs,
                                        flow_matching_loss, load_train_config, make_pipeline, train)

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[1]

MICRO = {
    "model": {"dim": 32, "depth": 2, "heads": 2, "patch_size": [1, 4, 4]},
    "data": {"synthetic": {"episodes": 6, "length": 12, "size": 16, "seed": 0}, "num_frames": 4,
             "resolution": [16, 16], "val_episodes": 1},
    "train": {"batch_size": 4, "max_steps": 6, "checkpointing_steps": 3, "validation_steps": 1000, "log_steps": 2,
              "warmup_steps": 0, "learning_rate": 2e-3},
    "sampling": {"num_steps": 4},
}


def micro_cfg(out, *overrides) -> TranslatorConfig:
    return from_dict(TranslatorConfig, apply_overrides(MICRO, [f"train.output_dir={out}", *overrides]))


def micro_model(seed=0, **kw) -> CompositionalVideoDiT:
    torch.manual_seed(seed)
    args = dict(in_channels=3, sim_channels=3, action_dim=8, num_frames=4, sample_size=(16, 16),
                patch_size=(1, 4, 4), dim=32, depth=2, heads=2)
    model = CompositionalVideoDiT(**{**args, **kw})
    with torch.no_grad():  # AdaLN-Zero starts at zero output: randomize so that conditions show
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.05)
    return model.eval()


def inputs(B=2, seed=0, T=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, 3, T, 16, 16, generator=g), torch.rand(B, generator=g) * 1000,
            torch.randn(B, T, 8, generator=g), torch.randn(B, 3, T, 16, 16, generator=g))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A micro translator (patch 1x2x2) trained for 150 steps (no EMA); returns its pipeline folder."""
    out = tmp_path_factory.mktemp("trained")
    cfg = micro_cfg(out, "train.max_steps=150", "train.batch_size=8", "train.use_ema=false",
                    "train.checkpointing_steps=1000", "model.patch_size=[1,2,2]")
    return train(cfg)


def test_overrides_read_exponents_as_numbers():
    """`train.learning_rate=1e-3` on the command line is a number (YAML 1.1 alone reads it as text)."""
    assert micro_cfg("unused", "train.learning_rate=1e-3").train.learning_rate == 1e-3
    with pytest.raises(ConfigError, match="train.learning_rate: expected a number, got 'fast'"):
        micro_cfg("unused", "train.learning_rate=fast")


# -- model -------------------------------------------------------------------------------------
def test_shapes_and_null_conditions():
    model = micro_model()
    x, t, a, s = inputs()
    no, yes = torch.zeros(2, dtype=torch.bool), torch.ones(2, dtype=torch.bool)
    with torch.no_grad():
        v = model(x, t, a, s, yes, yes)
        assert v.shape == x.shape
        # a dropped condition is ignored entirely, a kept one matters
        assert torch.equal(model(x, t, a, s, no, yes), model(x, t, a * 3 + 1, s, no, yes))
        assert torch.equal(model(x, t, a, s, yes, no), model(x, t, a, s * 3 + 1, yes, no))
        assert not torch.allclose(model(x, t, a, s, yes, yes), model(x, t, a * 3 + 1, s, yes, yes))
        assert not torch.allclose(model(x, t, a, s, yes, yes), model(x, t, a, s * 3 + 1, yes, yes))
        # the null sim differs from a zero sim video: the mask channel and the null bias tell them apart
        assert not torch.allclose(model(x, t, a, torch.zeros_like(s), yes, no), model(x, t, a, torch.zeros_like(s), yes, yes))


def test_each_latent_frame_gets_its_own_actions():
    # a Wan-like causal video VAE: 3 latent frames <-> 1 + 2*4 = 9 actions; frame 0 <- action 0 only
    model = micro_model(actions_per_latent_frame=4, causal_first_frame=True, num_frames=3, sample_size=(8, 8))
    assert model.expected_action_frames(3) == 9
    a = torch.randn(1, 9, 8)
    base = model._action_tokens(a, 3)
    for changed, frame in ((0, 0), (1, 1), (4, 1), (5, 2), (8, 2)):
        b = a.clone()
        b[0, changed] += 1.0
        diff = (model._action_tokens(b, 3) - base).abs().sum(-1)[0]
        assert diff[frame] > 0 and diff.sum() == diff[frame], (changed, diff)
    with pytest.raises(ValueError, match="actions must be"):
        model(torch.randn(1, 3, 3, 8, 8), torch.ones(1), torch.randn(1, 12, 8), torch.randn(1, 3, 3, 8, 8))


# -- guidance ----------------------------------------------------------------------------------
def test_guidance_composition():
    model = micro_model()
    x, t, a, s = inputs()
    with torch.no_grad():
        def single(ak, sk):
            return model(x, t, a, s, torch.full((2,), ak), torch.full((2,), sk))

        v_none, v_action, v_sim = single(False, False), single(True, False), single(False, True)
        assert torch.equal(guided_velocity(model, x, t, a, s, 0.0, 0.0), v_none)
        torch.testing.assert_close(guided_velocity(model, x, t, a, s, 1.0, 0.0), v_action, rtol=1e-5, atol=1e-5)
        expected = compose(v_none, v_action, v_sim, 1.5, 2.0)
        torch.testing.assert_close(guided_velocity(model, x, t, a, s, 1.5, 2.0), expected, rtol=1e-4, atol=1e-5)

    calls = []
    model.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    with torch.no_grad():
        guided_velocity(model, x, t, a, s, 1.5, 2.0)
    assert calls == [6]  # ONE forward with the three branches stacked (3B)


def test_sample_prediction_composes_like_velocity_prediction():
    """x-prediction: an exact x0 gives the exact velocity, and guidance composes the branches'
    x0 predictions into the same velocity as composing their velocities."""
    x, t, a, s = inputs()
    g = torch.Generator().manual_seed(3)
    x0, noise, sigma = torch.randn(2, 3, 4, 16, 16, generator=g), torch.randn(2, 3, 4, 16, 16, generator=g), \
        torch.tensor([0.3, 0.9])
    x_t = (1 - sigma.view(2, 1, 1, 1, 1)) * x0 + sigma.view(2, 1, 1, 1, 1) * noise
    torch.testing.assert_close(velocity_from_output(x0, x_t, sigma, "sample"), noise - x0, rtol=1e-5, atol=1e-5)

    model = micro_model(prediction_type="sample")
    with torch.no_grad():
        def v_of(ak, sk):
            out = model(x, t, a, s, torch.full((2,), ak), torch.full((2,), sk))
            return velocity_from_output(out, x, t / 1000.0, "sample")

        expected = compose(v_of(False, False), v_of(True, False), v_of(False, True), 1.5, 2.0)
        torch.testing.assert_close(guided_velocity(model, x, t, a, s, 1.5, 2.0), expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="sim_residual needs prediction_type='sample'"):
        CompositionalVideoDiT(sim_residual=True)


def test_sim_residual_starts_at_the_sim_video():
    """A fresh sim-residual model (zero-initialised output) predicts x0 = the sim video wherever the sim
    is given, so one sim-only Euler step returns the sim video; without the sim it predicts zeros."""
    torch.manual_seed(0)
    model = CompositionalVideoDiT(num_frames=4, sample_size=(16, 16), dim=32, depth=2, heads=2,
                                  prediction_type="sample", sim_residual=True).eval()
    x, t, a, s = inputs()
    yes, no = torch.ones(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(model(x, t, a, s, yes, yes), s)
        assert torch.equal(model(x, t, a, s, yes, no), torch.zeros_like(s))
    pipe = TranslatorPipeline(model, PixelCodec(), FlowMatchEulerDiscreteScheduler(), ActionNormalizer(np.zeros(8), np.ones(8)),
                              num_frames=4, resolution=(16, 16))
    ep = make_synthetic_pairs(1, 6, 16, seed=2)[0]
    out = pipe(ep.frames["front_sim"], ep.action, SamplingParams(w_action=0.0, w_sim=1.0, num_steps=1), seed=0)
    assert np.abs(out.astype(int) - ep.frames["front_sim"]).max() <= 1



def test_background_plate_starts_at_the_real_background(tmp_path):
    """Plates fit on the training pairs: where a held-out sim frame shows the twin's backdrop, a fresh plate
    model (zero-initialised output) predicts the REAL backdrop, much closer to the real frame than the sim
    render is; on the arm and the box it keeps the sim render. Training fits the plates and saves them with
    the weights."""
    cfg = micro_cfg(tmp_path / "run", "model.prediction_type=sample", "model.sim_residual=true",
                    "model.background_plate=true", "train.max_steps=2")
    train_ds, val_ds = build_datasets(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, PixelCodec(), 8).eval()
    share = fit_on_training_pairs(model, train_ds, PixelCodec(), cfg.model.plate_frames)["background"]
    assert 0.3 < share < 0.95  # the arm and the box cover the rest
    item = val_ds[0]
    real, sim = item["target"][None], item["sim"][None]
    ones = torch.ones(1, dtype=torch.bool)
    with torch.no_grad():
        x0 = model(torch.randn_like(real), torch.tensor([500.0]), item["actions"][None], sim, ones, ones)
    backdrop = model.shows_backdrop(sim)
    assert backdrop.float().mean() > 0.3
    err_sim = ((sim - real) ** 2)[backdrop.expand_as(sim)].mean()
    err_plate = ((x0 - real) ** 2)[backdrop.expand_as(sim)].mean()
    assert err_plate < 0.3 * err_sim, (err_plate, err_sim)
    assert torch.equal(x0[~backdrop.expand_as(sim)], sim[~backdrop.expand_as(sim)])
    with torch.no_grad():  # without the sim: the plate everywhere, so guidance never amplifies its texture
        x0_no_sim = model(torch.randn_like(real), torch.tensor([500.0]), item["actions"][None], sim, ones, ~ones)
    torch.testing.assert_close(x0_no_sim, model.plate_real[None, :, None].expand_as(x0_no_sim))

    loaded = TranslatorPipeline.from_pretrained(train(cfg)).transformer
    torch.testing.assert_close(loaded.plate_real, model.plate_real)
    torch.testing.assert_close(loaded.plate_sim, model.plate_sim)
    with pytest.raises(ValueError, match="background_plate needs sim_residual=True"):
        CompositionalVideoDiT(prediction_type="sample", background_plate=True)
    with pytest.raises(ValueError, match="runs at its own resolution"):
        model(torch.zeros(1, 3, 4, 8, 8), torch.tensor([500.0]), item["actions"][None], torch.zeros(1, 3, 4, 8, 8))

# -- data and codecs ---------------------------------------------------------------------------
def test_synthetic_pairs_and_arm_placement():
    eps = make_synthetic_pairs(3, 10, 32, seed=1)
    e = eps[0]
    assert e.frames["front"].shape == e.frames["front_sim"].shape == (10, 32, 32, 3)
    assert e.action.shape == (10, 8)
    own = arm_placement(e.frames["front"], e.action)
    other = arm_placement(e.frames["front"], eps[1].action)
    assert own["iou"] > 0.6 and own["iou"] > other["iou"] + 0.3
    assert own["centroid_err_px"] < 1.5 < other["centroid_err_px"]


def test_windows_normalization_and_latent_cache(tmp_path):
    eps = make_synthetic_pairs(3, 10, 32, seed=2)
    ds = PairedWindowDataset(eps, "front", 4, (16, 16))
    assert len(ds) == 3 * 7
    item = ds[5]
    assert item["target"].shape == item["sim"].shape == (3, 4, 16, 16)
    assert item["target"].min() >= -1 and item["target"].max() <= 1
    acts = torch.stack([ds[i]["actions"] for i in range(len(ds))])
    assert acts[..., :7].mean().abs() < 0.5  # z-scored
    cache = build_latent_cache(ds, PixelCodec(), tmp_path / "latents.safetensors")
    cached = LatentWindowDataset(cache)
    assert len(cached) == len(ds) and torch.equal(cached[5]["target"], item["target"])


def test_windows_from_a_lerobot_dataset(tmp_path):
    from comsim.io.lerobot import write_dataset

    eps = make_synthetic_pairs(4, 8, 16, seed=4)
    root = write_dataset(tmp_path / "pairs", eps, fps=10)
    ds = PairedWindowDataset([str(root)], "front", 4, (16, 16))
    assert len(ds) == 4 * 5
    ref = ActionNormalizer.from_episodes(eps)  # meta/stats.json gives the same normalization
    np.testing.assert_allclose(ds.normalizer.mean, ref.mean, atol=1e-5)
    np.testing.assert_allclose(ds.normalizer.std, ref.std, atol=1e-5)
    item = ds[6]
    direct = PairedWindowDataset(eps, "front", 4, (16, 16), normalizer=ref)
    torch.testing.assert_close(item["actions"], direct[6]["actions"])
    err = (item["sim"] - direct[6]["sim"]).abs().mean()  # H.264 at 16x16 is lossy: the same window,
    assert err < 0.1 and err < (item["sim"] - direct[11]["sim"]).abs().mean()  # not another one
    final = train(micro_cfg(tmp_path / "run", f"data.paths=[{root}]", "train.max_steps=2"))
    assert TranslatorPipeline.from_pretrained(final, expect={"action_dim": 8, "fps": 10}).fps == 10
    # data.preload: the same windows, read once into memory at the training resolution
    from comsim.translator.data import preload_source

    mem = PairedWindowDataset([preload_source(str(root), ["front", "front_sim"], (16, 16))], "front", 4, (16, 16),
                              normalizer=ds.normalizer)
    assert len(mem) == len(ds) and mem.sources[0].fps == 10
    torch.testing.assert_close(mem[6]["sim"], item["sim"])
    torch.testing.assert_close(mem[6]["actions"], item["actions"])
    final = train(micro_cfg(tmp_path / "run_mem", f"data.paths=[{root}]", "data.preload=true", "train.max_steps=2"))
    assert TranslatorPipeline.from_pretrained(final, expect={"action_dim": 8}).fps == 10
    from comsim.translator.training import build_datasets  # in-memory Episodes pass through preload as they are

    tr, val = build_datasets(micro_cfg(tmp_path / "x", "data.preload=true", "data.val_episodes=1"), sources=eps)
    assert len(tr) == 3 * 5 and len(val) == 2 and tr.sources[0].episodes[0] is eps[0]


def tiny_autoencoder_kl(path):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4,
                        layers_per_block=1, sample_size=16, scaling_factor=0.5)
    vae.save_pretrained(path)
    return path


def test_vae_codecs_offline_and_in_a_pipeline(tmp_path):
    from diffusers import AutoencoderKLWan

    codec = DiffusersVAECodec(str(tiny_autoencoder_kl(tmp_path / "vae")))
    assert (codec.latent_channels, codec.spatial_factor, codec.temporal_factor) == (4, 2, 1)
    video = torch.rand(2, 3, 4, 16, 16) * 2 - 1
    z = codec.encode(video)
    assert z.shape == (2, 4, 4, 8, 8) and codec.decode(z).shape == video.shape

    torch.manual_seed(0)
    AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, attn_scales=[],
                     temperal_downsample=[True], latents_mean=[0.1] * 4, latents_std=[2.0] * 4,
                     scale_factor_temporal=2, scale_factor_spatial=2).save_pretrained(tmp_path / "wan")
    wan = DiffusersVAECodec(str(tmp_path / "wan"), vae_class="AutoencoderKLWan")
    assert (wan.temporal_factor, wan.causal_first_frame) == (2, True)
    assert wan.latent_size(5, 16, 16) == (3, 8, 8)
    with pytest.raises(ValueError, match="1 \\+ 2\\*k frames"):
        wan.latent_size(4, 16, 16)
    assert wan.encode(torch.zeros(1, 3, 5, 16, 16)).shape == (1, 4, 3, 8, 8)

    # a pipeline on the image VAE copies the VAE in and reloads offline, bit for bit
    model = micro_model(in_channels=4, sim_channels=4, sample_size=(8, 8), patch_size=(1, 2, 2))
    cfg = TranslatorConfig()
    cfg.data.num_frames, cfg.data.resolution = 4, (16, 16)
    pipe = make_pipeline(cfg, model, codec, ActionNormalizer(np.zeros(8), np.ones(8)), fps=10)
    pipe.save_pretrained(tmp_path / "pipe")
    shutil.rmtree(tmp_path / "vae")  # the saved pipeline must not need the original folder
    again = TranslatorPipeline.from_pretrained(tmp_path / "pipe")
    eps = make_synthetic_pairs(1, 6, 16, seed=3)
    args = dict(sim_video=eps[0].frames["front_sim"], actions=eps[0].action, sampling=SamplingParams(num_steps=2), seed=1)
    assert np.array_equal(pipe(**args), again(**args))
    assert again(**args).shape == (6, 16, 16, 3)


# -- training ----------------------------------------------------------------------------------
def test_training_reduces_loss(trained):
    cfg = micro_cfg("unused")
    train_ds, _ = build_datasets(cfg)
    batch = torch.utils.data.default_collate([train_ds[i] for i in range(0, len(train_ds), 3)])

    def loss_of(model):
        g = torch.Generator().manual_seed(123)
        with torch.no_grad():
            return flow_matching_loss(model.eval(), batch["target"], batch["sim"], batch["actions"], g, cfg.train).item()

    torch.manual_seed(cfg.train.seed)
    before = loss_of(build_model(cfg, PixelCodec(), 8))  # zero output at init: E|noise - x0|^2
    after = loss_of(TranslatorPipeline.from_pretrained(trained).transformer)
    assert after < 0.3 * before, (before, after)


def test_save_load_reproduces_samples_exactly(trained, tmp_path):
    pipe = TranslatorPipeline.from_pretrained(trained)
    ep = make_synthetic_pairs(1, 7, 16, seed=9)[0]
    composed = SamplingParams(w_action=1.2, w_sim=1.5, num_steps=3)
    a = pipe(ep.frames["front_sim"], ep.action, composed, seed=4)
    pipe.save_pretrained(tmp_path / "copy")
    b = TranslatorPipeline.from_pretrained(tmp_path / "copy")(ep.frames["front_sim"], ep.action, composed, seed=4)
    assert a.shape == (7, 16, 16, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    c = pipe(ep.frames["front_sim"], ep.action, composed, seed=5)
    assert not np.array_equal(a, c)
    # batched input, and SDEdit-style strength < 1 (fewer steps from the noised sim video)
    batch = pipe(np.stack([ep.frames["front_sim"]] * 2), np.stack([ep.action] * 2), composed, seed=4)
    assert batch.shape == (2, 7, 16, 16, 3)
    pseudo = pipe.translate_episode(make_synthetic_pairs(1, 5, 32, seed=9)[0], SamplingParams(num_steps=2), seed=1)
    assert pseudo.frames["front"].shape == (5, 16, 16, 3) and pseudo.provenance.source == "pseudo_real"
    assert pseudo.provenance.translator_hash == pipe.checkpoint_hash and pseudo.provenance.guidance["w_sim"] == 1.0
    low = pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=10, strength=0.2), seed=4)
    # calls without guidance settings use the ones saved from the training config (micro: 4 steps)
    assert pipe.sampling == SamplingParams(num_steps=4, w_action=1.0, w_sim=1.0, overlap=None)
    # a smaller window overlap (fewer windows per frame) samples other frames, and the episode records it
    assert pipe.resolve_overlap() == pipe.num_frames // 2
    assert not np.array_equal(a, pipe(ep.frames["front_sim"], ep.action, SamplingParams(
        w_action=1.2, w_sim=1.5, num_steps=3, overlap=pipe.resolve_overlap() - 1), seed=4))
    assert pseudo.provenance.guidance["overlap"] == pipe.num_frames // 2
    assert np.array_equal(pipe(ep.frames["front_sim"], ep.action, seed=4),
                          pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=4, w_action=1.0, w_sim=1.0),
                               seed=4))
    assert np.abs(low.astype(int) - ep.frames["front_sim"]).mean() < np.abs(a.astype(int) - ep.frames["front_sim"]).mean()


def test_resume_reproduces_uninterrupted_run(tmp_path):
    """Asserted: bit-identical raw weights, optimizer state and EMA weights after a stop + resume."""
    extra = ("train.gradient_accumulation_steps=2",)
    full = train(micro_cfg(tmp_path / "full", *extra))
    assert train(micro_cfg(tmp_path / "cut", *extra), stop_at_step=3) is None  # "killed" after checkpoint-3
    assert sorted(p.name for p in (tmp_path / "cut").glob("checkpoint-*")) == ["checkpoint-3"]
    resumed = train(micro_cfg(tmp_path / "cut", *extra), resume_from_checkpoint="latest")
    for name in ("checkpoint-6/model.safetensors", "final/transformer/diffusion_pytorch_model.safetensors"):
        a, b = load_file(tmp_path / "full" / name), load_file(tmp_path / "cut" / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    oa = torch.load(tmp_path / "full/checkpoint-6/optimizer.bin", weights_only=True)["state"]
    ob = torch.load(tmp_path / "cut/checkpoint-6/optimizer.bin", weights_only=True)["state"]
    assert all(torch.equal(oa[i]["exp_avg_sq"], ob[i]["exp_avg_sq"]) for i in oa)
    ea, eb = load_file(tmp_path / "full/checkpoint-6/ema.safetensors"), load_file(tmp_path / "cut/checkpoint-6/ema.safetensors")
    assert len(ea) > 0 and all(torch.equal(ea[k], eb[k]) for k in ea)
    for name in ("ema.json", "lr_scheduler.json"):
        assert (tmp_path / "full/checkpoint-6" / name).read_text() == (tmp_path / "cut/checkpoint-6" / name).read_text()
    # nothing in a checkpoint needs unpickling beyond accelerate's weights_only loads
    assert not list((tmp_path / "cut").rglob("custom_checkpoint_*"))
    assert full.name == resumed.name == "final"
    # the run's summary: steps done of planned, a loss curve that keeps its history over the resume
    cut_summary = json.loads((tmp_path / "cut" / "train_summary.json").read_text())
    full_summary = json.loads((tmp_path / "full" / "train_summary.json").read_text())
    assert (cut_summary["steps_done"], cut_summary["steps_planned"], cut_summary["stopped_early"]) == (6, 6, False)
    assert [r[0] for r in cut_summary["loss"]] == [r[0] for r in full_summary["loss"]] == [2, 4, 6]
    grid = tmp_path / "cut" / cut_summary["validation"][-1]["grid"]
    assert grid.is_file() and cut_summary["validation"][-1]["step"] == 6


def test_training_summary_says_a_run_stopped_early(tmp_path):
    assert train(micro_cfg(tmp_path, "train.max_steps=4", "train.checkpointing_steps=2"), stop_at_step=2) is None
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert (summary["steps_done"], summary["steps_planned"], summary["stopped_early"]) == (2, 4, True)
    assert "resume" in summary["stop_reason"]


def test_sample_loss_compares_clean_frames():
    """train.loss_target=sample: the loss is the clean frame's squared error, whatever the noise level."""
    cfg = micro_cfg("unused", "train.loss_target=sample", "train.p_drop_sim=0", "train.p_drop_action=0")
    x0 = torch.rand(2, 3, 4, 16, 16) * 2 - 1
    zeros = lambda x_t, *args, **kw: torch.zeros_like(x_t)  # noqa: E731  (predicts x0 = 0)
    loss = flow_matching_loss(zeros, x0, x0, torch.zeros(2, 4, 8), torch.Generator().manual_seed(0), cfg.train,
                              prediction_type="sample")
    torch.testing.assert_close(loss, x0.square().mean())
    exact = lambda x_t, *args, **kw: x0  # noqa: E731
    assert flow_matching_loss(exact, x0, x0, torch.zeros(2, 4, 8), torch.Generator().manual_seed(0), cfg.train,
                              prediction_type="sample") == 0
    with pytest.raises(ValueError, match="train.loss_target must be one of"):
        micro_cfg("unused", "train.loss_target=noise")


def test_object_weight_finds_the_twins_objects_in_the_label_video():
    """train.object_weight: the loss mask is the twin's objects (labels >= 2) from the seg control video, one pixel
    wider; the weighted loss is the weighted mean of the squared error."""
    from comsim.translator.training import object_pixels
    from comsim.io.labels import seg_to_rgb

    labels = np.zeros((2, 16, 16), np.int32)
    labels[:, 2:6, 2:6] = 1  # the robot: not an object
    labels[:, 9:12, 9:12] = 2  # a cube
    sim = torch.cat([torch.zeros(1, 3, 2, 16, 16), video_to_tensor(seg_to_rgb(labels)[None])], dim=1)
    mask = object_pixels(sim, ["seg"], (2, 16, 16))
    expect = np.zeros((16, 16), bool)
    expect[8:13, 8:13] = True
    assert mask.shape == (1, 1, 2, 16, 16) and np.array_equal(mask[0, 0, 1].numpy() > 0, expect)
    cfg = micro_cfg("unused", "data.controls=[seg]", "train.object_weight=10", "train.loss_target=sample")
    x0 = torch.rand(1, 3, 2, 16, 16) * 2 - 1
    zeros = lambda x_t, *args, **kw: torch.zeros_like(x_t)  # noqa: E731
    weight = 1 + 9 * mask
    loss = flow_matching_loss(zeros, x0, sim, torch.zeros(1, 2, 8), torch.Generator(), cfg.train,
                              prediction_type="sample", weight=weight)
    torch.testing.assert_close(loss, (x0.square() * weight).sum() / weight.expand_as(x0).sum())
    with pytest.raises(ValueError, match=r"train.object_weight=10.0 needs the twin's labels: add seg to data.controls"):
        micro_cfg("unused", "train.object_weight=10")


def test_paste_twin_objects_draws_the_twins_cube_in_the_real_colour():
    """paste_twin_objects: the colour map of each object label is fit on the training pairs' object pixels (shrunk
    by one pixel); a sample with sim then shows, on the pixels the label video gives to that object, the twin's
    render through that map, whatever the network draws; elsewhere, and without sim, the network's frame."""
    from comsim.io.labels import seg_to_rgb

    labels = np.zeros((4, 16, 16), np.int32)
    labels[:, 2:6, 2:6] = 1  # the robot: never pasted
    labels[:, 8:13, 9:14] = 2  # the red cube
    seg = video_to_tensor(seg_to_rgb(labels)[None])  # (1, 3, 4, 16, 16) in [-1, 1]
    g = torch.Generator().manual_seed(0)
    render = torch.rand(1, 3, 4, 16, 16, generator=g) * 2 - 1
    sim = torch.cat([render, seg], dim=1)
    A = torch.tensor([[0.5, 0.1, 0.0], [0.0, 0.7, 0.0], [0.2, 0.0, 0.4]])
    real = torch.rand(1, 3, 4, 16, 16, generator=g) * 2 - 1
    cube = torch.as_tensor(labels == 2)[None, None].expand_as(real)
    real[cube] = (torch.einsum("ij,bjthw->bithw", A, render) + torch.tensor([0.1, -0.2, 0.3]).view(1, 3, 1, 1, 1))[cube]
    kw = dict(in_channels=3, sim_channels=6, action_dim=8, num_frames=4, sample_size=(16, 16), patch_size=(1, 8, 8),
              dim=32, depth=1, heads=2, prediction_type="sample", sim_residual=True, paste_twin_objects=True,
              seg_channel=3)
    model = CompositionalVideoDiT(**kw)
    flat = lambda v: v.transpose(1, 2).flatten(0, 1)  # noqa: E731  (B, C, T, H, W) -> (B*T, C, H, W)
    counts = model.fit_object_colours(flat(real), flat(sim), min_pixels=10)
    assert counts[2] == 4 * 3 * 3 and counts[3] == 0  # the 5x5 cube shrunk to 3x3, in 4 frames; no blue cube
    torch.testing.assert_close(model.object_colour[0], torch.cat([A, torch.tensor([[0.1], [-0.2], [0.3]])], 1))
    torch.testing.assert_close(model.object_colour[1], torch.cat([torch.eye(3), torch.zeros(3, 1)], 1))  # identity
    with torch.no_grad():
        model.proj_out.bias.fill_(0.3)  # the network draws something else everywhere
        x = torch.randn(2, 3, 4, 16, 16, generator=g)
        keep = torch.tensor([True, False])
        out = model(x, torch.tensor([500.0, 500.0]), torch.zeros(2, 4, 8), sim.expand(2, -1, -1, -1, -1), sim_keep=keep)
    torch.testing.assert_close(out[0][cube[0]], real[0][cube[0]])  # the whole cube, its edge included
    torch.testing.assert_close(out[0][~cube[0]], (render[0] + 0.3)[~cube[0]])
    assert (out[1] - 0.3).abs().max() < 1e-6  # sim dropped: no twin to paste from
    with pytest.raises(ValueError, match="paste_twin_objects needs"):
        CompositionalVideoDiT(**{**kw, "seg_channel": -1})
    with pytest.raises(ValueError, match=r"model.paste_twin_objects=true needs .* seg in data.controls"):
        micro_cfg("unused", "model.prediction_type=sample", "model.sim_residual=true", "model.paste_twin_objects=true")


def test_config_names_a_resolution_the_patch_does_not_divide():
    with pytest.raises(ValueError, match=r"data.resolution=\[100, 100\].*model.patch_size=\[1, 16, 16\]"):
        micro_cfg("unused", "data.resolution=[100,100]", "model.patch_size=[1,16,16]")
    with pytest.raises(ValueError, match=r"sampling.overlap must be in \[1, data.num_frames=4\)"):
        micro_cfg("unused", "data.num_frames=4", "sampling.overlap=4")
    with pytest.raises(ValueError, match="model.pixel_head replaces the per-token output.*needs model.sim_residual=true"):
        micro_cfg("unused", "data.resolution=[32,32]", "model.patch_size=[1,16,16]", "model.pixel_head=4")


def test_two_process_cpu_ddp(tmp_path):
    cfg = tmp_path / "micro.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump(apply_overrides(MICRO, [f"train.output_dir={tmp_path / 'ddp'}"])))
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(ROOT / "train/train_translator.py"), "--config", str(cfg)]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 process(es)" in r.stdout
    assert (tmp_path / "ddp/final/transformer/diffusion_pytorch_model.safetensors").is_file()
    assert (tmp_path / "ddp/checkpoint-6").is_dir()


# -- long episodes -----------------------------------------------------------------------------
def test_long_episode_windows_without_seams(trained):
    pipe = TranslatorPipeline.from_pretrained(trained)
    ep = make_synthetic_pairs(1, 15, 16, seed=11)[0]
    out = pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=8, overlap=2), seed=0)
    assert out.shape == (15, 16, 16, 3)
    # windows start at 0, 2, 4, 6, 8, 10, 11 (the last one aligned to the end): fresh frames begin at 4, 6, ...
    diffs = np.abs(np.diff(out.astype(np.float64), axis=0)).mean(axis=(1, 2, 3))  # diffs[i]: frame i -> i+1
    boundary = [3, 5, 7, 9, 11, 13]
    within = [i for i in range(len(diffs)) if i not in boundary]
    assert diffs[boundary].mean() <= 1.25 * diffs[within].mean(), (diffs[boundary], diffs[within])
    # a window shorter than the model's is padded, then cut back
    assert pipe(ep.frames["front_sim"][:3], ep.action[:3], SamplingParams(num_steps=2)).shape == (3, 16, 16, 3)


def test_window_overlap_is_pinned_to_the_previous_result(trained):
    """The mechanism behind the seamless windows: overlap latents re-noised from the previous result."""
    pipe = TranslatorPipeline.from_pretrained(trained)
    ep = make_synthetic_pairs(1, 4, 16, seed=12)[0]
    sim = video_to_tensor(ep.frames["front_sim"][None])
    act = torch.from_numpy(pipe.normalizer.normalize(ep.action[None]))
    noise = torch.randn(1, 3, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    known = video_to_tensor(ep.frames["front_sim"][None, 1:3])  # "the previous window made" sim-looking frames
    pinned = pipe._sample_window(sim, act, noise, 8, 0.0, 0.0, 1.0, known)
    free = pipe._sample_window(sim, act, noise, 8, 0.0, 0.0, 1.0, None)
    assert (pinned[:, :, :2] - known).abs().mean() < 0.02
    assert (free[:, :, :2] - known).abs().mean() > 0.2  # left alone, the model makes real-looking ones


# -- bad input ---------------------------------------------------------------------------------
def test_bad_inputs_fail_before_compute(trained, tmp_path):
    pipe = TranslatorPipeline.from_pretrained(trained)

    def boom(*a, **k):
        raise AssertionError("the model ran before the input was checked")

    pipe.transformer.forward = boom
    ep = make_synthetic_pairs(1, 6, 16, seed=5)[0]
    sim, act = ep.frames["front_sim"], ep.action
    with pytest.raises(ValueError, match="action_dim=8"):
        pipe(sim, act[:, :7])
    with pytest.raises(ValueError, match="actions cover 5 frames .* sim_video has 6 frames"):
        pipe(sim, act[:5])
    with pytest.raises(ValueError, match="32x32 .* works at 16x16"):
        pipe(make_synthetic_pairs(1, 6, 32, seed=5)[0].frames["front_sim"], act)
    with pytest.raises(ValueError, match="uint8"):
        pipe(sim.astype(np.float32), act)
    with pytest.raises(TranslatorMismatchError, match="action_dim=8, expected 7"):
        TranslatorPipeline.from_pretrained(trained, expect={"action_dim": 7})
    # resuming a run with a different architecture names the field and both values
    run = tmp_path / "run"
    shutil.copytree(Path(trained).parent, run)
    with pytest.raises(TranslatorMismatchError, match="model.dim: checkpoint 32 vs config 48"):
        train(micro_cfg(run, "model.dim=48"), resume_from_checkpoint="latest")
    # ... every differing field, including what the weights mean (velocity vs x-prediction)
    with pytest.raises(TranslatorMismatchError, match="model.depth: .*model.prediction_type: checkpoint "):
        train(micro_cfg(run, "model.depth=3", "model.prediction_type=sample"), resume_from_checkpoint="latest")


def test_gpu_config_builds_and_takes_a_training_step_on_the_cpu(tmp_path):
    """configs/translator/gpu_256.yaml at its full model size (one step, 2 frames, batch 1: a CPU can afford it)."""
    cfg = load_train_config(ROOT / "configs" / "translator" / "gpu_256.yaml", [
        f"train.output_dir={tmp_path}", "train.max_steps=1", "train.batch_size=1", "data.num_frames=2",
        "data.num_workers=0", "data.val_episodes=0", "data.synthetic.episodes=2", "data.synthetic.length=3",
        "data.synthetic.size=256", "train.checkpointing_steps=1", "train.warmup_steps=0",
        # synthetic pairs have no label or normal videos: the backdrop by colour, no pasted objects, no edge term
        "data.controls=[]", "model.paste_twin_objects=false", "model.backdrop_from=colour", "train.edge_weight=0"])
    final = train(cfg)
    pipe = TranslatorPipeline.from_pretrained(final)
    assert pipe.resolution == (256, 256) and pipe.transformer.config.dim == 512
    assert pipe.transformer.config.pixel_head == 16 and pipe.transformer.config.background_plate
    assert sum(p.numel() for p in pipe.transformer.parameters()) > 30e6


def test_a_saved_model_with_a_removed_output_head_is_refused_by_name(trained, tmp_path):
    """A checkpoint trained with an output head this version no longer has cannot be run: refused, naming the file
    and the option, before any weight is read; the same option at 0 (off) loads."""
    import json

    for value, refused in ((4, True), (0, False)):
        copy = tmp_path / f"local_affine_{value}"
        shutil.copytree(trained, copy)
        config = copy / "transformer" / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "local_affine": value}))
        if refused:
            with pytest.raises(TranslatorMismatchError, match=r"transformer/config.json: local_affine=4 .*pixel_head"):
                TranslatorPipeline.from_pretrained(copy)
        else:
            assert TranslatorPipeline.from_pretrained(copy).transformer.config.pixel_head == \
                TranslatorPipeline.from_pretrained(trained).transformer.config.pixel_head


def test_save_pretrained_replaces_only_its_own_folders(trained, tmp_path):
    pipe = TranslatorPipeline.from_pretrained(trained)
    pipe.save_pretrained(tmp_path / "a")
    pipe.save_pretrained(tmp_path / "a")  # its own folder: replaced
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep")
    with pytest.raises(TranslatorMismatchError, match="not a translator pipeline folder"):
        pipe.save_pretrained(user)
    assert (user / "notes.txt").read_text() == "keep"


def test_label_backdrop_keeps_a_robot_pixel_the_colour_of_the_wall():
    """backdrop_from=labels: the residual starts from the real plate where the twin's labels say background, and
    from the twin's render on the robot even where the robot's colour equals the twin's backdrop there (the colour
    test took such pixels for backdrop and drew the wall through the arm)."""
    from comsim.io.labels import seg_to_rgb

    labels = np.zeros((4, 16, 16), np.int32)
    labels[:, 4:12, 6:10] = 1  # the arm
    seg = video_to_tensor(seg_to_rgb(labels)[None])  # (1, 3, 4, 16, 16) in [-1, 1]
    g = torch.Generator().manual_seed(0)
    twin_wall = torch.rand(1, 3, 1, 16, 16, generator=g) * 2 - 1
    render = twin_wall.expand(1, 3, 4, 16, 16).clone()  # the arm drawn in the wall's own colours
    sim = torch.cat([render, seg], dim=1)
    real = torch.rand(1, 3, 4, 16, 16, generator=g) * 2 - 1
    kw = dict(in_channels=3, sim_channels=6, action_dim=8, num_frames=4, sample_size=(16, 16), patch_size=(1, 8, 8),
              dim=32, depth=1, heads=2, prediction_type="sample", sim_residual=True, background_plate=True, seg_channel=3)
    flat = lambda v: v.transpose(1, 2).flatten(0, 1)  # noqa: E731  (B, C, T, H, W) -> (B*T, C, H, W)
    arm = torch.as_tensor(labels == 1)[None, None].expand(1, 3, 4, 16, 16)
    for source, arm_is_backdrop in (("colour", True), ("labels", False)):
        model = CompositionalVideoDiT(**kw, backdrop_from=source).eval()
        model.fit_background_plate(flat(real), flat(sim))
        backdrop = model.shows_backdrop(sim)[:, 0]
        assert bool(backdrop[0][torch.as_tensor(labels == 1)].all()) == arm_is_backdrop
        assert backdrop[0][torch.as_tensor(labels == 0)].all()
        ones = torch.ones(1, dtype=torch.bool)
        with torch.no_grad():
            x0 = model(torch.randn_like(real), torch.tensor([500.0]), torch.zeros(1, 4, 8), sim, ones, ones)
        if source == "labels":  # a fresh model: the twin's arm where the labels put it, the real plate elsewhere
            torch.testing.assert_close(x0[arm], render[arm])
            torch.testing.assert_close(x0[~arm], model.plate_real[None, :, None].expand_as(x0)[~arm])
    with pytest.raises(ValueError, match="backdrop_from='labels' needs pixel latents"):
        CompositionalVideoDiT(**{**kw, "seg_channel": -1}, backdrop_from="labels")


def test_pixel_head_draws_no_token_grid():
    """pixel_head: a fresh head returns the residual's start exactly; a change in one token's features changes
    pixels beyond its own block (its cells are upsampled bilinearly into its neighbours'), where the per-token
    output changes exactly its block, one square of paint per token; the gradient reaches the token projection."""
    kw = dict(in_channels=3, sim_channels=6, action_dim=8, num_frames=2, sample_size=(32, 32), patch_size=(1, 8, 8),
              dim=32, depth=1, heads=2, prediction_type="sample", sim_residual=True)
    g = torch.Generator().manual_seed(1)
    x, s = torch.randn(2, 3, 2, 32, 32, generator=g), torch.randn(2, 6, 2, 32, 32, generator=g) * 0.1
    t, a = torch.rand(2, generator=g) * 1000, torch.randn(2, 2, 8, generator=g)
    torch.manual_seed(0)
    head = CompositionalVideoDiT(**kw, pixel_head=4, head_cells=2)
    torch.manual_seed(0)
    per_token = CompositionalVideoDiT(**kw)
    with torch.no_grad():
        assert torch.equal(head(x, t, a, s), s[:, :3])
        for m in (head, per_token):
            torch.manual_seed(2)
            for p in m.parameters():
                if p.abs().sum() == 0:
                    p.normal_(0, 0.2)
        h = torch.randn(2, 2 * 4 * 4, 32, generator=g)  # tokens (B, T*Ht*Wt, D)
        h2 = h.clone()
        h2[:, 5] += 1.0  # frame 0, token row 1, column 1: pixels 8..15 x 8..15
        start, sim, mask = s[:, :3], s, torch.ones(2, 1, 2, 32, 32)
        changed_head = (head._pixel_head(h2, start, sim, mask, (2, 4, 4))
                        - head._pixel_head(h, start, sim, mask, (2, 4, 4))).abs().amax((0, 1)) > 1e-6
        paint = lambda hh: rearrange(per_token.proj_out(hh), "b (t h w) (c ph pw) -> b c t (h ph) (w pw)",  # noqa: E731
                                     t=2, h=4, w=4, ph=8, pw=8)
        changed_token = (paint(h2) - paint(h)).abs().amax((0, 1)) > 1e-6
    block = torch.zeros(2, 32, 32, dtype=torch.bool)
    block[0, 8:16, 8:16] = True
    assert torch.equal(changed_token, block)
    assert changed_head[block].all() and changed_head[~block].sum() > 8 * 4 and not changed_head[1].any()
    head(x, t, a, s).square().mean().backward()
    assert head.head_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="pixel_head replaces the per-token output.*needs sim_residual=True"):
        CompositionalVideoDiT(**{**kw, "sim_residual": False}, pixel_head=4)
    with pytest.raises(ConfigError, match="model.head_cells: expected an integer >= 1 dividing the patch's 4x4"):
        micro_cfg("unused", "model.prediction_type=sample", "model.sim_residual=true", "model.pixel_head=4",
                  "model.head_cells=3")


def test_twin_object_labels_finds_each_palette_colour_within_the_tolerance():
    """A label video of palette colours, each pixel nudged by a distance just inside or just outside the decode
    tolerance: a pixel is object l exactly when it was painted l's colour and nudged inside; backdrop, robot and
    the pixels nudged outside are no object."""
    from comsim.io.labels import SEG_DECODE_TOLERANCE, SEG_PALETTE
    from comsim.translator.model import twin_object_labels
    g = torch.Generator().manual_seed(0)
    palette = torch.as_tensor(SEG_PALETTE, dtype=torch.float32)
    painted = torch.randint(0, len(SEG_PALETTE), (2, 3, 16, 16), generator=g)
    direction = F.normalize(torch.randn(2, 3, 16, 16, 3, generator=g), dim=-1)
    inside = torch.rand(2, 3, 16, 16, generator=g) < 0.7
    radius = torch.where(inside, 0.9, 1.1) * SEG_DECODE_TOLERANCE
    video = ((palette[painted] + radius[..., None] * direction) / 127.5 - 1.0).permute(0, 4, 1, 2, 3)
    labels = twin_object_labels(video)  # (N, L, T, H, W)
    assert labels.shape == (2, len(SEG_PALETTE) - 2, 3, 16, 16)
    for l in range(len(SEG_PALETTE) - 2):
        assert torch.equal(labels[:, l], (painted == l + 2) & inside)


def test_the_last_sampling_step_lands_on_the_prediction():
    """A clean-frame (x-prediction) model samples at noise levels 1, 3/4, 1/2, 1/4 and ends at 0, so its last
    Euler step returns the model's prediction itself: a fresh sim-residual model (x0 = the sim video whatever the
    input) gives back the sim video exactly, not 0.1% of the noise away."""
    torch.manual_seed(0)
    model = CompositionalVideoDiT(num_frames=4, sample_size=(16, 16), dim=32, depth=2, heads=2,
                                  prediction_type="sample", sim_residual=True).eval()
    pipe = TranslatorPipeline(model, PixelCodec(), FlowMatchEulerDiscreteScheduler(),
                              ActionNormalizer(np.zeros(8), np.ones(8)), num_frames=4, resolution=(16, 16))
    pipe._timesteps(4, 1.0)
    torch.testing.assert_close(pipe.scheduler.sigmas, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    _, _, a, s = inputs()
    noise = torch.randn(s.shape, generator=torch.Generator().manual_seed(3))
    x = pipe._sample_window(s, a, noise, 4, 0.0, 1.0, 1.0)
    assert (x - s).abs().max() < 1e-5


def test_edge_loss_charges_a_faded_arm_edge_not_a_shifted_crisp_one():
    """Around the twin's robot outline, a faded arm (the blend of the arm where the twin put it and where the real
    frame has it) has half the real edge strength and costs; the crisp arm a pixel off costs nothing. The band is
    the +-2 px ring around the seg control's robot label, and nothing else."""
    from comsim.translator.training import edge_loss, robot_edge_band

    twin = torch.full((1, 3, 1, 32, 32), -0.5)
    twin[..., 10:22, 12:15] = 0.8
    real = torch.roll(twin, 1, dims=-1)
    blend = (twin + real) / 2
    seg = torch.full((1, 3, 1, 32, 32), -1.0)
    seg[..., 10:22, 12:15] = 1.0  # the robot's label colour (white)
    band = robot_edge_band(torch.cat([twin, seg], 1), ("seg",))
    assert band.shape == (1, 1, 1, 32, 32)
    assert band[0, 0, 0, 16, 10] == 1 and band[0, 0, 0, 16, 16] == 1  # 2 px either side of the link
    assert band[0, 0, 0, 16, 9] == 0 and band[0, 0, 0, 16, 17] == 0 and band[0, 0, 0, 2, 2] == 0
    assert edge_loss(twin, real, band) < 1e-6 < 0.05 < edge_loss(blend, real, band)
    with pytest.raises(ValueError, match="train.edge_weight compares the clean frame's edges"):
        micro_cfg("unused", "train.edge_weight=0.1")
