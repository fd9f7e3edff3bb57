"""Policy stage: an image-based Diffusion Policy (the GPU default) and a keypoint policy (the
CPU one), mixtures with an explicit synthetic fraction, closed-loop scoring in the lab, and
the Compositional Simulation experiment.

    from comsim.policy import evaluate, load_experiment, load_policy, run_experiment

Modules: config (dataclasses; ``policy.type`` picks the policy), model (DiffusionPolicy),
keypoint (KeypointConfig, KeypointPolicy), policies (make_policy, load_policy), data
(MixtureDataset), training (train_policy), rollout (evaluate, wilson_interval), experiment
(arms, sweep, results table).
Entry points: ``train/train_policy.py`` and ``eval/eval_policy.py``.
"""
from comsim.policy.config import (PRESETS, DiffusionConfig, EvalConfig, MixtureConfig, PanelConfig, PolicyRunConfig,
                                  SourceConfig, TrainConfig, diffusion_config, policy_config)
from comsim.policy.data import MixtureDataset
from comsim.policy.experiment import ExperimentConfig, arm_run, load_experiment, run_experiment
from comsim.policy.keypoint import KeypointConfig, KeypointPolicy
from comsim.policy.model import DiffusionPolicy
from comsim.policy.policies import load_policy, make_policy
from comsim.policy.rollout import evaluate, trial_seeds, wilson_interval
from comsim.policy.training import train_policy

__all__ = ["PRESETS", "DiffusionConfig", "DiffusionPolicy", "EvalConfig", "ExperimentConfig", "KeypointConfig",
           "KeypointPolicy", "MixtureConfig", "MixtureDataset", "PanelConfig", "PolicyRunConfig", "SourceConfig",
           "TrainConfig", "arm_run", "diffusion_config", "evaluate", "load_experiment", "load_policy", "make_policy",
           "policy_config", "run_experiment", "train_policy", "trial_seeds", "wilson_interval"]
