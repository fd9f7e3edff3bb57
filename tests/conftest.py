"""Test-wide settings: headless MuJoCo, no model-hub downloads, one torch thread (2-core machine)."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import torch
except ImportError:  # torch is optional for the tests that do not use it
    torch = None
if torch is not None:
    torch.set_num_threads(1)
