"""The lab's look: procedural textures, lights with shadows, a tinted robot, and its camera.

``apply_look(mjspec, cell)`` edits the MjSpec of the true scene before it is compiled;
``LabCamera`` renders the true camera with a margin and passes the render through the
sensor model (lens distortion, blur, vignetting, white balance, noise, JPEG).

Textures are generated with numpy from the cell's seeds, so the lab looks the same on
every machine without any image files.
"""
from __future__ import annotations

import cv2
import mujoco
import numpy as np

from comsim.lab.cell import LabCell, TextureLook
from comsim.lab.effects import SensorModel
from comsim.lab.realism import add_clutter, add_distractors, printed_material
from comsim.sim.camera import as_K, opencv_to_mujoco
from comsim.sim.render import SceneRenderer
from comsim.sim.scene import OBJECT_PREFIX, ROBOT_PREFIX, Scene

RENDER_CAMERA_SUFFIX = "_lab_render"  # the true camera with a margin, added by apply_look


# ---------------------------------------------------------------- textures


def _periodic_noise(rng: np.random.Generator, size: int, cells_y: int, cells_x: int) -> np.ndarray:
    """Smooth value noise (size, size), roughly unit variance, that tiles seamlessly."""
    grid = rng.standard_normal((cells_y, cells_x)).astype(np.float32)
    tiled = np.tile(grid, (3, 3))  # interpolate across the wrap, then keep the middle copy
    big = cv2.resize(tiled, (3 * size, 3 * size), interpolation=cv2.INTER_CUBIC)
    return big[size:2 * size, size:2 * size]


def _wood(t: TextureLook, rng: np.random.Generator) -> np.ndarray:
    """Planks along u, each with its own growth rings, tint and a dark seam."""
    n = t.size
    v = np.mgrid[0:n, 0:n][0].astype(np.float32) / n
    planks = 5
    plank = np.minimum((v * planks).astype(int), planks - 1)
    phase = rng.uniform(0, 1, planks).astype(np.float32)[plank]
    tint = rng.uniform(0.88, 1.08, planks).astype(np.float32)[plank]
    warp = 0.6 * _periodic_noise(rng, n, 2, 3) + 0.15 * _periodic_noise(rng, n, 6, 4)
    rings = 0.5 + 0.5 * np.sin(2 * np.pi * (v * 14 * t.scale + 0.35 * warp + phase))
    late_wood = rings ** 3  # thin dark lines, wide light bands
    fibres = _periodic_noise(rng, n, n // 2, max(n // 64, 2))  # long thin streaks along u
    seam = np.abs(((v * planks) % 1.0) - 0.5) > 0.49
    light, dark = np.asarray(t.rgb2, np.float32), np.asarray(t.rgb1, np.float32)
    img = light + (dark - light) * late_wood[..., None]
    img = img * (tint * (1 + 0.06 * fibres))[..., None]
    img[seam] *= 0.55
    return img


def _wall(t: TextureLook, rng: np.random.Generator) -> np.ndarray:
    """Painted wall: vertical gradient (rgb1 bottom -> rgb2 top), soft blotches, panel seams."""
    n = t.size
    v, u = np.mgrid[0:n, 0:n].astype(np.float32) / n
    top, bottom = np.asarray(t.rgb2, np.float32), np.asarray(t.rgb1, np.float32)
    img = bottom + (top - bottom) * (1 - v)[..., None] ** 1.5  # row 0 is the top of the image
    blotches = 0.05 * _periodic_noise(rng, n, 4, 4) + 0.02 * _periodic_noise(rng, n, 16, 16)
    img = img * (1 + blotches)[..., None]
    panels = np.abs(((u * 4 * t.scale) % 1.0) - 0.5) > 0.492
    img[panels] *= 0.8
    return img


def _concrete(t: TextureLook, rng: np.random.Generator) -> np.ndarray:
    """Speckled floor: rgb1 base, rgb2 flecks."""
    n = t.size
    mottle = 0.08 * _periodic_noise(rng, n, 8, 8) + 0.05 * _periodic_noise(rng, n, n // 4, n // 4)
    base = np.asarray(t.rgb1, np.float32) * (1 + mottle)[..., None]
    flecks = rng.random((n, n)) < 0.02
    base[flecks] = np.asarray(t.rgb2, np.float32)
    return base


PATTERNS = {"wood": _wood, "wall": _wall, "concrete": _concrete}


def texture_image(t: TextureLook) -> np.ndarray:
    """uint8 (size, size, 3) image of a TextureLook (deterministic in ``t.seed``)."""
    img = PATTERNS[t.pattern](t, np.random.default_rng(t.seed))
    return np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8)


def _add_textured_material(ms: mujoco.MjSpec, name: str, t: TextureLook) -> str:
    img = texture_image(t)
    tex = ms.add_texture(name=f"lab_{name}", type=mujoco.mjtTexture.mjTEXTURE_2D,
                         width=t.size, height=t.size, nchannel=3)
    tex.data = img.tobytes()
    ms.add_material(name=f"lab_{name}", textures=["", tex.name], texrepeat=t.repeat,
                    specular=t.specular, shininess=t.shininess)
    return f"lab_{name}"


# ---------------------------------------------------------------- the scene's look


def render_camera_name(camera: str) -> str:
    return camera + RENDER_CAMERA_SUFFIX


def render_intrinsics(cell: LabCell) -> tuple[np.ndarray, int, int]:
    """(fx, fy, cx, cy), width, height of the clean render: the true camera plus a margin."""
    cam = cell.scene.camera(cell.camera)
    m = cell.look.render_margin
    fx, fy, cx, cy = as_K(cam.K)
    return np.array([fx, fy, cx + m, cy + m]), cam.width + 2 * m, cam.height + 2 * m


def apply_look(ms: mujoco.MjSpec, cell: LabCell) -> None:
    """Textures, lights, tint and the margin camera, on the true scene's MjSpec (uncompiled)."""
    lk = cell.look
    ms.geom("table").material = _add_textured_material(ms, "table", lk.table)
    ms.geom("backdrop").material = _add_textured_material(ms, "backdrop", lk.backdrop)
    ms.geom("floor").material = _add_textured_material(ms, "floor", lk.floor)

    # The lab's lights replace the spec's (which are the twin's nominal guess, if any).
    for light in list(ms.lights):
        ms.delete(light)
    for light in lk.lights:
        ms.worldbody.add_light(
            pos=light.pos, dir=light.dir, diffuse=light.diffuse, ambient=light.ambient,
            specular=light.specular, castshadow=light.castshadow, cutoff=light.cutoff,
            exponent=light.exponent,
            type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL if light.directional else mujoco.mjtLightType.mjLIGHT_SPOT)

    tint = list(lk.robot_tint) + [1.0]
    for mat in ms.materials:
        if mat.name.startswith(ROBOT_PREFIX):
            mat.rgba = [a * b for a, b in zip(mat.rgba, tint)]
    for geom in ms.geoms:  # robot geoms coloured by rgba rather than a material
        if geom.name.startswith(ROBOT_PREFIX) and not geom.material:
            geom.rgba = [a * b for a, b in zip(geom.rgba, tint)]
    for o in cell.scene.objects:  # same true colour, with a little plastic sheen; some printed
        if o.name in lk.prints:  # the print carries the colour: a geom's rgba would tint the texture
            printed_material(ms, f"lab_{o.name}", o.rgba, lk.prints[o.name], lk.object_specular)
            ms.geom(OBJECT_PREFIX + o.name).rgba = [1.0, 1.0, 1.0, o.rgba[3]]
        else:
            ms.add_material(name=f"lab_{o.name}", rgba=o.rgba, specular=lk.object_specular, shininess=0.5)
        ms.geom(OBJECT_PREFIX + o.name).material = f"lab_{o.name}"
    add_clutter(ms, lk.clutter)
    add_distractors(ms, lk.distractors)

    K, w, h = render_intrinsics(cell)
    cam = cell.scene.camera(cell.camera)
    T_world_from_base = np.eye(4)
    T_world_from_base[:3, 3] = cell.scene.robot.base_pos
    p = opencv_to_mujoco(K, cam.T_cam_from_base, w, h, T_world_from_base)
    ms.worldbody.add_camera(name=render_camera_name(cam.name), pos=p.pos, quat=p.quat,
                            resolution=p.resolution, sensor_size=p.sensorsize,
                            focal_pixel=p.focal_pixel, principal_pixel=p.principal_pixel)
    ms.visual.global_.offwidth = max(ms.visual.global_.offwidth, w)
    ms.visual.global_.offheight = max(ms.visual.global_.offheight, h)


# ---------------------------------------------------------------- the camera


class LabCamera:
    """What the lab's camera records: a wide pinhole render through the sensor model."""

    def __init__(self, scene: Scene, cell: LabCell):
        cam = cell.scene.camera(cell.camera)
        K, w, h = render_intrinsics(cell)
        self.renderer = SceneRenderer(scene, render_camera_name(cam.name))
        self.sensor = SensorModel(cell.look.sensor, cam.K, cam.height, cam.width, render_K=K,
                                  render_size=(w, h))
        self.width, self.height = cam.width, cam.height

    def clean(self, data: mujoco.MjData | None = None) -> np.ndarray:
        """The pinhole render with its margin (no lens, no sensor): uint8 (H + 2m, W + 2m, 3), of the
        scene's state or of ``data``."""
        return self.renderer.rgb(data)

    def rgb(self, rng: np.random.Generator, clean: np.ndarray | None = None, gain: float = 1.0,
            white_balance: np.ndarray | None = None) -> np.ndarray:
        """uint8 (H, W, 3): what the camera records (of ``clean``, default: a render of the scene's state)."""
        return self.sensor(self.renderer.rgb() if clean is None else clean, rng, gain, white_balance)

    def segmentation(self) -> np.ndarray:
        """int32 (H, W) labels (CONTRACTS.md) in the recorded, distorted image geometry."""
        return self.sensor.warp_labels(self.renderer.segmentation())

    def close(self) -> None:
        self.renderer.close()
