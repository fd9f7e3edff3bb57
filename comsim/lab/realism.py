"""What a real cell has and its twin never models: the lab's realism options.

Each is an option of the lab cell YAML, off by default, so any cell can switch each on
(``configs/lab/workshop.yaml`` uses them all):

- ``look.prints``: an object's faces carry a print (stripes, a logo, a label with text) over
  its colour; the twin knows one flat colour per object;
- ``look.clutter``: static items on the table and along the back, drawn only (nothing collides
  with them, so they never block a task) and labelled background;
- ``look.distractors``: shapes that pass through the background in some episodes;
- ``look.light_drift``: each episode's lights are brighter or dimmer, tinted, tilted and moved;
- ``look.exposure``: each episode's exposure gain and white balance differ, and auto-exposure
  follows the scene's brightness frame by frame;
- ``look.camera_motion``: the camera was bumped after its calibration stills (a fixed offset
  of about a pixel, plus a little per episode) and drifts slowly within an episode;
- ``look.motion_blur``: each frame integrates the scene over an exposure time (renders at
  states between the previous frame and this one, averaged);
- ``physics_drift``: each episode's object friction and mass differ from the cell's.

Everything drawn per episode comes from the episode seed alone (``episode_conditions``), each
option from a random stream of its own, whether it is on or not: one option switched off leaves
the others' draws (and the layout, operator and sensor noise) as they were.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import mujoco
import numpy as np

from comsim.sim.camera import opencv_to_mujoco, shifted_camera

CONDITIONS_STREAM = 4  # after layout, sensor, operator and the calibration stills (env.py, stills.py)
PRINT_PATTERNS = ("stripes", "checker", "two_tone", "logo", "label")
SHAPES = ("box", "cylinder", "sphere")
CLUTTER_PREFIX = "clutter/"
DISTRACTOR_PREFIX = "distractor/"
PARKED = (50.0, 50.0, -10.0)  # a distractor out of its episode's time window: far out of view


# ---------------------------------------------------------------- options (lab cell YAML)


@dataclass
class PrintLook:
    """A print on every face of an object: the object's colour plus ``rgb``."""
    pattern: str = "stripes"  # stripes | checker | two_tone | logo | label
    rgb: list[float] = field(default_factory=lambda: [0.95, 0.95, 0.92])  # the printed colour
    count: int = 3  # stripes, or checker squares per side
    coverage: float = 0.4  # fraction of each face in ink (stripes, two_tone, logo, label; a checker is half)
    text: str = ""  # label: printed in a dark shade of the object's colour
    size: int = 64  # texture pixels per face side


@dataclass
class ClutterItem:
    """A static item the twin does not contain (drawn only; segmentation: background)."""
    name: str
    size: list[float]  # box: full x, y, z; cylinder: radius, height; sphere: radius
    pos: list[float]  # [x, y] standing on the table top, or [x, y, z] of its centre
    shape: str = "box"  # box | cylinder | sphere
    yaw: float = 0.0
    rgba: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5, 1.0])
    print: PrintLook | None = None
    specular: float = 0.2


@dataclass
class DistractorLook:
    """A shape passing through the background in some episodes (drawn only, never collides)."""
    probability: float = 0.5  # chance per episode that it passes
    shape: str = "box"
    size: list[float] = field(default_factory=lambda: [0.08, 0.08, 0.3])  # as ClutterItem.size
    colors: list[list[float]] = field(default_factory=lambda: [[0.2, 0.2, 0.22, 1.0]])  # one drawn per episode
    start: list[float] = field(default_factory=lambda: [-0.35, -0.9, 0.2])  # world x, y, z of its centre
    end: list[float] = field(default_factory=lambda: [-0.35, 0.9, 0.2])
    jitter_m: float = 0.05  # start and end moved by up to this per episode (each axis)
    speed: list[float] = field(default_factory=lambda: [0.15, 0.4])  # m/s
    start_s: list[float] = field(default_factory=lambda: [0.0, 6.0])  # when it appears, into the episode


@dataclass
class LightDrift:
    """How each episode's lights differ from the cell's (uniform draws per episode)."""
    intensity: float = 0.0  # diffuse and ambient scaled by a factor in [1 - intensity, 1 + intensity]
    color: float = 0.0  # ... and each channel by a factor in [1 - color, 1 + color]
    direction_deg: float = 0.0  # each light's direction turned by up to this / sqrt(2) about each axis
    position_m: float = 0.0  # each light moved by up to this along x and y


@dataclass
class ExposureLook:
    """Each episode's exposure and white balance, and auto-exposure within it."""
    # per episode, log-uniform in [low, high]: the exposure, or with auto-exposure its compensation
    gain: list[float] = field(default_factory=lambda: [1.0, 1.0])
    white_balance: float = 0.0  # per episode, each channel's gain times a factor in [1 - wb, 1 + wb]
    auto: float = 0.0  # 0: fixed gain; 1: the gain fully compensates the scene's mean brightness
    target: float = 110.0  # mean grey level (of the clean render) auto-exposure aims at
    speed: float = 0.3  # fraction of the way to the new gain taken each frame


@dataclass
class CameraMotion:
    """The camera moves a little after calibration: an image shift as a rotation about its centre."""
    offset_px: list[float] = field(default_factory=lambda: [0.0, 0.0])  # every episode vs the stills (x, y)
    jitter_px: float = 0.0  # each episode's offset differs by up to this (each axis)
    drift_px: float = 0.0  # amplitude of a slow sinusoidal drift within an episode (each axis)
    drift_period_s: list[float] = field(default_factory=lambda: [20.0, 60.0])  # its period, per episode


@dataclass
class MotionBlur:
    exposure: float = 0.0  # fraction of the frame interval the shutter is open (0: no blur)
    samples: int = 3  # renders averaged over the exposure


@dataclass
class PhysicsDrift:
    """Each episode's object physics, against the cell's ``scene.objects`` (uniform factors)."""
    friction: list[float] = field(default_factory=lambda: [1.0, 1.0])  # on every object's sliding friction
    mass: list[float] = field(default_factory=lambda: [1.0, 1.0])  # on every object's mass and inertia


def validate_realism(look, physics_drift: PhysicsDrift, object_names: set[str]) -> None:
    """ConfigError naming the key of a malformed realism option (called by ``validate_lab_cell``)."""
    from comsim.config import ConfigError

    def rgb(key, v, n=3):
        if len(v) != n or min(v) < 0 or max(v) > 1:
            raise ConfigError(f"{key}: expected {n} values in [0, 1], got {v}")

    def low_high(key, v, lo=0.0):
        if len(v) != 2 or v[0] > v[1] or v[0] < lo:
            raise ConfigError(f"{key}: expected [low, high] with {lo} <= low <= high, got {v}")

    def print_look(key, p: PrintLook):
        if p.pattern not in PRINT_PATTERNS:
            raise ConfigError(f"{key}.pattern: expected one of {PRINT_PATTERNS}, got {p.pattern!r}")
        rgb(f"{key}.rgb", p.rgb)
        if not 1 <= p.count <= 32 or not 8 <= p.size <= 1024 or not 0 < p.coverage < 1:
            raise ConfigError(f"{key}: expected count in 1..32, size in 8..1024 and coverage in (0, 1), "
                              f"got {p.count}, {p.size}, {p.coverage}")

    def shape_size(key, shape, size):
        want = {"box": 3, "cylinder": 2, "sphere": 1}
        if shape not in SHAPES:
            raise ConfigError(f"{key}.shape: expected one of {SHAPES}, got {shape!r}")
        if len(size) != want[shape] or min(size) <= 0:
            raise ConfigError(f"{key}.size: a {shape} needs {want[shape]} positive sizes, got {size}")

    for name, p in look.prints.items():
        if name not in object_names:
            raise ConfigError(f"look.prints.{name}: no object {name!r} in scene.objects {sorted(object_names)}")
        print_look(f"look.prints.{name}", p)
    seen = set()
    for i, c in enumerate(look.clutter):
        key = f"look.clutter[{i}]"
        if c.name in seen:
            raise ConfigError(f"{key}.name: {c.name!r} is used twice")
        seen.add(c.name)
        shape_size(key, c.shape, c.size)
        if len(c.pos) not in (2, 3):
            raise ConfigError(f"{key}.pos: expected [x, y] or [x, y, z], got {c.pos}")
        rgb(f"{key}.rgba", c.rgba, 4)
        if c.print is not None:
            print_look(f"{key}.print", c.print)
    for i, d in enumerate(look.distractors):
        key = f"look.distractors[{i}]"
        shape_size(key, d.shape, d.size)
        if not 0 <= d.probability <= 1:
            raise ConfigError(f"{key}.probability: expected 0..1, got {d.probability}")
        if not d.colors:
            raise ConfigError(f"{key}.colors: expected at least one rgba")
        for j, c in enumerate(d.colors):
            rgb(f"{key}.colors[{j}]", c, 4)
        for k in ("start", "end"):
            if len(getattr(d, k)) != 3:
                raise ConfigError(f"{key}.{k}: expected [x, y, z], got {getattr(d, k)}")
        low_high(f"{key}.speed", d.speed, 1e-6)
        low_high(f"{key}.start_s", d.start_s)
    ld = look.light_drift
    if not (0 <= ld.intensity < 1 and 0 <= ld.color < 1 and 0 <= ld.direction_deg <= 45 and ld.position_m >= 0):
        raise ConfigError(f"look.light_drift: expected intensity and color in [0, 1), direction_deg in [0, 45] "
                          f"and position_m >= 0, got {ld}")
    ex = look.exposure
    low_high("look.exposure.gain", ex.gain, 1e-3)
    if not (0 <= ex.white_balance < 1 and 0 <= ex.auto <= 1 and 0 < ex.speed <= 1 and 1 <= ex.target <= 254):
        raise ConfigError(f"look.exposure: expected white_balance in [0, 1), auto in [0, 1], speed in (0, 1] "
                          f"and target in [1, 254], got {ex}")
    cm = look.camera_motion
    if len(cm.offset_px) != 2 or cm.jitter_px < 0 or cm.drift_px < 0:
        raise ConfigError(f"look.camera_motion: expected offset_px [x, y] and jitter_px, drift_px >= 0, got {cm}")
    low_high("look.camera_motion.drift_period_s", cm.drift_period_s, 1e-3)
    mb = look.motion_blur
    if not (0 <= mb.exposure <= 1 and 2 <= mb.samples <= 16):
        raise ConfigError(f"look.motion_blur: expected exposure in [0, 1] and samples in 2..16, got {mb}")
    low_high("physics_drift.friction", physics_drift.friction, 1e-3)
    low_high("physics_drift.mass", physics_drift.mass, 1e-3)


# ---------------------------------------------------------------- the scene (uncompiled)


def print_image(base_rgb, p: PrintLook) -> np.ndarray:
    """uint8 (size, size, 3): one face of an object printed with ``p`` over ``base_rgb``."""
    n = p.size
    base, ink = np.asarray(base_rgb[:3], np.float32), np.asarray(p.rgb, np.float32)
    v, u = (np.mgrid[0:n, 0:n].astype(np.float32) + 0.5) / n
    if p.pattern == "stripes":  # count evenly spaced bands of ink, coverage / count wide each
        on = np.abs((v * p.count) % 1.0 - 0.5) < p.coverage / 2
    elif p.pattern == "checker":
        on = (np.floor(u * p.count) + np.floor(v * p.count)).astype(int) % 2 == 1
    elif p.pattern == "two_tone":
        on = v >= 1.0 - p.coverage
    elif p.pattern == "logo":  # a ring with a dot in it, scaled to cover ``coverage`` of the face
        r = np.hypot(u - 0.5, v - 0.5) / np.sqrt(p.coverage / (np.pi * (0.34**2 - 0.22**2 + 0.1**2)))
        on = ((r > 0.22) & (r < 0.34)) | (r < 0.1)
    else:  # label: a band across the face (it wraps round the object), with text on it
        on = np.abs(v - 0.5) < p.coverage / 2
    img = np.where(on[..., None], ink, base)
    out = np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8)
    if p.pattern == "label" and p.text:
        scale = n / 64 * 0.5
        (tw, th), _ = cv2.getTextSize(p.text, cv2.FONT_HERSHEY_SIMPLEX, scale, max(1, n // 40))
        scale *= min(1.0, 0.9 * n / max(tw, 1))
        (tw, th), _ = cv2.getTextSize(p.text, cv2.FONT_HERSHEY_SIMPLEX, scale, max(1, n // 40))
        dark = tuple(int(c) for c in np.clip(base * 0.35 * 255, 0, 255))
        out = np.ascontiguousarray(out)
        cv2.putText(out, p.text, ((n - tw) // 2, (n + th) // 2), cv2.FONT_HERSHEY_SIMPLEX, scale, dark,
                    max(1, n // 40), cv2.LINE_AA)
    return out


def printed_material(ms: mujoco.MjSpec, name: str, rgba, p: PrintLook, specular: float,
                     shininess: float = 0.5) -> str:
    """A material whose texture is ``p`` printed over ``rgba`` on every face; returns its name."""
    img = print_image(rgba, p)
    tex = ms.add_texture(name=name, type=mujoco.mjtTexture.mjTEXTURE_CUBE, width=p.size, height=p.size,
                         nchannel=3)  # one image: the same print on all six faces
    tex.data = img.tobytes()
    ms.add_material(name=name, textures=["", tex.name], rgba=[1.0, 1.0, 1.0, float(rgba[3])],
                    specular=specular, shininess=shininess)
    return name


def _geom_type_size(shape: str, size):
    if shape == "box":
        return mujoco.mjtGeom.mjGEOM_BOX, [v / 2 for v in size]
    if shape == "cylinder":
        return mujoco.mjtGeom.mjGEOM_CYLINDER, [size[0], size[1] / 2, 0]
    return mujoco.mjtGeom.mjGEOM_SPHERE, [size[0], 0, 0]


def _half_height(shape: str, size) -> float:
    return size[2] / 2 if shape == "box" else size[1] / 2 if shape == "cylinder" else size[0]


def add_clutter(ms: mujoco.MjSpec, items: list[ClutterItem]) -> None:
    for c in items:
        gtype, size = _geom_type_size(c.shape, c.size)
        pos = list(c.pos) if len(c.pos) == 3 else [c.pos[0], c.pos[1], _half_height(c.shape, c.size)]
        kw = dict(rgba=list(c.rgba))
        if c.print is not None:
            kw = dict(material=printed_material(ms, f"lab_{CLUTTER_PREFIX}{c.name}", c.rgba, c.print, c.specular))
        ms.worldbody.add_geom(name=CLUTTER_PREFIX + c.name, type=gtype, size=size, pos=pos,
                              quat=[np.cos(c.yaw / 2), 0, 0, np.sin(c.yaw / 2)], contype=0, conaffinity=0,
                              **kw)


def add_distractors(ms: mujoco.MjSpec, items: list[DistractorLook]) -> None:
    """Each distractor is a mocap body: placed per frame, never simulated."""
    for i, d in enumerate(items):
        gtype, size = _geom_type_size(d.shape, d.size)
        body = ms.worldbody.add_body(name=f"{DISTRACTOR_PREFIX}{i}", pos=list(PARKED), mocap=True)
        body.add_geom(name=f"{DISTRACTOR_PREFIX}{i}", type=gtype, size=size, rgba=list(d.colors[0]),
                      contype=0, conaffinity=0)


# ---------------------------------------------------------------- one episode's conditions


@dataclass
class EpisodeConditions:
    """What differs in one episode: drawn by ``episode_conditions`` from its seed."""
    light_factor: np.ndarray  # (n_lights, 3) on diffuse and ambient
    light_tilt: np.ndarray  # (n_lights, 3) rotation vectors applied to each light's direction
    light_shift: np.ndarray  # (n_lights, 3) metres added to each light's position
    gain: float  # exposure gain at the start
    white_balance: np.ndarray  # (3,) factors on the sensor's white balance
    camera_offset_px: np.ndarray  # (2,)
    drift_px: np.ndarray  # (2,) amplitude
    drift_period_s: np.ndarray  # (2,)
    drift_phase: np.ndarray  # (2,)
    distractors: list[dict | None]  # per distractor: start, end, t0, speed, rgba; None: not this episode
    friction: np.ndarray  # (n_objects,) factors
    mass: np.ndarray  # (n_objects,) factors

    def camera_shift_px(self, t: float) -> np.ndarray:
        """Image shift (x, y) in pixels at ``t`` seconds into the episode."""
        return self.camera_offset_px + self.drift_px * np.sin(2 * np.pi * t / self.drift_period_s + self.drift_phase)

    def distractor_pos(self, i: int, t: float) -> np.ndarray:
        d = self.distractors[i]
        if d is None:
            return np.asarray(PARKED)
        run = np.linalg.norm(d["end"] - d["start"])
        s = (t - d["t0"]) * d["speed"]
        if s < 0 or s > run:
            return np.asarray(PARKED)
        return d["start"] + (d["end"] - d["start"]) * (s / max(run, 1e-9))


def episode_conditions(cell, seed: int) -> EpisodeConditions:
    """The conditions of the episode with ``seed``: the same seed, the same conditions.

    Each option draws from a random stream of its own, and draws its values whether it is on or
    not: switching one option off (or removing a distractor) leaves the others' draws unchanged."""
    def stream(k: int) -> np.random.Generator:
        return np.random.default_rng([int(seed), CONDITIONS_STREAM, k])

    def u(rng, a, shape):
        return rng.uniform(-1.0, 1.0, shape) * a

    lk = cell.look
    n_lights, n_obj = len(lk.lights), len(cell.scene.objects)
    ld, rng = lk.light_drift, stream(0)
    light_factor = (1.0 + u(rng, ld.intensity, (n_lights, 1))) * (1.0 + u(rng, ld.color, (n_lights, 3)))
    light_tilt = u(rng, np.radians(ld.direction_deg) / np.sqrt(2), (n_lights, 3))
    light_shift = np.concatenate([u(rng, ld.position_m, (n_lights, 2)), np.zeros((n_lights, 1))], 1)
    ex, rng = lk.exposure, stream(1)
    gain = float(np.exp(rng.uniform(np.log(ex.gain[0]), np.log(ex.gain[1]))))
    wb = 1.0 + u(rng, ex.white_balance, 3)
    cm, rng = lk.camera_motion, stream(2)
    offset = np.asarray(cm.offset_px, np.float64) + u(rng, cm.jitter_px, 2)
    drift = np.full(2, cm.drift_px) * rng.uniform(0.5, 1.0, 2)
    period = rng.uniform(cm.drift_period_s[0], cm.drift_period_s[1], 2)
    phase = rng.uniform(0, 2 * np.pi, 2)
    distractors = []
    for i, d in enumerate(lk.distractors):
        rng = stream(10 + i)
        on = rng.uniform() < d.probability
        start = np.asarray(d.start, np.float64) + u(rng, d.jitter_m, 3)
        end = np.asarray(d.end, np.float64) + u(rng, d.jitter_m, 3)
        speed, t0 = rng.uniform(*d.speed), rng.uniform(*d.start_s)
        rgba = d.colors[int(rng.integers(len(d.colors)))]
        distractors.append({"start": start, "end": end, "speed": float(speed), "t0": float(t0),
                            "rgba": list(rgba)} if on else None)
    pd, rng = cell.physics_drift, stream(3)
    friction = rng.uniform(pd.friction[0], pd.friction[1], n_obj)
    mass = rng.uniform(pd.mass[0], pd.mass[1], n_obj)
    return EpisodeConditions(light_factor, light_tilt, light_shift, gain, wb, offset, drift, period, phase,
                             distractors, friction, mass)


def realism_on(cell) -> dict[str, bool]:
    """Which per-episode / per-frame options of ``cell`` are on (the static ones change the scene only)."""
    lk, pd = cell.look, cell.physics_drift
    ld, ex, cm = lk.light_drift, lk.exposure, lk.camera_motion
    return {
        "lights": any((ld.intensity, ld.color, ld.direction_deg, ld.position_m)),
        "exposure": ex.gain != [1.0, 1.0] or ex.white_balance > 0 or ex.auto > 0,
        "camera": any(cm.offset_px) or cm.jitter_px > 0 or cm.drift_px > 0,
        "blur": lk.motion_blur.exposure > 0,
        "distractors": any(d.probability > 0 for d in lk.distractors),
        "physics": pd.friction != [1.0, 1.0] or pd.mass != [1.0, 1.0],
    }


class ConditionsApplier:
    """Applies an episode's conditions to a compiled lab model, from the cell's nominal values."""

    def __init__(self, model: mujoco.MjModel, cell, render_camera: str, render_K, render_size,
                 object_names: list[str]):
        from comsim.sim.scene import OBJECT_PREFIX

        m = self.model = model
        self.cell = cell
        self.light_diffuse = m.light_diffuse.copy()
        self.light_ambient = m.light_ambient.copy()
        self.light_dir = m.light_dir.copy()
        self.light_pos = m.light_pos.copy()
        self.cam_id = m.camera(render_camera).id
        self.cam_pos, self.cam_quat = m.cam_pos[self.cam_id].copy(), m.cam_quat[self.cam_id].copy()
        self.render_K, self.render_size = render_K, render_size
        cam = cell.scene.camera(cell.camera)
        self.T_cam_from_base = np.asarray(cam.T_cam_from_base, np.float64)
        self.K = cam.K
        self.T_world_from_base = np.eye(4)
        self.T_world_from_base[:3, 3] = cell.scene.robot.base_pos
        self.geoms = [m.geom(OBJECT_PREFIX + n).id for n in object_names]
        self.bodies = [m.body(OBJECT_PREFIX + n).id for n in object_names]
        self.friction = m.geom_friction[self.geoms, 0].copy()
        self.mass, self.inertia = m.body_mass[self.bodies].copy(), m.body_inertia[self.bodies].copy()
        self.mocap = [m.body_mocapid[m.body(f"{DISTRACTOR_PREFIX}{i}").id] for i in range(len(cell.look.distractors))]
        self.distractor_geoms = [m.geom(f"{DISTRACTOR_PREFIX}{i}").id for i in range(len(cell.look.distractors))]

    def apply(self, c: EpisodeConditions | None) -> None:
        """The episode's lights, physics and distractor colours (None: the cell's nominal values)."""
        from scipy.spatial.transform import Rotation

        m = self.model
        m.light_diffuse[:] = self.light_diffuse
        m.light_ambient[:] = self.light_ambient
        m.light_dir[:] = self.light_dir
        m.light_pos[:] = self.light_pos
        m.geom_friction[self.geoms, 0] = self.friction
        m.body_mass[self.bodies] = self.mass
        m.body_inertia[self.bodies] = self.inertia
        self.set_camera(None)
        if c is None:
            return
        m.light_diffuse[:] = np.clip(self.light_diffuse * c.light_factor, 0, 1)
        m.light_ambient[:] = np.clip(self.light_ambient * c.light_factor, 0, 1)
        for i in range(m.nlight):
            d = Rotation.from_rotvec(c.light_tilt[i]).apply(self.light_dir[i])
            m.light_dir[i] = d / np.linalg.norm(d)
        m.light_pos[:] = self.light_pos + c.light_shift
        m.geom_friction[self.geoms, 0] = self.friction * c.friction
        m.body_mass[self.bodies] = self.mass * c.mass
        m.body_inertia[self.bodies] = self.inertia * c.mass[:, None]
        for g, d in zip(self.distractor_geoms, c.distractors):
            if d is not None:
                m.geom_rgba[g] = d["rgba"]

    def camera_T(self, shift_px) -> np.ndarray:
        """The true T_cam_from_base with the image shifted by ``shift_px``."""
        return shifted_camera(self.T_cam_from_base, self.K, shift_px)

    def set_camera(self, shift_px) -> None:
        """Move the render camera to shift the image by ``shift_px`` (None: its calibrated pose); call
        ``mj_camlight`` before rendering."""
        self.place_camera(None if shift_px is None else self.camera_T(shift_px))

    def place_camera(self, T_cam_from_base) -> None:
        """Put the render camera at ``T_cam_from_base`` (None: its calibrated pose)."""
        m = self.model
        if T_cam_from_base is None:
            m.cam_pos[self.cam_id], m.cam_quat[self.cam_id] = self.cam_pos, self.cam_quat
            return
        w, h = self.render_size
        p = opencv_to_mujoco(self.render_K, T_cam_from_base, w, h, self.T_world_from_base)
        m.cam_pos[self.cam_id], m.cam_quat[self.cam_id] = p.pos, p.quat

    def place_distractors(self, data: mujoco.MjData, c: EpisodeConditions | None, t: float) -> None:
        for i, mid in enumerate(self.mocap):
            data.mocap_pos[mid] = PARKED if c is None else c.distractor_pos(i, t)


class AutoExposure:
    """The camera's gain over an episode: the episode's gain, steered toward a target brightness."""

    def __init__(self, look: ExposureLook, gain: float):
        self.look, self.base, self.gain = look, float(gain), None

    def __call__(self, clean: np.ndarray) -> float:
        lk = self.look
        if lk.auto <= 0:
            return self.base
        want = np.log(self.base) + lk.auto * np.log(lk.target / max(float(clean.mean()), 1.0))
        self.gain = want if self.gain is None else self.gain + lk.speed * (want - self.gain)
        return float(np.exp(self.gain))
