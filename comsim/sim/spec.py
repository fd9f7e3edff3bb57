"""Scene specs: a robot cell described in YAML, checked before anything compiles.

All positions are in the world frame, which is the robot base frame (CONTRACTS.md):
``panda_link0`` at the origin, z up, table top at z = 0. Cameras follow OpenCV
(``K`` at ``width`` x ``height``, ``T_cam_from_base`` maps base points into the camera).

``load_scene_spec`` reads a file; ``scene_spec_from_dict`` builds one in code. Both run
``validate_scene_spec``, whose errors name the key (``cameras[0].T_cam_from_base: ...``).
A file may start from another one (``base: panda_cell.yaml``, relative to the file) and
change some keys: mappings merge key by key, lists and values replace. A relative
``robot.mjcf`` is read from the folder of the file that names it.
"""
from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comsim.config import ConfigError, apply_overrides, from_dict, load_yaml
from comsim.episode import hash_dict
from comsim.errors import InputError
from comsim.io.paths import safe_name
from comsim.sim.camera import as_K, as_rigid  # camera.py owns the camera maths

PANDA_HOME = [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
BUILTIN_ROBOTS = ("panda",)
MAX_CAMERA_PX = 8192  # a side of a rendered image: OpenGL offscreen framebuffers stop at 8-16k


@dataclass
class RobotSpec:
    name: str = "panda"  # built-in model (dm-robotics-panda arm + hand)
    mjcf: str | None = None  # or: a Panda-like MJCF (7 hinge joints + 2 finger slide joints)
    menagerie: str | None = None  # or: a robot folder under $MENAGERIE_ROOT, e.g. franka_emika_panda
    base_pos: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    visual: str = "light"  # light: decimated meshes (fast); full: original meshes
    light_tolerance: float = 0.002  # metres of surface error allowed in `light` meshes
    init_qpos: list[float] = field(default_factory=lambda: list(PANDA_HOME))
    init_gripper: float = 1.0  # gripper command, 1 = open
    arm_kp: list[float] = field(default_factory=lambda: [4500.0] * 4 + [2000.0] * 3)
    arm_kv: list[float] = field(default_factory=lambda: [450.0] * 4 + [200.0] * 3)
    arm_torque_limit: list[float] = field(default_factory=lambda: [87.0] * 4 + [12.0] * 3)
    gripper_force: float = 70.0  # N, total squeeze (Franka Hand: 70 N continuous)
    finger_friction: float = 1.5
    # per-channel multiplier (r, g, b) of the robot's materials, e.g. the twin's colour alignment
    # (the real arm's plastic is cream, not the model's white); None: the model's own colours
    tint: list[float] | None = None


@dataclass
class TableSpec:
    size: list[float] = field(default_factory=lambda: [1.2, 0.8])  # x, y extent (m)
    center: list[float] = field(default_factory=lambda: [0.4, 0.0])  # x, y of the centre
    height: float = 0.75  # top at z = 0, floor at z = -height
    rgba: list[float] = field(default_factory=lambda: [0.55, 0.45, 0.35, 1.0])
    friction: float = 0.6


@dataclass
class BackdropSpec:
    floor_rgba: list[float] = field(default_factory=lambda: [0.35, 0.35, 0.35, 1.0])
    wall_rgba: list[float] = field(default_factory=lambda: [0.8, 0.8, 0.8, 1.0])
    wall_x: float = -0.6  # a vertical wall behind the robot (x = wall_x), facing +x
    wall_height: float = 2.0  # above the floor


@dataclass
class ObjectSpec:
    name: str
    shape: str = "box"  # box | cylinder
    size: list[float] = field(default_factory=lambda: [0.05, 0.05, 0.05])  # box: full x,y,z; cylinder: radius, height
    rgba: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1, 1.0])
    mass: float = 0.1
    friction: float = 0.6  # MuJoCo uses the larger of two geoms' frictions (the finger pads win by priority)
    pos: list[float] = field(default_factory=lambda: [0.5, 0.0])  # [x, y] (resting on the table) or [x, y, z]
    yaw: float = 0.0

    @property
    def half_height(self) -> float:
        return self.size[2] / 2 if self.shape == "box" else self.size[1] / 2


@dataclass
class MarkerSpec:
    """A flat disc on the table with no collision (a target sticker); label 0 (background) in segmentation.

    Drawn as written, not colour-matched: the factory's targets that name it (``color: scene:NAME``)
    take the same rgba, so the translator sees one look for the disc in its pairs and in the factory's
    episodes."""
    name: str
    pos: list[float]  # [x, y] of the centre on the table
    radius: float = 0.04
    rgba: list[float] = field(default_factory=lambda: [0.15, 0.62, 0.28, 1.0])


@dataclass
class CameraSpec:
    name: str
    width: int
    height: int
    K: Any  # [fx, fy, cx, cy] or 3x3, in pixels at width x height
    T_cam_from_base: Any  # 4x4 rigid transform, OpenCV camera (x right, y down, z forward)


@dataclass
class LightSpec:
    pos: list[float] = field(default_factory=lambda: [0.4, 0.0, 1.5])
    dir: list[float] = field(default_factory=lambda: [0.0, 0.0, -1.0])
    diffuse: list[float] = field(default_factory=lambda: [0.7, 0.7, 0.7])
    ambient: list[float] = field(default_factory=lambda: [0.1, 0.1, 0.1])
    specular: list[float] = field(default_factory=lambda: [0.2, 0.2, 0.2])
    castshadow: bool = False
    directional: bool = False


@dataclass
class RenderSpec:
    shadows: bool = False  # master switch for lights[].castshadow; shadows cost ~10x at 128x128
    offsamples: int = 0  # multisampling off: faster, and segmentation stays exact
    shadowsize: int = 1024
    headlight_ambient: list[float] = field(default_factory=lambda: [0.3, 0.3, 0.3])
    headlight_diffuse: list[float] = field(default_factory=lambda: [0.3, 0.3, 0.3])


@dataclass
class PhysicsSpec:
    timestep: float = 0.002
    integrator: str = "implicitfast"  # Euler diverges with stiff position servos
    substeps: int = 10  # physics steps per control step (control_dt = timestep * substeps)
    impratio: float = 10.0  # stiffer friction than normal force: grasps do not creep
    cone: str = "elliptic"  # with pyramidal cones a carried cube falls out of the fingers
    noslip_iterations: int = 0


@dataclass
class SceneSpec:
    robot: RobotSpec = field(default_factory=RobotSpec)
    table: TableSpec = field(default_factory=TableSpec)
    backdrop: BackdropSpec = field(default_factory=BackdropSpec)
    objects: list[ObjectSpec] = field(default_factory=list)
    markers: list[MarkerSpec] = field(default_factory=list)
    cameras: list[CameraSpec] = field(default_factory=list)
    lights: list[LightSpec] = field(default_factory=lambda: [LightSpec()])
    render: RenderSpec = field(default_factory=RenderSpec)
    physics: PhysicsSpec = field(default_factory=PhysicsSpec)

    def camera(self, name: str) -> CameraSpec:
        for cam in self.cameras:
            if cam.name == name:
                return cam
        raise KeyError(f"no camera {name!r}; the spec has {[c.name for c in self.cameras]}")


# ---------------------------------------------------------------- loading


def load_scene_spec(path: str | Path, overrides: list[str] | None = None) -> SceneSpec:
    """Read a scene YAML; relative file paths in it are taken from the YAML's folder."""
    path = Path(path)
    data = _load_with_base(path, [])
    if overrides:
        data = apply_overrides(data, overrides)
    return scene_spec_from_dict(data, where=str(path), base_dir=path.parent)


def _load_with_base(path: Path, chain: list[Path]) -> dict:
    data = load_yaml(path)
    if "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base: expected the path of another scene YAML, got {base!r}")
    base_path = (path.parent / os.path.expanduser(base)).resolve()
    if base_path in chain or base_path == path.resolve():
        raise ConfigError(f"{path}: base: {base} leads back to itself "
                          f"({' -> '.join(str(p) for p in [*chain, base_path])})")
    if not base_path.is_file():
        raise ConfigError(f"{path}: base: {base_path} not found")
    parent = _load_with_base(base_path, [*chain, path.resolve()])
    robot = parent.get("robot")
    mjcf = robot.get("mjcf") if isinstance(robot, dict) else None
    if isinstance(mjcf, str) and mjcf and not os.path.isabs(os.path.expanduser(mjcf)):
        # a path written in the base file is relative to the base file, wherever the child lives
        parent["robot"] = {**robot, "mjcf": str(base_path.parent / mjcf)}
    return _merged(parent, data)


def _merged(base: dict, changes: dict) -> dict:
    out = dict(base)
    for k, v in changes.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def scene_spec_from_dict(data: dict, where: str = "scene", base_dir: str | Path | None = None,
                         ) -> SceneSpec:
    try:
        spec = from_dict(SceneSpec, data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if base_dir is not None and spec.robot.mjcf and not os.path.isabs(os.path.expanduser(spec.robot.mjcf)):
        spec.robot.mjcf = str(Path(base_dir) / spec.robot.mjcf)
    validate_scene_spec(spec, where)
    return spec


def spec_hash(spec: SceneSpec) -> str:
    """Short stable hash of the spec (goes into episode provenance)."""
    d = dataclasses.asdict(spec)
    if d["robot"]["tint"] is None:  # an untinted robot adds nothing: untinted specs hash as they always have
        del d["robot"]["tint"]
    if not d["markers"]:  # likewise a cell without markers
        del d["markers"]
    return hash_dict(d)


# ---------------------------------------------------------------- validation


def validate_scene_spec(spec: SceneSpec, where: str = "scene") -> None:
    """Raise ConfigError naming ``where`` and the key for anything that cannot work."""

    def fail(key: str, msg: str):
        raise ConfigError(f"{where}: {key}: {msg}")

    r = spec.robot
    sources = [k for k, v in (("mjcf", r.mjcf), ("menagerie", r.menagerie)) if v]
    if len(sources) > 1:
        fail("robot", f"give at most one of mjcf / menagerie, got {sources}")
    if not sources and r.name not in BUILTIN_ROBOTS:
        fail("robot.name", f"unknown built-in robot {r.name!r}; expected one of {BUILTIN_ROBOTS}, "
             "or give robot.mjcf / robot.menagerie")
    try:
        robot_mjcf_path(r)  # its errors start with the key
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    _check_len(fail, "robot.base_pos", r.base_pos, 3)
    if r.tint is not None:
        _check_len(fail, "robot.tint", r.tint, 3)
        if not all(0.0 <= float(v) <= 4.0 for v in r.tint):
            fail("robot.tint", f"expected 3 multipliers in [0, 4] (r, g, b), got {r.tint}")
    _check_len(fail, "robot.init_qpos", r.init_qpos, 7)
    for key in ("arm_kp", "arm_kv", "arm_torque_limit"):
        _check_len(fail, f"robot.{key}", getattr(r, key), 7)
        if min(getattr(r, key)) <= 0:
            fail(f"robot.{key}", f"expected positive values, got {getattr(r, key)}")
    if r.visual not in ("light", "full"):
        fail("robot.visual", f"expected 'light' or 'full', got {r.visual!r}")
    if not 0 < r.light_tolerance < 0.02:
        fail("robot.light_tolerance", f"expected metres in (0, 0.02), got {r.light_tolerance}")
    if not 0.0 <= r.init_gripper <= 1.0:
        fail("robot.init_gripper", f"expected a command in [0, 1], got {r.init_gripper}")

    t = spec.table
    _check_len(fail, "table.size", t.size, 2)
    _check_len(fail, "table.center", t.center, 2)
    _check_rgba(fail, "table.rgba", t.rgba)
    if min(t.size) <= 0 or t.height <= 0:
        fail("table", f"size and height must be positive, got size={t.size} height={t.height}")
    _check_rgba(fail, "backdrop.floor_rgba", spec.backdrop.floor_rgba)
    _check_rgba(fail, "backdrop.wall_rgba", spec.backdrop.wall_rgba)

    for key, o in _named(fail, "objects", spec.objects):
        if o.shape not in ("box", "cylinder"):
            fail(f"{key}.shape", f"expected 'box' or 'cylinder', got {o.shape!r}")
        _check_len(fail, f"{key}.size", o.size, 3 if o.shape == "box" else 2)
        if min(o.size) <= 0 or o.mass <= 0:
            fail(key, f"size and mass must be positive, got size={o.size} mass={o.mass}")
        _check_rgba(fail, f"{key}.rgba", o.rgba)
        if len(o.pos) not in (2, 3):
            fail(f"{key}.pos", f"expected [x, y] or [x, y, z], got {o.pos}")

    for key, m in _named(fail, "markers", spec.markers):
        _check_len(fail, f"{key}.pos", m.pos, 2)
        if not 0 < m.radius <= 0.5:
            fail(f"{key}.radius", f"expected metres in (0, 0.5], got {m.radius}")
        _check_rgba(fail, f"{key}.rgba", m.rgba)

    for key, c in _named(fail, "cameras", spec.cameras):
        try:  # camera names become video feature keys, i.e. folder and file names
            safe_name(c.name, None, "")
        except InputError as e:
            fail(f"{key}.name", f"expected {e.expected}, got {c.name!r}")
        if c.width <= 0 or c.height <= 0:
            fail(key, f"width and height must be positive, got {c.width}x{c.height}")
        if max(c.width, c.height) > MAX_CAMERA_PX:  # beyond what an offscreen OpenGL framebuffer holds
            fail(key, f"width and height must be at most {MAX_CAMERA_PX} pixels, got {c.width}x{c.height}")
        try:
            as_K(c.K)
        except ValueError as e:
            fail(f"{key}.K", str(e))
        try:
            as_rigid(c.T_cam_from_base)
        except ValueError as e:
            fail(f"{key}.T_cam_from_base", str(e))

    for i, light in enumerate(spec.lights):
        for k in ("pos", "dir", "diffuse", "ambient", "specular"):
            _check_len(fail, f"lights[{i}].{k}", getattr(light, k), 3)
    p = spec.physics
    if p.integrator not in ("implicitfast", "implicit", "RK4", "Euler"):
        fail("physics.integrator", f"expected implicitfast | implicit | RK4 | Euler, got {p.integrator!r}")
    if p.cone not in ("elliptic", "pyramidal"):
        fail("physics.cone", f"expected elliptic or pyramidal, got {p.cone!r}")
    if p.timestep <= 0 or p.substeps < 1:
        fail("physics", f"timestep must be > 0 and substeps >= 1, got {p.timestep}, {p.substeps}")


def _named(fail, section: str, items: list):
    """(key, item) of each entry of a list section, after checking that no name comes twice."""
    seen = set()
    for i, item in enumerate(items):
        key = f"{section}[{i}]"
        if item.name in seen:
            fail(f"{key}.name", f"duplicate {section[:-1]} name {item.name!r}")
        seen.add(item.name)
        yield key, item


def _check_len(fail, key: str, values: list, n: int) -> None:
    if len(values) != n:
        fail(key, f"expected {n} numbers, got {len(values)}: {values}")


def _check_rgba(fail, key: str, rgba: list) -> None:
    _check_len(fail, key, rgba, 4)
    if min(rgba) < 0 or max(rgba) > 1:
        fail(key, f"expected values in [0, 1], got {rgba}")


# ---------------------------------------------------------------- robot files


def panda_assets_dir() -> Path:
    try:
        import dm_robotics.panda as panda_pkg
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ConfigError("robot.name: the built-in panda needs `pip install --no-deps dm-robotics-panda`") from e
    return Path(panda_pkg.__file__).parent / "assets" / "panda"


def robot_mjcf_path(robot: RobotSpec) -> Path:
    """The robot's main MJCF file, checked to exist with every mesh it names.

    Raises ConfigError("robot.<key>: ...") naming the missing file.
    """
    if robot.mjcf:
        key, path = "robot.mjcf", Path(os.path.expanduser(robot.mjcf))
    elif robot.menagerie:
        key = "robot.menagerie"
        root = os.environ.get("MENAGERIE_ROOT")
        if not root:
            raise ConfigError(f"{key}: {robot.menagerie!r} needs the environment variable MENAGERIE_ROOT "
                              "(a local clone of github.com/google-deepmind/mujoco_menagerie)")
        folder = Path(root) / robot.menagerie
        candidates = [folder / "panda.xml", folder / f"{robot.menagerie}.xml"] + sorted(folder.glob("*.xml"))
        candidates = [c for c in candidates if c.is_file() and c.name != "scene.xml"]
        if not candidates:
            raise ConfigError(f"{key}: no robot MJCF in {folder} (MENAGERIE_ROOT={root})")
        path = candidates[0]
    else:
        key, path = "robot.name", panda_assets_dir() / "panda.xml"
    if not path.is_file():
        raise ConfigError(f"{key}: MJCF file {path} not found")
    for f in referenced_asset_files(path):
        if not f.is_file():
            raise ConfigError(f"{key}: asset file {f} (referenced by {path.name}) not found")
    if key == "robot.name":
        hand = panda_assets_dir() / "panda_hand.xml"
        for f in [hand, *referenced_asset_files(hand)]:
            if not f.is_file():
                raise ConfigError(f"{key}: asset file {f} not found")
    return path


def referenced_asset_files(mjcf_path: Path) -> list[Path]:
    """Mesh and texture files that an MJCF names, resolved like MuJoCo does."""
    root = ET.parse(mjcf_path).getroot()
    base = mjcf_path.parent
    compiler = root.find("compiler")
    meshdir = texturedir = assetdir = ""
    if compiler is not None:
        assetdir = compiler.get("assetdir", "")
        meshdir = compiler.get("meshdir", assetdir)
        texturedir = compiler.get("texturedir", assetdir)
    files = []
    for tag, folder in (("mesh", meshdir), ("texture", texturedir), ("hfield", assetdir)):
        for el in root.iter(tag):
            f = el.get("file")
            if f:
                p = Path(f)
                files.append(p if p.is_absolute() else base / folder / p)
    for el in root.iter("include"):
        inc = base / el.get("file", "")
        files.append(inc)
        if inc.is_file():
            files.extend(referenced_asset_files(inc))
    return files
