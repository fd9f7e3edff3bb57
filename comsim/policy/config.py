"""Typed configs of the policy stage (YAML -> dataclasses with comsim.config).

``DiffusionConfig`` (in ``model.py``, beside its model, LeRobot style) has
LeRobot's Diffusion Policy defaults, ``KeypointConfig`` is in ``keypoint.py``.
``MixtureConfig`` says which datasets a policy trains on and with which synthetic
fraction; ``TrainConfig`` the optimisation; ``PolicyRunConfig`` is one training run
(what ``train/train_policy.py`` runs, and what each experiment arm resolves to).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from comsim.config import PRECISIONS, ConfigError, from_dict
from comsim.policy.keypoint import KeypointConfig
from comsim.policy.model import diffusion_config

SOURCE_ROLES = ("auto", "real", "synthetic")
REAL_SOURCES = ("real", "lab")  # provenance sources that count as real; sim / pseudo_real are synthetic


POLICY_TYPES = ("diffusion", "keypoint")


def policy_config(data: dict | None = None, where: str = "policy"):
    """The config of the policy a YAML mapping names with ``type`` (default ``diffusion``:
    the GPU default; ``keypoint``: the CPU policy of ``keypoint.py``)."""
    data = dict(data or {})
    kind = data.pop("type", "diffusion")
    if kind == "diffusion":
        return diffusion_config(data, where)
    if kind == "keypoint":
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
    # torch.compile the policy for training: fused kernels (on 2 CPU cores the keypoint policy's step
    # takes about 60% of the eager time, after ~30 s of compiling). Needs a C++ compiler on CPU. The
    # saved policy is the same module; scoring runs it eagerly. Compiled arithmetic rounds differently,
    # so a compiled run is a run of its own (its own arm key), deterministic like an eager one.
    compile: bool = False
    # bf16: the forward pass and the loss under torch.autocast (the weights, the optimiser and the saved
    # policy stay float32; scoring runs in float32). On CPUs with AMX / AVX512-BF16 the keypoint
    # policy's compiled 1-thread step takes ~0.85 of the float32 time. A run of its own (its own arm key).
    precision: str = "fp32"  # fp32 | bf16

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision: expected fp32 or bf16, got {self.precision!r}")
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
