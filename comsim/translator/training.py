"""Training loop of the translator (``train/train_translator.py`` is its entry point).

Objective: rectified flow in the convention of diffusers' FlowMatchEulerDiscreteScheduler:
``x_t = (1 - t) x0 + t noise``, the model predicts ``v = noise - x0`` at timestep ``1000 t``,
``t ~ sigmoid(N(m, s))`` (logit-normal). The action and the sim condition are each dropped
independently (``p_drop_action``, ``p_drop_sim``) so that sampling can compose them.

Determinism: every random draw of micro-step m on process r (batch indices, noise, t, drops)
comes from a generator seeded by (seed, m, r). Together with the model, optimizer, LR
schedule and EMA saved in ``checkpoint-{step}``, resuming reproduces an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from comsim.config import ConfigError, load_config, to_dict
from comsim.episode import Episode, resize_frames
from comsim.io.files import write_json
from comsim.io.keys import control_key, sim_key
from comsim.io.labels import SEG_DECODE_TOLERANCE, SEG_PALETTE
from comsim.io.lock import output_lock
from comsim.io.paths import OutputFolderError, check_output_path, claim_output
from comsim.io.video import write_video
from comsim.memory import keep_freed_memory
from comsim.metrics.frame import mean_psnr
from comsim.translator.codec import build_codec
from comsim.translator.data import (LatentWindowDataset, PairedWindowDataset, build_latent_cache, encode_condition,
                                    preload_source, split_episodes)
from comsim.translator.model import PREDICTION_TYPES, CompositionalVideoDiT, twin_object_labels, velocity_from_output
from comsim.translator.sampling import SamplingParams
from comsim.translator.pipeline import TranslatorMismatchError, TranslatorPipeline


LOSS_TARGETS = ("velocity", "sample")
TRAIN_COMMAND = "train_translator"
MANIFEST = "training.json"  # output_dir's ownership manifest (comsim.io.paths.claim_output)


# -- config ---------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    dim: int = 128
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    patch_size: tuple[int, int, int] = (1, 4, 4)
    abs_pos_embed: bool = True  # absolute 2D sin-cos on top of the 3D RoPE
    action_fourier: int = 4  # sin/cos features of the actions (0: raw values only)
    prediction_type: str = "velocity"  # velocity (v = noise - x0) | sample (x0, JiT-style; see model.py)
    sim_residual: bool = False  # sample only: x0 = sim + output when the sim video is given
    patch_bottleneck: int = 0  # > 0: JiT-style bottleneck patch embedding (large pixel patches)
    # the twin's objects (labels >= 2 of the seg control) drawn as its render, recoloured per label (pixel codec)
    paste_twin_objects: bool = False
    background_plate: bool = False  # sim_residual: start from the real background plate where the sim shows it
    plate_tolerance: float = 0.38  # latent units summed over channels (0.38: 48 grey levels in pixel space)
    plate_frames: int = 512  # training frames the plates are fit on (evenly spread)
    # where the residual starts from the plate: "labels" (the twin's label 0, needs seg in data.controls) or
    # "colour" (the render within plate_tolerance of the twin's plate)
    backdrop_from: str = "colour"
    # > 0: a full-resolution head of this many channels replaces the per-token output (see model.py)
    pixel_head: int = 0
    head_cells: int = 4  # pixel_head: feature cells per patch side, upsampled bilinearly to every pixel
    # background_plate (pixel codec): the real plate moves with the camera's per-frame shift that the twin's replay
    # measured and rendered (its paired dataset's twin_alignment.json; 0 for factory episodes)
    plate_follows_camera: bool = False
    gradient_checkpointing: bool = False


@dataclass
class CodecConfig:
    type: str = "pixel"  # pixel | diffusers_vae
    pretrained: str | None = None  # hub id or folder (diffusers_vae)
    subfolder: str | None = None
    vae_class: str = "AutoencoderKL"  # or AutoencoderKLWan, ...
    sample_posterior: bool = False
    frames_per_batch: int = 32


@dataclass
class SyntheticConfig:
    episodes: int = 48
    length: int = 40
    size: int = 32
    seed: int = 0


@dataclass
class DataConfig:
    paths: list[str] = field(default_factory=list)  # LeRobot paired datasets; empty: synthetic pairs
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    camera: str = "front"
    controls: list[str] = field(default_factory=list)  # extra sim control keys: "seg", "depth", "normal"
    num_frames: int = 8  # window length in frames (1 + 4k for a video VAE)
    resolution: tuple[int, int] = (32, 32)
    val_episodes: int = 2  # held out: the last episodes of the first dataset
    stride: int = 1  # between window starts
    num_workers: int = 0
    latent_cache: bool = False  # encode all windows once (VAE codecs) into output_dir/latents-*.safetensors
    preload: bool = False  # read every episode once, resized to data.resolution, into memory (small datasets:
    #                        no video decoding per window; H*W*3 bytes per camera and frame at data.resolution)


@dataclass
class TrainConfig:
    seed: int = 0
    output_dir: str = "runs/translator"
    batch_size: int = 8  # per process
    gradient_accumulation_steps: int = 1
    max_steps: int = 1000  # the run's length: a fixed number of steps, whatever the machine's speed
    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.99)
    lr_scheduler: str = "constant_with_warmup"  # any diffusers.optimization scheduler name
    warmup_steps: int = 50
    max_grad_norm: float = 1.0
    mixed_precision: str = "auto"  # auto (bf16 on GPUs, no on CPUs) | no | bf16 | fp16
    p_drop_action: float = 0.5
    p_drop_sim: float = 0.5
    # what the loss compares: "velocity" (noise - x0; every prediction type) or "sample" (x0 itself, the same
    # error weighted by sigma^2: near-clean samples, whose error is the camera's unpredictable noise divided by
    # a small sigma, no longer outweigh the noisy ones, where the action has to draw the arm)
    loss_target: str = "velocity"
    # > 1: the loss weighs the pixels of the twin's objects (seg labels >= 2, read from the seg control channel,
    # one pixel of margin) this much more: a 5-px cube is 0.2% of a frame, yet where it is drawn is what a
    # policy learns from
    object_weight: float = 1.0
    # > 0 (loss_target sample, seg in data.controls): plus this weight times ``edge_loss`` (an edge of the
    # prediction or the real frame with no edge as strong within 1 px in the other) over a band of +-2 px around
    # the twin's robot outline. The squared error alone lets a faded, low-contrast arm edge cost
    # less than a crisp one a pixel off; this term charges the fade
    edge_weight: float = 0.0
    logit_normal_mean: float = 0.0
    logit_normal_std: float = 1.0
    use_ema: bool = True
    ema_decay: float = 0.999
    checkpointing_steps: int = 500
    checkpoints_total_limit: int | None = 3
    validation_steps: int = 500
    validation_clips: int = 2
    log_steps: int = 10


@dataclass
class SamplingConfig(SamplingParams):
    """The ``sampling:`` section: the translator's own SamplingParams (saved with it) and its scheduler's shift."""
    num_steps: int = 20
    w_action: float = 1.0
    w_sim: float = 1.0
    shift: float = 1.0  # FlowMatchEulerDiscreteScheduler shift

    def params(self) -> SamplingParams:
        return SamplingParams(num_steps=self.num_steps, w_action=self.w_action, w_sim=self.w_sim,
                              overlap=self.overlap, strength=self.strength)


@dataclass
class TranslatorConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    codec: CodecConfig = field(default_factory=CodecConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self):
        self._check_ranges()
        t = self.train
        for name in ("p_drop_action", "p_drop_sim"):
            if not 0.0 <= getattr(t, name) < 1.0:
                raise ValueError(f"train.{name} must be in [0, 1), got {getattr(t, name)}")
        if t.loss_target not in LOSS_TARGETS:
            raise ValueError(f"train.loss_target must be one of {LOSS_TARGETS}, got {t.loss_target!r}")
        if t.object_weight < 1.0:
            raise ValueError(f"train.object_weight must be >= 1 (1 = every pixel alike), got {t.object_weight}")
        if t.object_weight != 1.0 and "seg" not in self.data.controls:
            raise ValueError(f"train.object_weight={t.object_weight} needs the twin's labels: add seg to data.controls "
                             f"(now {list(self.data.controls)})")
        if t.object_weight != 1.0 and self.codec.type != "pixel" and self.data.latent_cache:
            raise ValueError("train.object_weight reads the labels from the pixel frames: it cannot run on "
                             "data.latent_cache (encoded windows only)")
        if t.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"train.mixed_precision must be auto|no|bf16|fp16, got {t.mixed_precision!r}")
        if self.model.prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"model.prediction_type must be one of {PREDICTION_TYPES}, got {self.model.prediction_type!r}")
        if self.codec.type not in ("pixel", "diffusers_vae"):
            raise ValueError(f"codec.type must be 'pixel' or 'diffusers_vae', got {self.codec.type!r}")
        pt, ph, pw = self.model.patch_size
        H, W = self.data.resolution
        if self.codec.type == "pixel" and (H % ph or W % pw or self.data.num_frames % pt):
            raise ValueError(f"data.resolution={[H, W]} and data.num_frames={self.data.num_frames} must be divisible "
                             f"by model.patch_size={[pt, ph, pw]} (frames, height, width) in pixel space")
        m = self.model
        if m.patch_bottleneck < 0:
            raise ValueError(f"model.patch_bottleneck must be >= 0 (0 = off), got {m.patch_bottleneck}")
        if m.paste_twin_objects and not (m.sim_residual and self.codec.type == "pixel" and "seg" in self.data.controls):
            raise ValueError("model.paste_twin_objects=true needs model.sim_residual=true, codec.type=pixel and seg in "
                             f"data.controls (got {m.sim_residual}, {self.codec.type!r}, {list(self.data.controls)}): "
                             "the objects are found by the twin's labels and recoloured in pixel space")
        if m.backdrop_from == "labels" and m.background_plate and not (self.codec.type == "pixel"
                                                                        and "seg" in self.data.controls):
            raise ValueError("model.backdrop_from=labels needs codec.type=pixel and seg in data.controls (got "
                             f"{self.codec.type!r}, {list(self.data.controls)}): the backdrop is the twin's label 0")
        if m.plate_follows_camera and not (m.background_plate and self.codec.type == "pixel"):
            raise ValueError("model.plate_follows_camera moves the real background plate in pixels: it needs "
                             f"model.background_plate=true and codec.type=pixel (got {m.background_plate}, "
                             f"{self.codec.type!r})")
        if m.pixel_head and not m.sim_residual:
            raise ValueError("model.pixel_head replaces the per-token output with a gain and an offset on the "
                             "residual's start: it needs model.sim_residual=true and model.prediction_type=sample")
        if t.edge_weight and not (t.loss_target == "sample" and self.codec.type == "pixel"
                                  and "seg" in self.data.controls):
            raise ValueError("train.edge_weight compares the clean frame's edges around the twin's robot: it needs "
                             "train.loss_target=sample, codec.type=pixel and seg in data.controls (got "
                             f"{t.loss_target!r}, {self.codec.type!r}, {list(self.data.controls)})")
        ov = self.sampling.overlap
        if ov is not None and not 0 < ov < self.data.num_frames:
            raise ValueError(f"sampling.overlap must be in [1, data.num_frames={self.data.num_frames}) frames "
                             f"(or null: half a window), got {ov}")


    def _check_ranges(self) -> None:
        """Every number in its range, before anything is built or written (a zero step count or a negative
        learning rate would otherwise fail deep in torch or diffusers, or train silently into nonsense)."""
        from diffusers.optimization import SchedulerType

        m, c, d, t, s = self.model, self.codec, self.data, self.train, self.sampling
        _, ph, pw = m.patch_size if len(m.patch_size) == 3 else (1, 1, 1)

        def whole(v, low):
            return isinstance(v, int) and not isinstance(v, bool) and v >= low

        checks = [
            ("model.dim", m.dim, whole(m.dim, 1), "an integer >= 1"),
            ("model.depth", m.depth, whole(m.depth, 1), "an integer >= 1"),
            ("model.heads", m.heads, whole(m.heads, 1), "an integer >= 1"),
            ("model.dim", m.dim, m.dim % max(m.heads, 1) == 0 and (m.dim // max(m.heads, 1)) % 2 == 0
             and m.dim // max(m.heads, 1) >= 8, f"model.heads={m.heads} heads of an even size >= 8 (rotary embedding)"),
            ("model.mlp_ratio", m.mlp_ratio, m.mlp_ratio > 0, "a number > 0"),
            ("model.patch_size", list(m.patch_size), all(whole(v, 1) for v in m.patch_size), "3 integers >= 1"),
            ("model.action_fourier", m.action_fourier, whole(m.action_fourier, 0), "an integer >= 0"),
            ("model.plate_tolerance", m.plate_tolerance, m.plate_tolerance >= 0, "a number >= 0"),
            ("model.plate_frames", m.plate_frames, whole(m.plate_frames, 1), "an integer >= 1"),
            ("model.backdrop_from", m.backdrop_from, m.backdrop_from in ("colour", "labels"), "colour or labels"),
            ("model.pixel_head", m.pixel_head, whole(m.pixel_head, 0), "an integer >= 0 (0 = off)"),
            ("model.head_cells", m.head_cells, not m.pixel_head or (whole(m.head_cells, 1) and ph % max(m.head_cells, 1) == 0
                                                                     and pw % max(m.head_cells, 1) == 0), f"an integer >= 1 dividing the patch's {ph}x{pw} pixels"),
            ("train.edge_weight", t.edge_weight, t.edge_weight >= 0, "a number >= 0 (0 = off)"),
            ("codec.frames_per_batch", c.frames_per_batch, whole(c.frames_per_batch, 1), "an integer >= 1"),
            ("data.num_frames", d.num_frames, whole(d.num_frames, 1), "an integer >= 1"),
            ("data.resolution", list(d.resolution), all(whole(v, 1) for v in d.resolution), "[height, width] >= 1"),
            ("data.val_episodes", d.val_episodes, whole(d.val_episodes, 0), "an integer >= 0"),
            ("data.stride", d.stride, whole(d.stride, 1), "an integer >= 1"),
            ("data.num_workers", d.num_workers, whole(d.num_workers, 0), "an integer >= 0"),
            ("data.synthetic.episodes", d.synthetic.episodes, whole(d.synthetic.episodes, 1), "an integer >= 1"),
            ("data.synthetic.length", d.synthetic.length, whole(d.synthetic.length, 1), "an integer >= 1"),
            ("data.synthetic.size", d.synthetic.size, whole(d.synthetic.size, 1), "an integer >= 1"),
            ("train.seed", t.seed, whole(t.seed, 0), "an integer >= 0"),
            ("train.batch_size", t.batch_size, whole(t.batch_size, 1), "an integer >= 1"),
            ("train.gradient_accumulation_steps", t.gradient_accumulation_steps,
             whole(t.gradient_accumulation_steps, 1), "an integer >= 1"),
            ("train.max_steps", t.max_steps, whole(t.max_steps, 1), "an integer >= 1"),
            ("train.learning_rate", t.learning_rate, t.learning_rate > 0, "a number > 0"),
            ("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "a number >= 0"),
            ("train.adam_betas", list(t.adam_betas), all(0 <= b < 1 for b in t.adam_betas), "2 numbers in [0, 1)"),
            ("train.lr_scheduler", t.lr_scheduler, t.lr_scheduler in [x.value for x in SchedulerType],
             f"one of {[x.value for x in SchedulerType]}"),
            ("train.warmup_steps", t.warmup_steps, whole(t.warmup_steps, 0), "an integer >= 0"),
            ("train.max_grad_norm", t.max_grad_norm, t.max_grad_norm >= 0, "a number >= 0 (0: no clipping)"),
            ("train.logit_normal_std", t.logit_normal_std, t.logit_normal_std > 0, "a number > 0"),
            ("train.ema_decay", t.ema_decay, 0 <= t.ema_decay <= 1, "a number in [0, 1]"),
            ("train.checkpointing_steps", t.checkpointing_steps, whole(t.checkpointing_steps, 1), "an integer >= 1"),
            ("train.checkpoints_total_limit", t.checkpoints_total_limit,
             t.checkpoints_total_limit is None or whole(t.checkpoints_total_limit, 1), "an integer >= 1, or null"),
            ("train.validation_steps", t.validation_steps, whole(t.validation_steps, 1), "an integer >= 1"),
            ("train.validation_clips", t.validation_clips, whole(t.validation_clips, 0), "an integer >= 0"),
            ("train.log_steps", t.log_steps, whole(t.log_steps, 1), "an integer >= 1"),
            ("sampling.num_steps", s.num_steps, whole(s.num_steps, 1), "an integer >= 1"),
            ("sampling.shift", s.shift, s.shift > 0, "a number > 0"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ConfigError(f"{name}: expected {expected}, got {value!r}")


def load_train_config(path: str | Path, overrides: list[str] | None = None) -> TranslatorConfig:
    return load_config(TranslatorConfig, path, overrides)


# fields that fix the architecture or the meaning of the weights: a checkpoint must match them
# (every model field but the memory/speed trade-off, so a new model field is covered by default)
ARCH_FIELDS = tuple(f"model.{f.name}" for f in dataclasses.fields(ModelConfig) if f.name != "gradient_checkpointing") + (
    "codec.type", "codec.pretrained", "codec.subfolder", "codec.vae_class", "data.camera", "data.controls",
    "data.num_frames", "data.resolution")


def _get(d: dict, dotted: str):
    for p in dotted.split("."):
        d = d.get(p) if isinstance(d, dict) else None
    return list(d) if isinstance(d, tuple) else d


def check_checkpoint_config(checkpoint: Path, cfg: TranslatorConfig) -> None:
    """Raise TranslatorMismatchError naming the first architecture field that differs."""
    path = checkpoint / "translator_config.json"
    if not path.is_file():
        raise TranslatorMismatchError(f"{checkpoint} has no translator_config.json: not a translator checkpoint")
    saved, now = json.loads(path.read_text()), json.loads(json.dumps(to_dict(cfg)))
    differ = [k for k in ARCH_FIELDS if _get(saved, k) != _get(now, k)]
    if differ:
        what = ", ".join(f"{k}: checkpoint {_get(saved, k)!r} vs config {_get(now, k)!r}" for k in differ)
        raise TranslatorMismatchError(f"checkpoint {checkpoint} has another architecture ({what}); use the "
                                      "config it was trained with (or a new train.output_dir)")


# -- determinism helpers ----------------------------------------------------------------------
def step_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class StepBatchSampler:
    """Batch indices of micro-steps [start, stop): epoch-wise permutations, a function of (seed, step)."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int, world: int, start: int, stop: int):
        self.n, self.bs, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.start, self.stop = start, stop
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            self._perms = {epoch: torch.randperm(self.n, generator=torch.Generator().manual_seed(
                step_seed(self.seed, epoch, 7)))}
        return self._perms[epoch]

    def __len__(self):
        return max(0, self.stop - self.start)

    def __iter__(self):
        for m in range(self.start, self.stop):
            first = (m * self.world + self.rank) * self.bs
            yield [int(self._perm(p // self.n)[p % self.n]) for p in range(first, first + self.bs)]


# -- media ----------------------------------------------------------------------------------
def save_validation(out_dir: Path, step: int, sims, gens, reals, fps: float, upscale: int = 4) -> None:
    """PNG strip (rows sim / generated / real per clip, frames left to right) and an mp4 of the same."""
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for s, g, r in zip(sims, gens, reals):
        rows += [np.concatenate(list(v), axis=1) for v in (s, g, r)]
    strip = np.concatenate(rows, axis=0)
    Image.fromarray(strip).resize((strip.shape[1] * upscale, strip.shape[0] * upscale), Image.NEAREST).save(
        out_dir / f"step-{step:06d}.png")
    video = np.concatenate([np.concatenate([s, g, r], axis=2) for s, g, r in zip(sims, gens, reals)], axis=1)
    video = video.repeat(upscale, axis=1).repeat(upscale, axis=2)
    write_video(out_dir / f"step-{step:06d}.mp4", video, fps)


# -- building blocks --------------------------------------------------------------------------
def open_sources(cfg: TranslatorConfig) -> list:
    if cfg.data.paths:
        return list(cfg.data.paths)
    from comsim.translator.synthetic import make_synthetic_pairs

    s = cfg.data.synthetic
    return [make_synthetic_pairs(s.episodes, s.length, s.size, s.seed, camera=cfg.data.camera)]


def build_datasets(cfg: TranslatorConfig, sources=None):
    """(train, val) PairedWindowDatasets; val holds whole held-out episodes (stride = window)."""
    d = cfg.data
    sources = open_sources(cfg) if sources is None else sources
    if d.preload:
        keys = [d.camera, sim_key(d.camera)] + [control_key(d.camera, c) for c in d.controls]
        one = isinstance(sources, (str, Path)) or (isinstance(sources, (list, tuple)) and len(sources) > 0
                                                   and isinstance(sources[0], Episode))
        sources = [preload_source(s, keys, d.resolution) for s in ([sources] if one else sources)]
    probe = PairedWindowDataset(sources, d.camera, d.num_frames, d.resolution, stride=d.stride, controls=d.controls)
    for s in probe.sources:  # every window is read over and over: a corrupt video is named before training
        if hasattr(s, "check_videos"):
            s.check_videos()
    sizes = [len(s) for s in probe.sources]
    train_eps, val_eps = split_episodes(sizes, d.val_episodes)
    train = PairedWindowDataset(probe.sources, d.camera, d.num_frames, d.resolution, probe.normalizer, train_eps,
                                d.stride, d.controls)
    val = (PairedWindowDataset(probe.sources, d.camera, d.num_frames, d.resolution, probe.normalizer, val_eps,
                               d.num_frames, d.controls) if val_eps else None)
    return train, val


def build_model(cfg: TranslatorConfig, codec, action_dim: int) -> CompositionalVideoDiT:
    t, h, w = codec.latent_size(cfg.data.num_frames, *cfg.data.resolution)
    m = cfg.model
    model = CompositionalVideoDiT(
        in_channels=codec.latent_channels, sim_channels=codec.latent_channels + 3 * len(cfg.data.controls),
        action_dim=action_dim, num_frames=t, sample_size=(h, w), patch_size=tuple(m.patch_size), dim=m.dim,
        depth=m.depth, heads=m.heads, mlp_ratio=m.mlp_ratio, actions_per_latent_frame=codec.temporal_factor,
        causal_first_frame=bool(codec.causal_first_frame), abs_pos_embed=m.abs_pos_embed,
        action_fourier=m.action_fourier, prediction_type=m.prediction_type,
        sim_residual=m.sim_residual, patch_bottleneck=m.patch_bottleneck,
        background_plate=m.background_plate, plate_tolerance=m.plate_tolerance,
        paste_twin_objects=m.paste_twin_objects, backdrop_from=m.backdrop_from, pixel_head=m.pixel_head,
        head_cells=m.head_cells, plate_follows_camera=m.plate_follows_camera,
        seg_channel=codec.latent_channels + 3 * list(cfg.data.controls).index("seg") if "seg" in cfg.data.controls
        else -1)
    if m.gradient_checkpointing:
        model.enable_gradient_checkpointing()
    return model


@torch.no_grad()
def fit_on_training_pairs(model: CompositionalVideoDiT, train_ds: PairedWindowDataset, codec, max_frames: int,
                          device="cpu") -> dict:
    """Fit what the model takes from the training pairs before training (its background plates, its objects'
    colour maps) on about ``max_frames`` training frames: every frame of evenly spaced non-overlapping windows of
    the training episodes (deterministic). Returns the plate's background share and the object pixels fit on."""
    T = train_ds.num_frames
    windows = [i for i, (_, _, t) in enumerate(train_ds.index) if t % T == 0]
    windows = windows[::max(1, -(-len(windows) * T // max_frames))]
    C = model.config.in_channels
    real, sim, shift = [], [], []
    for i in windows:
        item = train_ds[i]
        z_real = codec.encode(item["target"][None].to(device))
        z_sim = encode_condition(codec, item["sim"][None].to(device))
        real.append(z_real.transpose(1, 2).flatten(0, 1))  # (B, C, T, h, w) -> (B*T, C, h, w)
        sim.append(z_sim.transpose(1, 2).flatten(0, 1))
        shift.append(item["camera_shift"])  # (T, 2): a pixel codec, one latent frame per frame
    real, sim, shift = torch.cat(real), torch.cat(sim), torch.cat(shift)
    fitted = {}
    if model.config.background_plate:
        fitted["background"] = model.fit_background_plate(
            real, sim, shift if getattr(model.config, "plate_follows_camera", False) else None)
    if model.config.paste_twin_objects:
        fitted["object_pixels"] = model.fit_object_colours(real, sim)
    return fitted


def build_scheduler(cfg: TranslatorConfig):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=cfg.sampling.shift)


def make_pipeline(cfg, model, codec, normalizer, fps: float, provenance: dict | None = None):
    return TranslatorPipeline(model, codec, build_scheduler(cfg), normalizer, camera=cfg.data.camera,
                              num_frames=cfg.data.num_frames, resolution=tuple(cfg.data.resolution),
                              controls=tuple(cfg.data.controls), fps=fps, provenance=provenance,
                              sampling=cfg.sampling.params())


def object_pixels(sim: torch.Tensor, controls, size) -> torch.Tensor:
    """(B, 1, *size) float mask of the twin's objects (labels >= 2) in a pixel sim condition (B, 3 + 3n, T, H, W)
    whose ``controls`` include seg, grown by one pixel (H.264 blends the edges, where an object's position shows),
    max-pooled to the latents' (t, h, w) ``size``."""
    i = 3 + 3 * list(controls).index("seg")
    near = twin_object_labels(sim[:, i:i + 3]).any(1, keepdim=True).float()
    near = F.max_pool3d(near, (1, 3, 3), stride=1, padding=(0, 1, 1))
    return F.adaptive_max_pool3d(near, tuple(size))


def robot_edge_band(sim: torch.Tensor, controls, px: int = 2) -> torch.Tensor:
    """(B, 1, T, H, W) float: the pixels within ``px`` of the twin's robot outline (label 1 of the seg control of a
    pixel sim condition (B, 3 + 3n, T, H, W) whose ``controls`` include seg)."""
    i = 3 + 3 * list(controls).index("seg")
    colour = torch.as_tensor(SEG_PALETTE[1], dtype=torch.float32, device=sim.device).view(1, 3, 1, 1, 1) / 127.5 - 1
    robot = ((sim[:, i:i + 3].float() - colour).square().sum(1, keepdim=True)
             <= (SEG_DECODE_TOLERANCE / 127.5) ** 2).float()
    k = (1, 2 * px + 1, 2 * px + 1)
    grown = F.max_pool3d(robot, k, stride=1, padding=(0, px, px))
    shrunk = 1 - F.max_pool3d(1 - robot, k, stride=1, padding=(0, px, px))
    return grown - shrunk


def edge_strength(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T, H, W) -> (B, 1, T, H, W): the gradient magnitude of the channel mean (forward differences)."""
    y = x.mean(1, keepdim=True)
    gx = F.pad(y[..., :, 1:] - y[..., :, :-1], (0, 1, 0, 0))
    gy = F.pad(y[..., 1:, :] - y[..., :-1, :], (0, 0, 0, 1))
    return (gx.square() + gy.square() + 1e-8).sqrt()


def edge_loss(pred: torch.Tensor, target: torch.Tensor, band: torch.Tensor) -> torch.Tensor:
    """Over ``band`` (B, 1, T, H, W): the squared shortfall of an edge of either frame against the strongest edge of
    the other within 1 px. A faded edge falls short of the real one and costs; a crisp edge a pixel off does not;
    an edge where the real frame has none costs too."""
    near = lambda g: F.max_pool3d(g, (1, 3, 3), stride=1, padding=(0, 1, 1))  # noqa: E731
    sp, st = edge_strength(pred), edge_strength(target)
    miss = (F.relu(st - near(sp)).square() + F.relu(sp - near(st)).square()) * band
    return miss.sum() / band.sum().clamp_min(1.0)


def flow_matching_loss(model, x0, sim_lat, actions, generator, cfg: TrainConfig, autocast=None,
                       prediction_type: str = "velocity", weight: torch.Tensor | None = None,
                       edge_band: torch.Tensor | None = None, camera_shift: torch.Tensor | None = None):
    """One rectified-flow loss with independent condition dropout; all draws from ``generator``. ``weight``
    (B, 1, T, H, W): per-pixel weights of the squared error (a weighted mean). ``edge_band`` (B, 1, T, H, W):
    where ``cfg.edge_weight`` compares edge strengths (``robot_edge_band``). ``camera_shift`` (B, T, 2) px: for a
    model whose plate follows the camera."""
    B, dev = x0.shape[0], x0.device
    noise = torch.randn(x0.shape, generator=generator).to(dev)
    t = torch.sigmoid(cfg.logit_normal_mean + cfg.logit_normal_std * torch.randn(B, generator=generator)).to(dev)
    action_keep = (torch.rand(B, generator=generator) >= cfg.p_drop_action).to(dev)
    sim_keep = (torch.rand(B, generator=generator) >= cfg.p_drop_sim).to(dev)
    tt = t.view(B, 1, 1, 1, 1)
    x_t = (1 - tt) * x0 + tt * noise
    with autocast() if autocast is not None else contextlib.nullcontext():
        out = model(x_t, t * 1000.0, actions, sim_lat, action_keep=action_keep, sim_keep=sim_keep,
                    **({} if camera_shift is None else {"camera_shift": camera_shift}))
    if cfg.loss_target == "sample":  # the clean frame: x0 = x_t - t v for a velocity model
        pred = out.float() if prediction_type == "sample" else x_t.float() - tt * out.float()
        target = x0.float()
        edge = cfg.edge_weight * edge_loss(pred, target, edge_band) if cfg.edge_weight and edge_band is not None else 0.0
        if weight is None:
            return F.mse_loss(pred, target) + edge
        w = weight.float().expand_as(pred)
        return ((pred - target).square() * w).sum() / w.sum() + edge
    else:  # on the velocity whatever the model predicts (JiT: x-prediction, v-loss)
        pred, target = velocity_from_output(out.float(), x_t.float(), t, prediction_type), (noise - x0).float()
    if weight is None:
        return F.mse_loss(pred, target)
    weight = weight.float().expand_as(pred)
    return ((pred - target).square() * weight).sum() / weight.sum()


def find_checkpoint(output_dir: Path, resume: str | None) -> Path | None:
    if not resume:
        return None
    if resume != "latest":
        path = Path(resume)
        if not path.is_dir():
            raise FileNotFoundError(f"--resume_from_checkpoint {resume}: no such checkpoint folder")
        return path
    found = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    found = [p for p in found if (p / "translator_config.json").is_file()]
    return found[-1] if found else None


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


# -- the loop ---------------------------------------------------------------------------------
def check_output_dir(cfg: TranslatorConfig, resume_from_checkpoint: str | None) -> None:
    """``train.output_dir`` may take this run: new or empty, or a training run's own (its ownership manifest
    training.json, or the translator_config.json every run writes), and holding checkpoints only when
    resuming from one (whose architecture ``check_checkpoint_config`` then compares)."""
    out = check_output_path(cfg.train.output_dir, "train.output_dir")
    if not (out / "translator_config.json").is_file():
        claim_output(out, MANIFEST, None, (), TRAIN_COMMAND, "train.output_dir")
    done = sorted(out.glob("checkpoint-*"))
    if done and not resume_from_checkpoint:
        raise OutputFolderError(f"{out}: train.output_dir: holds the checkpoints of a run ({', '.join(p.name for p in done)}); "
                                "continue it with --resume_from_checkpoint latest, or choose a new train.output_dir")


def train(cfg: TranslatorConfig, resume_from_checkpoint: str | None = None, stop_at_step: int | None = None,
          sources=None) -> Path | None:
    """Train; returns ``output_dir/final`` (a TranslatorPipeline folder) or None if stopped early.

    ``stop_at_step`` stops right after that step's checkpoint as if killed (no final save).
    ``sources`` overrides cfg.data.paths (e.g. in-memory Episode lists).

    Everything is checked (the config, ``output_dir``, the checkpoint, the data, the model) before the first
    file is written; the main process holds ``output_dir``'s lock from then on (comsim/io/lock.py).
    """
    check_output_dir(cfg, resume_from_checkpoint)
    with contextlib.ExitStack() as held:
        return _train(cfg, resume_from_checkpoint, stop_at_step, sources, held)


def _train(cfg: TranslatorConfig, resume_from_checkpoint: str | None, stop_at_step: int | None, sources,
           held: contextlib.ExitStack) -> Path | None:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel

    tc = cfg.train
    out = Path(tc.output_dir)
    mp = tc.mixed_precision if tc.mixed_precision != "auto" else ("bf16" if torch.cuda.is_available() else "no")
    accelerator = Accelerator(gradient_accumulation_steps=tc.gradient_accumulation_steps, mixed_precision=mp,
                              log_with="tensorboard",
                              project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")))
    checkpoint = find_checkpoint(out, resume_from_checkpoint)
    if checkpoint is not None:
        check_checkpoint_config(checkpoint, cfg)  # before any compute
    set_seed(tc.seed)
    rank, world, dev = accelerator.process_index, accelerator.num_processes, accelerator.device
    if dev.type == "cpu":
        keep_freed_memory()

    codec = build_codec(dataclasses.asdict(cfg.codec)).to(dev)
    train_ds, val_ds = build_datasets(cfg, sources)
    normalizer = train_ds.normalizer
    model = build_model(cfg, codec, normalizer.dim)
    if (cfg.model.background_plate or cfg.model.paste_twin_objects) and checkpoint is None:  # a resumed run loads them
        fitted = fit_on_training_pairs(model, train_ds, codec, cfg.model.plate_frames, dev)
        if "background" in fitted:
            accelerator.print(f"background plate: fit on the training pairs, {fitted['background']:.0%} of their "
                              "pixels are background")
        if "object_pixels" in fitted:
            accelerator.print(f"object colour maps: fit on the training pairs' object pixels {fitted['object_pixels']}")
    fps = float(getattr(train_ds.sources[0], "fps", 10.0))
    cfg_json = json.loads(json.dumps(to_dict(cfg)))
    if accelerator.is_main_process:  # the first write: one writer per output_dir from here on
        held.enter_context(output_lock(out, TRAIN_COMMAND))
        check_output_dir(cfg, resume_from_checkpoint)  # again: a run that took the folder meanwhile
        if not (out / MANIFEST).is_file():
            write_json({"command": TRAIN_COMMAND, "config": cfg_json}, out / MANIFEST)
        write_json(cfg_json, out / "translator_config.json")
        n_params = sum(p.numel() for p in model.parameters())
        print(f"translator: {n_params / 1e6:.2f}M parameters, {len(train_ds)} training windows, "
              f"{world} process(es), mixed_precision={mp}", flush=True)

    latent_mode = cfg.codec.type != "pixel" and cfg.data.latent_cache
    if latent_mode:
        key = hashlib.sha256(json.dumps([cfg_json["codec"], cfg_json["data"]], sort_keys=True).encode()).hexdigest()[:12]
        cache = out / f"latents-{key}.safetensors"
        with accelerator.main_process_first():
            if not cache.is_file():
                build_latent_cache(train_ds, codec, cache)
        train_ds = LatentWindowDataset(cache)

    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.learning_rate, betas=tuple(tc.adam_betas),
                                  weight_decay=tc.weight_decay)
    lr_scheduler = get_scheduler(tc.lr_scheduler, optimizer, num_warmup_steps=tc.warmup_steps,
                                 num_training_steps=tc.max_steps)
    ema = None
    if tc.use_ema:
        ema = EMAModel(model.parameters(), decay=tc.ema_decay, model_cls=CompositionalVideoDiT,
                       model_config=model.config)
        ema.to(dev)
    # EMA and LR schedule are saved by save_checkpoint as safetensors + JSON, not through
    # accelerate's register_for_checkpointing: that one unpickles them (weights_only=False) on resume,
    # and a checkpoint folder may come from a user.
    model, optimizer = accelerator.prepare(model, optimizer)

    global_step = 0
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        load_extra_state(checkpoint, ema, lr_scheduler)
        global_step = int(checkpoint.name.split("-")[1])
        accelerator.print(f"resumed from {checkpoint} at step {global_step}")
    elif resume_from_checkpoint:
        accelerator.print(f"no checkpoint in {out}; starting from scratch")
    if accelerator.is_main_process:
        accelerator.init_trackers("translator", config=_flat(cfg_json))

    accum = tc.gradient_accumulation_steps
    sampler = StepBatchSampler(len(train_ds), tc.batch_size, tc.seed, rank, world, global_step * accum,
                               tc.max_steps * accum)
    loader = torch.utils.data.DataLoader(train_ds, batch_sampler=sampler, num_workers=cfg.data.num_workers)
    micro = global_step * accum
    t_last, losses = time.time(), []
    summary = TrainSummary.resume(out, tc.max_steps, global_step, cfg)
    stopped_early = False
    progress = None
    if accelerator.is_main_process:
        from tqdm.auto import tqdm

        progress = tqdm(total=tc.max_steps, initial=global_step, desc="train", dynamic_ncols=True)
    model.train()
    for batch in loader:
        gen = torch.Generator().manual_seed(step_seed(tc.seed, micro, rank, 1))
        with accelerator.accumulate(model):
            target, sim, actions = batch["target"].to(dev), batch["sim"].to(dev), batch["actions"].to(dev)
            if latent_mode:
                x0, sim_lat = target, sim
            else:
                with torch.no_grad():
                    x0, sim_lat = codec.encode(target), encode_condition(codec, sim)
            weight = None
            if tc.object_weight != 1.0:  # from the pixel sim condition (latent mode has no pixels: checked above)
                weight = 1 + (tc.object_weight - 1) * object_pixels(sim, cfg.data.controls, x0.shape[2:])
            band = robot_edge_band(sim, cfg.data.controls) if tc.edge_weight else None
            shift = batch["camera_shift"] if cfg.model.plate_follows_camera else None
            loss = flow_matching_loss(model, x0, sim_lat, actions, gen, tc, accelerator.autocast,
                                      cfg.model.prediction_type, weight, band, shift)
            accelerator.backward(loss)
            if accelerator.sync_gradients and tc.max_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        micro += 1
        losses.append(loss.detach())
        if not accelerator.sync_gradients:
            continue
        lr_scheduler.step()
        global_step += 1
        if ema is not None:
            ema.step(accelerator.unwrap_model(model).parameters())
        if progress is not None:
            progress.update(1)

        if global_step % tc.log_steps == 0 or global_step == tc.max_steps:
            mean_loss = accelerator.reduce(torch.stack(losses).mean(), "mean").item()
            now = time.time()
            step_time = (now - t_last) / max(1, len(losses) // accum)
            t_last, losses = now, []
            accelerator.log({"loss": mean_loss, "lr": lr_scheduler.get_last_lr()[0], "step_time_s": step_time},
                            step=global_step)
            summary.loss.append([global_step, round(mean_loss, 6)])
            if progress is not None:
                progress.set_postfix(loss=f"{mean_loss:.4f}", s_per_step=f"{step_time:.2f}")

        last = global_step >= tc.max_steps
        stop_now = stop_at_step is not None and global_step >= stop_at_step
        if accelerator.is_main_process and val_ds is not None and (global_step % tc.validation_steps == 0 or last):
            with ema_weights(ema, accelerator.unwrap_model(model)):
                summary.validation.append(validate(
                    cfg, accelerator, make_pipeline(cfg, accelerator.unwrap_model(model), codec, normalizer, fps),
                    val_ds, global_step))
        if global_step % tc.checkpointing_steps == 0 or last or stop_now:
            save_checkpoint(accelerator, out, global_step, tc.checkpoints_total_limit, cfg_json, ema, lr_scheduler)
            if accelerator.is_main_process:
                summary.write(out, global_step)
        if stop_now and not last:
            stopped_early = True
            break
        if last:
            break
    if progress is not None:
        progress.close()
    accelerator.wait_for_everyone()
    final = None
    if not stopped_early and accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        with ema_weights(ema, unwrapped):
            provenance = {"config": cfg_json, "steps": global_step, "ema": ema is not None}
            final = make_pipeline(cfg, unwrapped, codec, normalizer, fps, provenance).save_pretrained(out / "final")
        print(f"saved {final} after {global_step} steps", flush=True)
        summary.write(out, global_step)
    accelerator.end_training()
    return final


class TrainSummary:
    """``output_dir/train_summary.json``: steps done of planned, the loss curve, the validation scores and
    grids, the sampling settings. Written with every checkpoint, so a resumed run keeps its history up to
    the checkpoint it resumed from (entries after it are dropped: they are trained again)."""

    FILE = "train_summary.json"

    def __init__(self, steps_planned: int, cfg: TranslatorConfig, loss=None, validation=None):
        self.steps_planned, self.cfg = steps_planned, cfg
        self.loss, self.validation = list(loss or []), list(validation or [])

    @classmethod
    def resume(cls, out: Path, steps_planned: int, step: int, cfg: TranslatorConfig) -> "TrainSummary":
        path = Path(out) / cls.FILE
        old = json.loads(path.read_text()) if step > 0 and path.is_file() else {}
        return cls(steps_planned, cfg, [r for r in old.get("loss", []) if r[0] <= step],
                   [v for v in old.get("validation", []) if v["step"] <= step])

    def write(self, out: Path, step: int) -> None:
        c = self.cfg
        write_json({
            "steps_planned": self.steps_planned, "steps_done": step, "stopped_early": step < self.steps_planned,
            "stop_reason": None if step >= self.steps_planned else "not finished (a checkpoint of a run in progress "
                                                                    "or killed; resume with --resume_from_checkpoint latest)",
            "resolution": list(c.data.resolution), "sampling": dataclasses.asdict(c.sampling),
            "loss": self.loss, "validation": self.validation}, Path(out) / self.FILE)


class ema_weights:
    """Context: the model holds the EMA weights inside, its own weights again after."""

    def __init__(self, ema, model):
        self.ema, self.model = ema, model

    def __enter__(self):
        if self.ema is not None:
            self.ema.store(self.model.parameters())
            self.ema.copy_to(self.model.parameters())

    def __exit__(self, *exc):
        if self.ema is not None:
            self.ema.restore(self.model.parameters())


def load_extra_state(checkpoint: Path, ema, lr_scheduler) -> None:
    """The EMA and LR-schedule state written by save_checkpoint (safetensors + JSON: nothing unpickled)."""
    from safetensors.torch import load_file

    lr_scheduler.load_state_dict(json.loads((checkpoint / "lr_scheduler.json").read_text()))
    if ema is not None:
        state = json.loads((checkpoint / "ema.json").read_text())
        shadow = load_file(str(checkpoint / "ema.safetensors"))
        state["shadow_params"] = [shadow[str(i)] for i in range(len(shadow))]
        ema.load_state_dict(state)


def save_checkpoint(accelerator, out: Path, step: int, limit: int | None, cfg_json: dict, ema=None,
                    lr_scheduler=None) -> None:
    from accelerate.utils import DistributedType

    if not (accelerator.is_main_process or accelerator.distributed_type == DistributedType.DEEPSPEED):
        return
    if accelerator.is_main_process and limit is not None:
        old = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        old = [p for p in old if int(p.name.split("-")[1]) != step]
        for p in old[:max(0, len(old) - limit + 1)]:
            shutil.rmtree(p, ignore_errors=True)
    path = out / f"checkpoint-{step}"
    tmp = out / f"tmp-checkpoint-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    accelerator.save_state(str(tmp))
    (tmp / "translator_config.json").write_text(json.dumps(cfg_json, indent=2))
    if accelerator.is_main_process:
        from safetensors.torch import save_file

        if lr_scheduler is not None:
            (tmp / "lr_scheduler.json").write_text(json.dumps(lr_scheduler.state_dict()))
        if ema is not None:
            state = ema.state_dict()
            save_file({str(i): p.detach().cpu().contiguous() for i, p in enumerate(state.pop("shadow_params"))},
                      str(tmp / "ema.safetensors"))
            (tmp / "ema.json").write_text(json.dumps(state))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


@torch.no_grad()
def validate(cfg: TranslatorConfig, accelerator, pipe: TranslatorPipeline, val_ds, step: int) -> dict:
    """Sample the first window of a few held-out episodes; save strips, log PSNR vs. real."""
    model = pipe.transformer
    was_training = model.training
    model.eval()
    sims, gens, reals = [], [], []
    n = min(cfg.train.validation_clips, len(val_ds))
    for i in range(n):
        s, e, t = val_ds.index[i * max(1, len(val_ds) // n)]
        ep = val_ds.sources[s].read_window(e, t, val_ds.num_frames, cameras=val_ds.keys)
        sim = resize_frames(ep.frames[val_ds.keys[1]], val_ds.resolution)
        real = resize_frames(ep.frames[val_ds.keys[0]], val_ds.resolution)
        controls = {c: resize_frames(ep.frames[k], val_ds.resolution) for c, k in zip(cfg.data.controls, val_ds.keys[2:])}
        gen = pipe(sim, ep.action, cfg.sampling.params(), seed=cfg.train.seed, controls=controls or None,
                   camera_shift=val_ds.window_shift(s, e, t))
        sims.append(sim), gens.append(gen), reals.append(real)
    metrics = {"val_psnr": mean_psnr(zip(gens, reals)), "val_psnr_sim": mean_psnr(zip(sims, reals))}
    accelerator.log(metrics, step=step)
    upscale = max(1, 128 // max(val_ds.resolution))  # small models' grids are blown up to be seen; 128 px is native
    save_validation(Path(cfg.train.output_dir) / "validation", step, sims, gens, reals, pipe.fps, upscale)
    if was_training:
        model.train()
    return {"step": step, "psnr": round(metrics["val_psnr"], 3), "psnr_sim": round(metrics["val_psnr_sim"], 3),
            "grid": f"validation/step-{step:06d}.png"}


__all__ = ["TranslatorConfig", "load_train_config", "train", "ConfigError", "flow_matching_loss",
           "build_datasets", "build_model", "make_pipeline", "check_checkpoint_config"]
