"""Typed configs of the policy stage (YAML -> dataclasses with comsim.config).

``DiffusionConfig`` sizes the model (beside ``model.py``, LeRobot style); its defaults are
LeRobot's Diffusion Policy defaults, and ``PRESETS`` holds smaller variants for CPUs.
``MixtureConfig`` says which datasets a policy trains on and with which synthetic
fraction; ``TrainConfig`` the optimisation; ``PolicyRunConfig`` is one training run
(what ``train/train_policy.py`` runs, and what each experiment arm resolves to).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from comsim.config import ConfigError, from_dict
from comsim.lab.cell import Region

SOURCE_ROLES = ("auto", "real", "synthetic")
REAL_SOURCES = ("real", "lab")  # provenance sources that count as real; sim / pseudo_real are synthetic


@dataclass
class DiffusionConfig:
    # -- inputs / outputs
    state_dim: int = 8
    action_dim: int = 8
    n_obs_steps: int = 2  # observations the policy sees (current + previous)
    horizon: int = 16  # actions predicted per denoising
    n_action_steps: int = 8  # actions executed before re-planning
    image_size: tuple[int, int] = (96, 96)  # (H, W): frames are resized (area) to this first
    crop_shape: tuple[int, int] | None = (84, 84)  # random crop in training, centre crop at inference
    # -- vision: ResNet-18 topology, GroupNorm instead of BatchNorm, spatial softmax keypoints
    backbone_width: int = 64  # 64 = torchvision's ResNet-18; smaller = same topology, thinner
    pretrained_backbone: str | None = None  # local torchvision resnet18 state dict (.pth/.safetensors); never downloaded
    backbone_stages: int = 4  # residual stages kept (4 = all, stride 32; 3 = stride 16 for small images)
    use_group_norm: bool = True
    spatial_softmax_num_keypoints: int = 32
    # -- conditional 1D U-Net
    down_dims: tuple[int, ...] = (512, 1024, 2048)
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    use_film_scale_modulation: bool = True
    # -- noise: DDPM in training, DDIM at inference (diffusers schedulers)
    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: str = "epsilon"  # epsilon | sample
    clip_sample: bool = True
    clip_sample_range: float = 1.0
    num_inference_steps: int = 10
    do_mask_loss_for_padding: bool = False

    def __post_init__(self):
        self.image_size = tuple(self.image_size)
        self.crop_shape = tuple(self.crop_shape) if self.crop_shape is not None else None
        self.down_dims = tuple(self.down_dims)
        if self.n_obs_steps < 1 or self.horizon < 1 or self.n_action_steps < 1:
            raise ConfigError("policy: n_obs_steps, horizon and n_action_steps must be >= 1")
        if self.n_action_steps > self.horizon - self.n_obs_steps + 1:
            raise ConfigError(f"policy.n_action_steps: {self.n_action_steps} > horizon - n_obs_steps + 1 = "
                              f"{self.horizon - self.n_obs_steps + 1} (the actions after the current step)")
        factor = 2 ** (len(self.down_dims) - 1)
        if self.horizon % factor:
            raise ConfigError(f"policy.horizon: {self.horizon} must be divisible by 2^(len(down_dims)-1) = {factor}")
        if self.crop_shape is not None and any(c > s for c, s in zip(self.crop_shape, self.image_size)):
            raise ConfigError(f"policy.crop_shape {self.crop_shape} is larger than image_size {self.image_size}")
        if self.backbone_width < 16 or self.backbone_width % 16:
            raise ConfigError(f"policy.backbone_width: expected a multiple of 16 (GroupNorm groups of 16 "
                              f"channels), got {self.backbone_width}")
        if not 1 <= self.backbone_stages <= 4:
            raise ConfigError(f"policy.backbone_stages: expected 1..4, got {self.backbone_stages}")
        if any(d % self.n_groups for d in self.down_dims):
            raise ConfigError(f"policy.down_dims {self.down_dims} must be divisible by n_groups {self.n_groups}")
        if self.prediction_type not in ("epsilon", "sample"):
            raise ConfigError(f"policy.prediction_type: expected epsilon|sample, got {self.prediction_type!r}")
        if not 1 <= self.num_inference_steps <= self.num_train_timesteps:
            raise ConfigError(f"policy.num_inference_steps: expected 1..{self.num_train_timesteps}, "
                              f"got {self.num_inference_steps}")

    @property
    def input_shape(self) -> tuple[int, int]:
        return self.crop_shape or self.image_size

    def describe(self, num_inference_steps: int | None = None) -> str:
        return (f"Diffusion Policy (ResNet-18 width {self.backbone_width}, {self.image_size[0]}x{self.image_size[1]} "
                f"images, U-Net {list(self.down_dims)}, DDIM {num_inference_steps or self.num_inference_steps} steps)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Smaller variants for CPUs. Any field can still be overridden on top of a preset.
PRESETS: dict[str, dict] = {
    "default": {},  # LeRobot's sizes: ResNet-18 at 84x84 crops, U-Net (512, 1024, 2048)
    "small": {"image_size": (96, 96), "crop_shape": (84, 84), "backbone_width": 32, "backbone_stages": 3,
              "spatial_softmax_num_keypoints": 32, "down_dims": (128, 256, 512), "diffusion_step_embed_dim": 64},
    "tiny": {"image_size": (64, 64), "crop_shape": (56, 56), "backbone_width": 16, "backbone_stages": 3,
             "spatial_softmax_num_keypoints": 16, "down_dims": (32, 64, 128), "diffusion_step_embed_dim": 32},
}


def diffusion_config(data: dict | None = None, where: str = "policy") -> DiffusionConfig:
    """A DiffusionConfig from a YAML mapping; ``preset: tiny|small|default`` fills the rest."""
    data = dict(data or {})
    data.pop("type", None)
    preset = data.pop("preset", "default")
    if preset not in PRESETS:
        raise ConfigError(f"{where}.preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    return from_dict(DiffusionConfig, {**PRESETS[preset], **data}, where)


POLICY_TYPES = ("diffusion", "keypoint")


def policy_config(data: dict | None = None, where: str = "policy"):
    """The config of the policy a YAML mapping names with ``type`` (default ``diffusion``:
    the GPU default; ``keypoint``: the CPU policy of ``keypoint.py``)."""
    data = dict(data or {})
    kind = data.pop("type", "diffusion")
    if kind == "diffusion":
        return diffusion_config(data, where)
    if kind == "keypoint":
        from comsim.policy.keypoint import KeypointConfig  # keypoint.py imports model.py, which imports this file
        return from_dict(KeypointConfig, data, where)
    raise ConfigError(f"{where}.type: expected one of {POLICY_TYPES}, got {kind!r}")


@dataclass
class SourceConfig:
    """One dataset of a mixture. Real and synthetic episodes are told apart by provenance."""
    dataset: str  # a path, or (in an experiment) the name of an entry of `datasets`
    camera: str = "front"  # which camera key of this dataset the policy sees (e.g. front_sim for sim data)
    role: str = "auto"  # auto (from provenance) | real | synthetic (then provenance must agree)
    weight: float | None = None  # share within its pool (real or synthetic); None = its number of frames
    max_episodes: int | None = None  # use only the first N episodes (e.g. 10 real out of a recording)

    def __post_init__(self):
        if self.role not in SOURCE_ROLES:
            raise ConfigError(f"role: expected one of {SOURCE_ROLES}, got {self.role!r}")
        if self.weight is not None and self.weight <= 0:
            raise ConfigError(f"weight: expected > 0, got {self.weight}")
        if self.max_episodes is not None and self.max_episodes < 1:
            raise ConfigError(f"max_episodes: expected >= 1, got {self.max_episodes}")


@dataclass
class MixtureConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    # Probability that a training sample is drawn from the synthetic pool (sim / pseudo_real).
    # None = proportional to frames. Logged, with the fraction actually drawn.
    synthetic_fraction: float | None = None

    def __post_init__(self):
        f = self.synthetic_fraction
        if f is not None and not 0.0 <= f <= 1.0:
            raise ConfigError(f"synthetic_fraction: expected a number in [0, 1], got {f}")


@dataclass
class TrainConfig:
    steps: int = 5000
    batch_size: int = 64
    lr: float = 1e-4  # LeRobot: AdamW 1e-4, betas (0.95, 0.999), wd 1e-6, cosine with 500 warmup steps
    betas: tuple[float, float] = (0.95, 0.999)
    weight_decay: float = 1e-6
    warmup_steps: int = 500
    lr_scheduler: str = "cosine"  # any diffusers.optimization scheduler name
    max_grad_norm: float = 10.0
    # EMA of the weights (Chi et al.: decay warming up as 1 - (1 + step)^-0.75, capped here);
    # the saved policy holds the averaged weights. null: no EMA (LeRobot's current default).
    ema_decay: float | None = None
    ema_power: float = 0.75
    seed: int = 0
    log_every: int = 50
    save_every: int = 0  # 0: only the final policy; else also checkpoint-<step> folders (for resuming)
    num_threads: int | None = None  # torch CPU threads for training and scoring (None: torch's default)

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError(f"train: steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ConfigError(f"train.ema_decay: expected a number in (0, 1) or null, got {self.ema_decay}")


@dataclass
class PolicyRunConfig:
    """One training run: a model, a mixture, an optimisation, an output folder."""
    output_dir: str
    data: MixtureConfig
    policy: dict = field(default_factory=dict)  # `type` (diffusion | keypoint) and its config's fields
    train: TrainConfig = field(default_factory=TrainConfig)
    cache_dir: str | None = None  # decoded, resized frames shared between runs (memory-mapped .npy)

    def __post_init__(self):
        self.model_config()  # errors name policy.<field>

    def model_config(self):
        return policy_config(self.policy)


@dataclass
class PanelConfig:
    """Where the objects start in a closed-loop panel."""
    kind: str = "id"  # id: the task's own regions | ood: boxes just outside them | custom: `layouts`
    ood_margin: float = 0.01  # m between the in-distribution region and an OOD box
    ood_width: float = 0.06  # m: depth of each OOD box
    layouts: list[dict[str, Region]] = field(default_factory=list)  # custom: region overrides, one per box

    def __post_init__(self):
        if self.kind not in ("id", "ood", "custom"):
            raise ConfigError(f"kind: expected id | ood | custom, got {self.kind!r}")
        if self.kind == "custom" and not self.layouts:
            raise ConfigError("layouts: a custom panel needs at least one layout")


@dataclass
class EvalConfig:
    n_trials: int = 50  # per panel
    seed: int = 100_000  # trial i starts from lab seed episode_seed(seed, i): never a training episode's seed
    panels: dict[str, PanelConfig] = field(
        default_factory=lambda: {"id": PanelConfig("id"), "ood": PanelConfig("ood")})
    max_seconds: float | None = None  # episode timeout; None: the task's max_seconds
    num_inference_steps: int | None = None  # DDIM steps; None: the policy's
    videos: int = 0  # save the first N trials of each panel as mp4 (the first success and failure are always saved)
    workers: int = 1  # processes scoring panels at once (one panel per process); results do not depend on it

    def __post_init__(self):
        if self.n_trials < 1:
            raise ConfigError(f"eval.n_trials: expected >= 1, got {self.n_trials}")
        if not self.panels:
            raise ConfigError("eval.panels: at least one panel is needed")
        if self.workers < 1:
            raise ConfigError(f"eval.workers: expected >= 1, got {self.workers}")
