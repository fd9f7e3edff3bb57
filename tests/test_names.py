"""The names a run and a dataset are made of, each defined once: camera keys, the run folder."""
from comsim.io.keys import (control_key, depth_key, is_sim_key, seen_cameras, seg_key, sim_key)


def test_camera_keys():
    assert sim_key("front") == "front_sim"
    assert seg_key("front") == control_key("front", "seg") == "front_sim_seg"
    assert depth_key("wrist") == "wrist_sim_depth"
    keys = ["front", "front_sim", "front_sim_seg", "front_sim_depth", "wrist", "wrist_sim", "simple"]
    assert [k for k in keys if is_sim_key(k)] == ["front_sim", "front_sim_seg", "front_sim_depth", "wrist_sim"]
    assert seen_cameras(keys) == ["front", "wrist", "simple"]
