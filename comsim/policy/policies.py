"""The policy classes by config type: build one for training, load a saved one by its config.json.

    policy = make_policy(policy_config({"type": "keypoint"}), stats=data.stats())
    policy = load_policy("runs/exp/arms/real10-1a2b/policy")   # DiffusionPolicy or KeypointPolicy
"""
from __future__ import annotations

import json
from pathlib import Path

from comsim.policy.base import CONFIG_NAME
from comsim.policy.keypoint import KeypointConfig, KeypointPolicy
from comsim.policy.model import DiffusionConfig, DiffusionPolicy

CLASSES = {"diffusion": (DiffusionConfig, DiffusionPolicy), "keypoint": (KeypointConfig, KeypointPolicy)}


def make_policy(cfg: DiffusionConfig | KeypointConfig, stats: dict | None = None):
    for config_cls, policy_cls in CLASSES.values():
        if isinstance(cfg, config_cls):
            return policy_cls(cfg, stats=stats)
    raise TypeError(f"make_policy: no policy for a {type(cfg).__name__}")


def load_policy(path: str | Path, map_location: str = "cpu"):
    """A saved policy folder (config.json + model.safetensors) -> the policy its config names."""
    cfg = Path(path) / CONFIG_NAME
    if not cfg.is_file():
        raise FileNotFoundError(f"{cfg}: not found (not a saved policy folder)")
    kind = json.loads(cfg.read_text()).get("type", "diffusion")
    if kind not in CLASSES:
        raise ValueError(f"{cfg}: type {kind!r} is not a policy type ({sorted(CLASSES)})")
    return CLASSES[kind][1].from_pretrained(path, map_location=map_location)
