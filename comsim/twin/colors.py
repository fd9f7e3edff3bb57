"""Colour alignment: the twin's table, backdrop, floor, robot and object colours from real frames.

What a material's rgba becomes on screen depends on the twin's lights, so colours are
not copied from pixels: they are matched. Each region (a set of pixels that the aligned
twin says shows the table, the wall, the floor, the robot or an object, eroded away
from boundaries) has a robust mean colour in the real frame; the twin is rendered with
its current colours, the same region's mean is measured, and each rgba is scaled per
channel by observed / rendered. Three rounds bring the twin's region means to the real
ones (up to what the twin's lighting can express, e.g. saturation at 1.0).

The robot has materials (and textures) rather than one rgba: it gets a per-channel tint
that multiplies them (``apply_robot_tint``).
"""
from __future__ import annotations

import copy

import cv2
import mujoco
import numpy as np

from comsim.sim.scene import OBJECT_PREFIX, ROBOT_PREFIX, Scene, apply_robot_tint, build_mjspec
from comsim.sim.spec import SceneSpec

ROUNDS = 3


def twin_scene(spec: SceneSpec, robot_tint=None) -> Scene:
    ms = build_mjspec(spec)
    if robot_tint is not None:
        apply_robot_tint(ms, robot_tint)
    return Scene(spec, mjspec=ms)


def region_masks(scene: Scene, camera: str, width: int, height: int, erode_px: int = 1) -> dict[str, np.ndarray]:
    """Pixels of each named region in the twin's view (geom-level segmentation), eroded."""
    m = scene.model
    r = mujoco.Renderer(m, height, width)
    try:
        r.enable_segmentation_rendering()
        r.update_scene(scene.data, m.camera(camera).id)
        seg = r.render()
    finally:
        r.close()
    gid, gtype = seg[..., 0], seg[..., 1]
    is_geom = gtype == int(mujoco.mjtObj.mjOBJ_GEOM)
    names = np.array([m.geom(i).name for i in range(m.ngeom)] + [""])
    body_names = np.array([m.body(m.geom_bodyid[i]).name for i in range(m.ngeom)] + [""])
    g = np.where(is_geom, gid, -1)
    regions = {"table": names[g] == "table", "wall": names[g] == "backdrop", "floor": names[g] == "floor",
               "robot": np.char.startswith(body_names[g], ROBOT_PREFIX)}
    for o in scene.spec.objects:
        regions[o.name] = body_names[g] == OBJECT_PREFIX + o.name
    k = np.ones((2 * erode_px + 1, 2 * erode_px + 1), np.uint8)
    return {n: cv2.erode(v.astype(np.uint8), k) > 0 if erode_px else v for n, v in regions.items()}


def _region_means(img: np.ndarray, regions: dict[str, np.ndarray], min_px: int = 4) -> dict[str, np.ndarray]:
    out = {}
    for name, m in regions.items():
        if m.sum() >= min_px:
            out[name] = np.median(img[m].astype(np.float64), axis=0)  # median: highlights and stray pixels
    return out


def _render_rgb(scene: Scene, camera: str, width: int, height: int) -> np.ndarray:
    r = mujoco.Renderer(scene.model, height, width)
    try:
        r.update_scene(scene.data, scene.model.camera(camera).id)
        return r.render()
    finally:
        r.close()


def estimate_colors(spec: SceneSpec, camera: str, image: np.ndarray, arm_qpos, gripper_width: float,
                    object_poses: dict | None = None, valid: np.ndarray | None = None, body: dict | None = None) -> dict:
    """Colours that make the twin's view of ``image`` (pinhole, the aligned camera) match it.

    ``arm_qpos`` / ``gripper_width``: the robot's state in that frame; ``object_poses``:
    {name: (pos, quat)} localized in it; ``valid`` (H, W): pixels that may be used; ``body``: {name: (H, W)
    bool} the pixels of a printed object that show its body colour (``prints.body_pixels``): its colour is
    matched on those of them inside its (uneroded) region instead, when there are at least four.
    Returns {"table", "wall", "floor": rgba, "robot_tint": rgb, "objects": {name: rgba},
    "residual": per-region mean abs difference (0-255) after matching}.
    """
    spec = copy.deepcopy(spec)
    H, W = image.shape[:2]
    tint = np.ones(3)
    colors = {}
    for rnd in range(ROUNDS + 1):
        scene = twin_scene(spec, tint)
        scene.reset(arm_qpos=arm_qpos, object_poses=object_poses)
        scene.set_robot_qpos(arm_qpos, gripper_width)
        regions = region_masks(scene, camera, W, H)
        if body:
            whole = region_masks(scene, camera, W, H, erode_px=0)
            for name, m in body.items():
                if name in whole and (whole[name] & m).sum() >= 4:
                    regions[name] = whole[name] & m
        if valid is not None:
            regions = {n: m & valid for n, m in regions.items()}
        observed = _region_means(image, regions)
        rendered = _region_means(_render_rgb(scene, camera, W, H), regions)
        residual = {n: float(np.abs(observed[n] - rendered[n]).mean()) for n in observed if n in rendered}
        colors = _current(spec, tint, residual)
        if rnd == ROUNDS:
            break
        for name in observed:
            if name not in rendered:
                continue
            gain = (observed[name] + 1.0) / (rendered[name] + 1.0)
            if name == "robot":
                tint = np.clip(tint * gain, 0.05, 4.0)
            else:
                _scale_rgba(spec, name, gain)
    return colors


def _scale_rgba(spec: SceneSpec, name: str, gain: np.ndarray) -> None:
    def scaled(rgba):
        return [float(v) for v in np.clip(np.asarray(rgba[:3]) * gain, 0.0, 1.0)] + [float(rgba[3])]
    if name == "table":
        spec.table.rgba = scaled(spec.table.rgba)
    elif name == "wall":
        spec.backdrop.wall_rgba = scaled(spec.backdrop.wall_rgba)
    elif name == "floor":
        spec.backdrop.floor_rgba = scaled(spec.backdrop.floor_rgba)
    else:
        for o in spec.objects:
            if o.name == name:
                o.rgba = scaled(o.rgba)


def _current(spec: SceneSpec, tint, residual) -> dict:
    return {"table": list(spec.table.rgba), "wall": list(spec.backdrop.wall_rgba),
            "floor": list(spec.backdrop.floor_rgba), "robot_tint": [float(v) for v in tint],
            "objects": {o.name: list(o.rgba) for o in spec.objects}, "residual": residual}


def apply_colors(spec: SceneSpec, colors: dict) -> None:
    """Write estimated colours into a SceneSpec; the robot tint goes into ``robot.tint`` (on top of
    any tint the spec had: the estimate was rendered with it), which the scene builder applies."""
    old = np.ones(3) if spec.robot.tint is None else np.asarray(spec.robot.tint, np.float64)
    spec.robot.tint = [float(v) for v in np.clip(old * np.asarray(colors["robot_tint"], np.float64), 0.0, 4.0)]
    spec.table.rgba = list(colors["table"])
    spec.backdrop.wall_rgba = list(colors["wall"])
    spec.backdrop.floor_rgba = list(colors["floor"])
    for o in spec.objects:
        if o.name in colors.get("objects", {}):
            o.rgba = list(colors["objects"][o.name])
