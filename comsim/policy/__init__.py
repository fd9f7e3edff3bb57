"""Policy stage: an image-based Diffusion Policy (the GPU default) and a keypoint policy (the
CPU one), both on one base class, trained on mixtures with an explicit synthetic fraction.

    from comsim.policy import load_policy, make_policy, train_policy

Modules: base (Policy: normalisation, the closed loop, save / load), config (dataclasses;
``policy.type`` picks the policy), model (DiffusionPolicy), keypoint (KeypointConfig,
KeypointPolicy), policies (make_policy, load_policy), data (MixtureDataset), training
(train_policy). Scoring a policy closed-loop is the lab's (``comsim.lab.rollout``); the
experiment that trains and scores arms is the pipeline's (``comsim.pipeline.experiment``).
Entry points: ``train/train_policy.py`` and ``eval/eval_policy.py``.
"""
from comsim.policy.base import Policy
from comsim.policy.config import MixtureConfig, PolicyRunConfig, SourceConfig, TrainConfig, policy_config
from comsim.policy.data import MixtureDataset
from comsim.policy.keypoint import KeypointConfig, KeypointPolicy
from comsim.policy.model import PRESETS, DiffusionConfig, DiffusionPolicy, diffusion_config
from comsim.policy.policies import load_policy, make_policy
from comsim.policy.training import train_policy

__all__ = ["PRESETS", "DiffusionConfig", "DiffusionPolicy", "KeypointConfig", "KeypointPolicy", "MixtureConfig",
           "MixtureDataset", "Policy", "PolicyRunConfig", "SourceConfig", "TrainConfig", "diffusion_config",
           "load_policy", "make_policy", "policy_config", "train_policy"]
