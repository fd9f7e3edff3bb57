"""Names of the camera keys in a dataset, in one place (LeRobot keeps its own in utils/constants.py).

A camera ``front`` of a paired, factory or converted dataset is stored under these keys
(each one an mp4 under ``observation.images.<key>``):

    front            what the robot's camera saw: real, lab, or pseudo-real after conversion
    front_sim        the twin's (or the factory's) render of the same instant
    front_sim_seg    optional control channels of that render: segmentation labels,
    front_sim_depth  depth,
    front_sim_normal surface normals in the camera frame
"""
from __future__ import annotations

SIM_SUFFIX = "_sim"
CONTROLS = ("seg", "depth", "normal")  # the control channels a render can be recorded with



def sim_key(camera: str) -> str:
    """``front`` -> ``front_sim``: the render of ``camera``."""
    return f"{camera}{SIM_SUFFIX}"


def control_key(camera: str, control: str) -> str:
    """``front``, ``seg`` -> ``front_sim_seg``: a control channel of the render of ``camera``."""
    return f"{sim_key(camera)}_{control}"


def seg_key(camera: str) -> str:
    return control_key(camera, "seg")


def depth_key(camera: str) -> str:
    return control_key(camera, "depth")


def normal_key(camera: str) -> str:
    return control_key(camera, "normal")


def is_sim_key(key: str) -> bool:
    """True for a render (``front_sim``) or one of its control channels (``front_sim_seg``)."""
    return key.endswith(SIM_SUFFIX) or any(key.endswith(f"{SIM_SUFFIX}_{c}") for c in CONTROLS)


def seen_cameras(keys) -> list[str]:
    """The keys of what a camera saw (real, lab or pseudo-real), in order: no renders, no controls."""
    return [k for k in keys if not is_sim_key(k)]
