"""Policy stage: an image-based Diffusion Policy, mixtures with an explicit synthetic fraction,
closed-loop scoring in the lab, and the Compositional Simulation experiment.

    from comsim.policy import DiffusionPolicy, evaluate, load_experiment, run_experiment

Modules: config (dataclasses), model (DiffusionPolicy), data (MixtureDataset), training
(train_policy), rollout (evaluate, wilson_interval), experiment (arms, sweep, results table).
Entry points: ``train/train_policy.py`` and ``eval/eval_policy.py``.
"""
from comsim.policy.config import (PRESETS, DiffusionConfig, EvalConfig, MixtureConfig, PanelConfig, PolicyRunConfig,
                                  SourceConfig, TrainConfig, diffusion_config)
from comsim.policy.data import MixtureDataset
from comsim.policy.experiment import ExperimentConfig, arm_run, load_experiment, run_experiment
from comsim.policy.model import DiffusionPolicy
from comsim.policy.rollout import evaluate, trial_seeds, wilson_interval
from comsim.policy.training import train_policy

__all__ = ["PRESETS", "DiffusionConfig", "DiffusionPolicy", "EvalConfig", "ExperimentConfig", "MixtureConfig",
           "MixtureDataset", "PanelConfig", "PolicyRunConfig", "SourceConfig", "TrainConfig", "arm_run",
           "diffusion_config", "evaluate", "load_experiment", "run_experiment", "train_policy", "trial_seeds",
           "wilson_interval"]
