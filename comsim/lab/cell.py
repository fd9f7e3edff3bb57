"""The lab cell: the TRUE scene, how it looks, how its operator behaves, and its tasks.

One YAML (``configs/lab/default.yaml``) holds everything the lab knows and the twin does
not: the true camera pose and object colours (``scene``, a SceneSpec), the look
(procedural textures, lights, robot tint, sensor), the teleoperator's habits and the task
settings. ``load_lab_cell`` reads it into a ``LabCell``; errors name the file and key.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from comsim.config import CONFIGS, ConfigError, apply_overrides, config_file, from_dict, load_yaml
from comsim.episode import hash_dict
from comsim.lab.effects import SensorLook
from comsim.lab.realism import (CameraMotion, ClutterItem, DistractorLook, ExposureLook, LightDrift, MotionBlur,
                                PhysicsDrift, PrintLook, validate_realism)
from comsim.sim.spec import SceneSpec, validate_scene_spec

DEFAULT_CELL = CONFIGS / "lab" / "default.yaml"
TEXTURE_PATTERNS = ("wood", "wall", "concrete")


@dataclass
class TextureLook:
    pattern: str  # wood | wall | concrete (numpy generators in look.py)
    rgb1: list[float]  # dark / base colour
    rgb2: list[float]  # light / accent colour
    size: int = 256  # texture pixels per side
    repeat: list[float] = field(default_factory=lambda: [1.0, 1.0])
    scale: float = 1.0  # pattern frequency multiplier
    seed: int = 0
    specular: float = 0.2
    shininess: float = 0.2


@dataclass
class LightLook:
    pos: list[float]
    dir: list[float]
    diffuse: list[float] = field(default_factory=lambda: [0.6, 0.6, 0.6])
    ambient: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    specular: list[float] = field(default_factory=lambda: [0.2, 0.2, 0.2])
    castshadow: bool = True
    cutoff: float = 45.0  # spot half-angle (deg); a narrow cone spends the shadow map on the workspace
    exponent: float = 2.0
    directional: bool = False


@dataclass
class LabLook:
    table: TextureLook
    backdrop: TextureLook
    floor: TextureLook
    lights: list[LightLook]
    robot_tint: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])  # multiplies robot materials
    object_specular: float = 0.3
    render_margin: int = 8  # px rendered around the image so lens distortion has real content to pull in
    sensor: SensorLook = field(default_factory=SensorLook)
    # What the twin cannot model (comsim/lab/realism.py), all off by default:
    prints: dict[str, PrintLook] = field(default_factory=dict)  # object name -> print on its faces
    clutter: list[ClutterItem] = field(default_factory=list)
    distractors: list[DistractorLook] = field(default_factory=list)
    light_drift: LightDrift = field(default_factory=LightDrift)
    exposure: ExposureLook = field(default_factory=ExposureLook)
    camera_motion: CameraMotion = field(default_factory=CameraMotion)
    motion_blur: MotionBlur = field(default_factory=MotionBlur)


@dataclass
class Region:
    """Uniform ranges for an object's initial pose on the table."""
    x: list[float]
    y: list[float]
    yaw: list[float] = field(default_factory=lambda: [-math.pi, math.pi])


@dataclass
class PushTaskCell:
    cube: str = "red_cube"
    target: list[float] = field(default_factory=lambda: [0.5, 0.1])  # x, y of the target centre
    target_radius: float = 0.04  # success: cube centre within this distance of the target centre
    target_rgba: list[float] = field(default_factory=lambda: [0.15, 0.7, 0.25, 1.0])
    regions: dict[str, Region] = field(default_factory=dict)  # initial poses per object
    min_start_distance: float = 0.1  # cube centre to target centre, at the start
    min_separation: float = 0.1  # between object centres, at the start
    max_seconds: float = 14.0  # closed-loop time limit
    instruction: str = "Push the red cube onto the green target."


@dataclass
class StackTaskCell:
    top: str = "red_cube"
    base: str = "blue_cube"
    regions: dict[str, Region] = field(default_factory=dict)
    min_separation: float = 0.12
    max_seconds: float = 14.0
    instruction: str = "Stack the red cube on the blue cube."


@dataclass
class LabTasks:
    push: PushTaskCell = field(default_factory=PushTaskCell)
    stack: StackTaskCell = field(default_factory=StackTaskCell)


@dataclass
class OperatorHabits:
    """How the scripted teleoperator varies from one demonstration to the next."""
    speed: list[float] = field(default_factory=lambda: [0.8, 1.3])  # factor on the nominal speed
    nominal_speed: float = 0.3  # m/s for free-space moves
    path_noise_mm: list[float] = field(default_factory=lambda: [1.5, 4.0])  # low-frequency hand tremor
    path_noise_hz: list[float] = field(default_factory=lambda: [0.2, 0.9])
    aim_error_m: list[float] = field(default_factory=lambda: [0.004, 0.015])  # first guess, then corrected
    overshoot_prob: float = 0.35  # chance per episode of overshooting a transport move, then correcting
    overshoot_m: list[float] = field(default_factory=lambda: [0.01, 0.025])
    pause_s: list[float] = field(default_factory=lambda: [0.0, 0.3])  # hesitations between moves
    push_lead_m: list[float] = field(default_factory=lambda: [0.012, 0.02])  # how hard the pusher leads the cube
    push_stop_m: list[float] = field(default_factory=lambda: [0.004, 0.015])  # "close enough" to the target


@dataclass
class LabCell:
    scene: SceneSpec  # the TRUE scene: the twin's YAML holds only nominal guesses of it
    look: LabLook
    tasks: LabTasks = field(default_factory=LabTasks)
    operator: OperatorHabits = field(default_factory=OperatorHabits)
    camera: str = "front"
    fps: int = 10
    physics_drift: PhysicsDrift = field(default_factory=PhysicsDrift)  # per-episode object friction and mass

    def to_dict(self) -> dict:
        """The cell as plain data, without the realism options left at their defaults (off): the hash
        (and the recordings' provenance and truth) of a cell that uses none of them depends on its
        other settings alone."""
        d = dataclasses.asdict(self)
        for key, value in _REALISM_DEFAULTS["look"].items():
            if d["look"][key] == value:
                del d["look"][key]
        if d["physics_drift"] == _REALISM_DEFAULTS["physics_drift"]:
            del d["physics_drift"]
        return d

    def hash(self) -> str:
        return hash_dict(self.to_dict())


_REALISM_DEFAULTS = {
    "look": {"prints": {}, "clutter": [], "distractors": [], "light_drift": dataclasses.asdict(LightDrift()),
             "exposure": dataclasses.asdict(ExposureLook()), "camera_motion": dataclasses.asdict(CameraMotion()),
             "motion_blur": dataclasses.asdict(MotionBlur())},
    "physics_drift": dataclasses.asdict(PhysicsDrift()),
}


def load_lab_cell(path: str | Path | None = None, overrides: list[str] | None = None) -> LabCell:
    """Read a lab cell YAML (default: the built-in lab); ConfigError names the file and key."""
    path = config_file(path) if path is not None else DEFAULT_CELL  # a user's file, else a built-in one
    data = load_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        cell = from_dict(LabCell, data)
        validate_lab_cell(cell)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cell


def validate_lab_cell(cell: LabCell) -> None:
    try:
        validate_scene_spec(cell.scene, "scene")
    except ConfigError as e:  # "scene: objects[0].size: ..." -> "scene.objects[0].size: ..."
        raise ConfigError(str(e).replace("scene: ", "scene.", 1)) from None
    try:
        cam = cell.scene.camera(cell.camera)
    except KeyError as e:
        raise ConfigError(f"camera: {e.args[0]}") from None
    if cam.width % 2 or cam.height % 2:
        raise ConfigError(f"scene.cameras: {cam.name} is {cam.width}x{cam.height}; video needs even sizes")
    if not 1 <= cell.fps <= 50:
        raise ConfigError(f"fps: expected 1..50, got {cell.fps}")
    names = {o.name for o in cell.scene.objects}
    lk = cell.look
    for key in ("table", "backdrop", "floor"):
        t = getattr(lk, key)
        if t.pattern not in TEXTURE_PATTERNS:
            raise ConfigError(f"look.{key}.pattern: expected one of {TEXTURE_PATTERNS}, got {t.pattern!r}")
        for c in ("rgb1", "rgb2"):
            _rgb(f"look.{key}.{c}", getattr(t, c))
        if not 8 <= t.size <= 2048:
            raise ConfigError(f"look.{key}.size: expected 8..2048 pixels, got {t.size}")
    _rgb("look.robot_tint", lk.robot_tint)
    if not lk.lights:
        raise ConfigError("look.lights: the lab needs at least one light")
    for i, light in enumerate(lk.lights):
        for k in ("pos", "dir", "diffuse", "ambient", "specular"):
            if len(getattr(light, k)) != 3:
                raise ConfigError(f"look.lights[{i}].{k}: expected 3 numbers, got {getattr(light, k)}")
    if lk.render_margin < 0:
        raise ConfigError(f"look.render_margin: expected >= 0 pixels, got {lk.render_margin}")
    s = lk.sensor
    if len(s.white_balance) != 3 or not 1 <= s.jpeg_quality <= 100:
        raise ConfigError("look.sensor: white_balance needs 3 gains and jpeg_quality 1..100")

    validate_realism(lk, cell.physics_drift, names)

    push, stack = cell.tasks.push, cell.tasks.stack
    for key, name in (("tasks.push.cube", push.cube), ("tasks.stack.top", stack.top),
                      ("tasks.stack.base", stack.base)):
        if name not in names:
            raise ConfigError(f"{key}: no object {name!r} in scene.objects {sorted(names)}")
    if len(push.target) != 2 or push.target_radius <= 0:
        raise ConfigError(f"tasks.push.target: expected [x, y] and a positive target_radius, "
                          f"got {push.target}, {push.target_radius}")
    t = cell.scene.table  # objects start on the table top, never beside it on the floor
    table = {"x": (t.center[0] - t.size[0] / 2, t.center[0] + t.size[0] / 2),
             "y": (t.center[1] - t.size[1] / 2, t.center[1] + t.size[1] / 2)}
    if not all(table[a][0] <= v <= table[a][1] for a, v in zip("xy", push.target)):
        raise ConfigError(f"tasks.push.target: expected a point on the table (x in {list(table['x'])}, "
                          f"y in {list(table['y'])}), got {push.target}")
    for task in ("push", "stack"):
        for obj, region in getattr(cell.tasks, task).regions.items():
            key = f"tasks.{task}.regions.{obj}"
            if obj not in names:
                raise ConfigError(f"{key}: no object {obj!r} in scene.objects {sorted(names)}")
            for axis in ("x", "y", "yaw"):
                lo_hi = getattr(region, axis)
                if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
                    raise ConfigError(f"{key}.{axis}: expected [low, high], got {lo_hi}")
                if axis in table and not table[axis][0] <= lo_hi[0] <= lo_hi[1] <= table[axis][1]:
                    raise ConfigError(f"{key}.{axis}: expected a range on the table, inside "
                                      f"{[round(v, 4) for v in table[axis]]}, got {lo_hi}")
    for f in dataclasses.fields(OperatorHabits):
        v = getattr(cell.operator, f.name)
        if isinstance(v, list) and (len(v) != 2 or v[0] > v[1]):
            raise ConfigError(f"operator.{f.name}: expected [low, high], got {v}")


def _rgb(key: str, v: list[float]) -> None:
    if len(v) != 3 or min(v) < 0 or max(v) > 1:
        raise ConfigError(f"{key}: expected 3 values in [0, 1], got {v}")
