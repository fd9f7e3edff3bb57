"""Task programs: a task written in YAML (objects, targets, layout, steps, success), checked line by line.

A task file (see ``configs/tasks/*.yaml``) says what is on the table and how it varies,
then lists primitives to run and predicates that judge the final state:

    task: stack
    instruction: "Stack the {top.color} cube on the {base.color} cube."
    objects:
      top:  {shape: cube, side: [0.045, 0.055], colors: [red, orange]}
      base: {shape: cube, side: 0.055, colors: [blue, green]}
    layout:
      in_distribution:
        top:  {x: [0.42, 0.58], y: [-0.20, -0.06]}
        base: {x: [0.42, 0.58], y: [0.06, 0.20]}
    program:
      - grasp: {object: top}
      - lift: {height: [0.10, 0.14]}
      - stack: {on: base}
      - release: {}
    success:
      - stacked: {top: top, base: base}
      - released: {object: top}

Everything that can be checked without simulating is checked at load time, and every
error names the file and line: an unknown primitive, object or key, a parameter out of
range, a literal target outside the workspace, a place/stack with nothing in the hand.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from comsim.config import CONFIGS, PANDA_CELL, ConfigError
from comsim.episode import hash_dict
from comsim.factory.params import Ref, parse_params, parse_range
from comsim.factory.yaml_lines import LineDict, LineList, load_with_lines
from comsim.sim.spec import SceneSpec, load_scene_spec, spec_hash

DEFAULT_SCENE = PANDA_CELL
TASKS_DIR = CONFIGS / "tasks"

# Named colours (linear RGB, alpha 1) a task may use instead of numbers.
COLORS = {
    "red": (0.85, 0.12, 0.10), "orange": (0.95, 0.50, 0.10), "yellow": (0.92, 0.82, 0.15),
    "green": (0.15, 0.65, 0.25), "cyan": (0.10, 0.70, 0.80), "blue": (0.10, 0.25, 0.85),
    "purple": (0.50, 0.20, 0.70), "pink": (0.95, 0.45, 0.65), "white": (0.92, 0.92, 0.90),
    "black": (0.08, 0.08, 0.08), "grey": (0.50, 0.50, 0.50), "brown": (0.45, 0.28, 0.15),
}
SCENE_COLOR = "scene:"  # `color: scene:red_cube`: the rgba of the scene's object (or marker) red_cube
SHAPES = ("cube", "box", "cylinder")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FULL_TURN = (-math.pi, math.pi)


class ProgramError(ConfigError):
    """A task program that cannot work; the message starts with ``file:line:``."""


@dataclass
class Region:
    x: tuple[float, float]
    y: tuple[float, float]
    yaw: tuple[float, float] = FULL_TURN
    line: int = 0

    def contains(self, x: float, y: float) -> bool:
        return self.x[0] <= x <= self.x[1] and self.y[0] <= y <= self.y[1]


@dataclass
class ObjectRole:
    """A task object and how its instances vary (size ranges, colour choices, mass)."""
    name: str
    shape: str  # cube | box | cylinder
    size: list[tuple[float, float]]  # cube: [side]; box: [x, y, z]; cylinder: [radius, height]
    colors: list[tuple[str, tuple[float, ...]]]  # (name, rgba)
    mass: tuple[float, float] = (0.1, 0.1)
    line: int = 0


@dataclass
class TargetDef:
    """A spot on the table (drawn as a flat disc, no collision) that push/place can aim at."""
    name: str
    radius: float = 0.04
    color: tuple[str, tuple[float, ...]] = ("green", (*COLORS["green"], 1.0))
    line: int = 0


@dataclass
class Distractors:
    count: tuple[int, int] = (0, 0)
    shapes: list[str] = field(default_factory=lambda: ["cube"])
    size: tuple[float, float] = (0.03, 0.045)  # cube side / cylinder diameter and height
    colors: list[tuple[str, tuple[float, ...]]] = field(default_factory=list)
    region: Region | None = None
    mass: tuple[float, float] = (0.05, 0.05)
    line: int = 0


@dataclass
class Step:
    """One primitive call: its name, parsed parameters, and where it was written."""
    primitive: str
    params: dict
    line: int
    param_lines: dict


@dataclass
class Check:
    """One success predicate."""
    predicate: str
    params: dict
    line: int


@dataclass
class TaskProgram:
    name: str
    path: Path
    instruction: str
    scene: SceneSpec  # the twin cell: robot, table, camera, lights (its objects are replaced)
    scene_path: Path
    camera: str
    fps: int
    max_seconds: float
    speed: tuple[float, float]  # nominal TCP speed, m/s
    objects: dict[str, ObjectRole]
    targets: dict[str, TargetDef]
    distractors: Distractors
    layout: dict[str, dict[str, Region]]  # split ("id" | "ood") -> name -> region
    min_separation: float
    workspace: dict[str, tuple[float, float]]  # x, y, z ranges
    steps: list[Step]
    success: list[Check]
    source: str = ""  # the file's text

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def fail(self, line: int, msg: str):
        raise ProgramError(f"{self.where(line)}: {msg}")

    @property
    def hash(self) -> str:
        """Identity of the task: the program text and the twin cell it runs in."""
        return hash_dict({"program": self.source, "scene": spec_hash(self.scene)})

    def instruction_for(self, colors: dict[str, str]) -> str:
        return self.instruction.format(**{r: _Fmt(color=colors[r], shape=o.shape) for r, o in self.objects.items()})

    def in_workspace(self, p) -> bool:
        ws = self.workspace
        return all(ws[a][0] - 1e-9 <= v <= ws[a][1] + 1e-9 for a, v in zip("xyz", p))


@dataclass
class _Fmt:
    color: str
    shape: str


# ---------------------------------------------------------------- loading


def resolve_task_path(task: str | Path) -> Path:
    """A task file, or the name of one in configs/tasks/ (``stack`` -> configs/tasks/stack.yaml)."""
    p = Path(task)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    candidate = TASKS_DIR / f"{task}.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(f.stem for f in TASKS_DIR.glob("*.yaml")) if TASKS_DIR.is_dir() else []
    raise ProgramError(f"task {task!r}: no such file, and not a built-in task; built-in tasks: {known}")


def task_in_scene(task: str | Path, scene: str | Path, out: str | Path) -> Path:
    """Write to ``out`` a copy of ``task`` whose ``scene:`` is ``scene``: the same program in
    another cell, typically the aligned twin (``comsim twin replay`` writes PAIRED/twin_aligned.yaml)
    so that generated episodes look through the calibrated camera at the calibrated colours.
    Only the ``scene:`` line changes (or one is appended), so errors keep naming the task's lines."""
    from comsim.io.files import atomic_output

    src, scene = resolve_task_path(task), Path(scene).resolve()
    if not scene.is_file():
        raise ProgramError(f"scene {scene}: no such file (expected a twin scene YAML)")
    lines = src.read_text().splitlines()
    line = f"scene: {scene}  # was set by task_in_scene (source: {src.resolve()})"
    at = [i for i, text in enumerate(lines) if re.match(r"scene\s*:", text)]
    if at:
        lines[at[0]] = line
    else:
        lines.append(line)
    with atomic_output(out) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return Path(out)


def load_program(task: str | Path) -> TaskProgram:
    """Read and check a task program (a path, or a built-in task name)."""
    path = resolve_task_path(task)
    data = load_with_lines(path)
    return _Parser(path, data).parse()


TOP_KEYS = {"task", "instruction", "scene", "camera", "fps", "max_seconds", "speed", "objects", "targets",
            "distractors", "layout", "workspace", "program", "success"}


class _Parser:
    def __init__(self, path: Path, data: LineDict):
        self.path, self.data = path, data

    def fail(self, line: int, msg: str):
        raise ProgramError(f"{self.path}:{line}: {msg}")

    def keys(self, d, allowed: set, where: str, required: tuple = (), line: int | None = None) -> None:
        if not isinstance(d, dict):  # a scalar has no line of its own: the caller says where it is
            self.fail(line or getattr(d, "line", 1), f"{where}: expected a mapping, got {d!r}")
        for k in d:
            if k not in allowed:
                self.fail(d.line_of(k), f"{where}: unknown key {k!r}; known: {sorted(allowed)}")
        for k in required:
            if k not in d:
                self.fail(d.line, f"{where}: required key {k!r} is missing")

    def range(self, d: LineDict, key: str, default=None, bounds=None, where: str = ""):
        if key not in d:
            return default
        lo, hi = parse_range(d[key], d.line_of(key), f"{where}{key}", self.fail)
        if bounds and (lo < bounds[0] or hi > bounds[1]):
            self.fail(d.line_of(key), f"{where}{key}: {d[key]!r} is out of range; allowed [{bounds[0]}, {bounds[1]}]")
        return lo, hi

    def color(self, v, line: int, where: str) -> tuple[str, tuple[float, ...]]:
        if isinstance(v, str) and v.startswith(SCENE_COLOR):
            # the colour of one of the scene's own objects or markers: in an aligned twin, the colour the
            # twin estimated for the real object, so the episode's cube looks like the lab's; a marker's,
            # so the target disc looks like the one in the twin's replays
            name = v[len(SCENE_COLOR):]
            found = [o for o in [*self.scene.objects, *self.scene.markers] if o.name == name]
            if not found:
                self.fail(line, f"{where}: colour {v!r}: the scene {self.scene_file} has no object or marker "
                          f"{name!r}; its objects are {[o.name for o in self.scene.objects]}, its markers "
                          f"{[m.name for m in self.scene.markers]}")
            return name, tuple(float(x) for x in found[0].rgba)
        if isinstance(v, str):
            if v not in COLORS:
                self.fail(line, f"{where}: colour {v!r} unknown; known: {sorted(COLORS)}, [r, g, b] or "
                          f"{SCENE_COLOR}<object or marker of the scene>")
            return v, (*COLORS[v], 1.0)
        if isinstance(v, (list, tuple)) and len(v) in (3, 4) and all(isinstance(x, (int, float)) for x in v):
            if min(v) < 0 or max(v) > 1:
                self.fail(line, f"{where}: colour values must be in [0, 1], got {v}")
            rgba = tuple(float(x) for x in v) + ((1.0,) if len(v) == 3 else ())
            return "rgb(" + ",".join(f"{x:.2f}" for x in rgba[:3]) + ")", rgba
        self.fail(line, f"{where}: expected a colour name or [r, g, b], got {v!r}")

    def colors(self, d: LineDict, where: str, required: bool = True):
        if "color" in d and "colors" in d:
            self.fail(d.line_of("colors"), f"{where}: give either color or colors, not both")
        if "color" in d:
            return [self.color(d["color"], d.line_of("color"), f"{where}color")]
        if "colors" in d:
            vs = d["colors"]
            if not isinstance(vs, list) or not vs:
                self.fail(d.line_of("colors"), f"{where}colors: expected a non-empty list, got {vs!r}")
            return [self.color(v, vs.line_of(i) if isinstance(vs, LineList) else d.line_of("colors"),
                               f"{where}colors[{i}]") for i, v in enumerate(vs)]
        if required:
            self.fail(d.line, f"{where.rstrip('.')}: give color or colors")
        return []

    # ------------------------------------------------------------ sections

    def parse(self) -> TaskProgram:
        d = self.data
        self.keys(d, TOP_KEYS, "task file", required=("task", "objects", "layout", "program", "success"))
        name = d["task"]
        if not isinstance(name, str) or not NAME_RE.match(name):
            self.fail(d.line_of("task"), f"task: expected a name (letters, digits, _), got {name!r}")
        scene_path = self.scene_path()
        try:
            scene = load_scene_spec(scene_path)
        except ConfigError as e:
            self.fail(d.line_of("scene"), f"scene: {e}")
        self.scene, self.scene_file = scene, scene_path  # colours may name the scene's objects
        camera = d.get("camera", scene.cameras[0].name if scene.cameras else None)
        if camera is None or camera not in [c.name for c in scene.cameras]:
            self.fail(d.line_of("camera"), f"camera: {camera!r} is not a camera of {scene_path}; "
                      f"it has {[c.name for c in scene.cameras]}")
        fps = d.get("fps", 10)
        if isinstance(fps, bool) or not isinstance(fps, int) or not 1 <= fps <= 50:
            self.fail(d.line_of("fps"), f"fps: expected a whole number in [1, 50], got {fps!r}")
        max_seconds = self.range(d, "max_seconds", (30.0, 30.0), (1.0, 600.0))[0]
        speed = self.range(d, "speed", (0.25, 0.25), (0.05, 1.0))
        workspace = self.workspace()
        objects = self.objects()
        targets = self.targets(objects)
        names = {"objects": set(objects), "targets": set(targets)}
        distractors = self.distractors(workspace)
        layout, min_sep = self.layout(objects, targets, workspace, scene)
        steps = self.steps(names, workspace, objects)
        success = self.success(names)
        instruction = d.get("instruction", f"Do the {name} task.")
        if not isinstance(instruction, str):
            self.fail(d.line_of("instruction"), f"instruction: expected a string, got {instruction!r}")
        try:
            instruction.format(**{r: _Fmt("red", o.shape) for r, o in objects.items()})
        except (KeyError, AttributeError, IndexError, ValueError) as e:
            self.fail(d.line_of("instruction"), f"instruction: placeholder {e} unknown; use {{role.color}} or "
                      f"{{role.shape}} with a role in {sorted(objects)}")
        return TaskProgram(name=name, path=self.path, instruction=instruction, scene=scene, scene_path=scene_path,
                           camera=camera, fps=fps, max_seconds=max_seconds, speed=speed, objects=objects,
                           targets=targets, distractors=distractors, layout=layout, min_separation=min_sep,
                           workspace=workspace, steps=steps, success=success, source=self.path.read_text())

    def scene_path(self) -> Path:
        v = self.data.get("scene")
        if v is None:
            return DEFAULT_SCENE
        if not isinstance(v, str):
            self.fail(self.data.line_of("scene"), f"scene: expected a path to a scene YAML, got {v!r}")
        p = Path(v).expanduser()
        return p if p.is_absolute() else (self.path.parent / p)

    def workspace(self) -> dict:
        ws = {"x": (0.15, 0.8), "y": (-0.45, 0.45), "z": (0.0, 0.5)}
        d = self.data.get("workspace")
        if d is None:
            return ws
        self.keys(d, {"x", "y", "z"}, "workspace", line=self.data.line_of("workspace"))
        for k in d:
            ws[k] = self.range(d, k, where="workspace.")
        return ws

    def objects(self) -> dict[str, ObjectRole]:
        d = self.data["objects"]
        self.keys(d, set(d) if isinstance(d, dict) else set(), "objects", line=self.data.line_of("objects"))
        if not d:
            self.fail(d.line, "objects: at least one object is needed")
        out = {}
        sizes = {"cube": ("side",), "box": ("size",), "cylinder": ("radius", "height")}
        for role, spec in d.items():
            where = f"objects.{role}."
            line = d.line_of(role)
            if not isinstance(role, str) or not NAME_RE.match(role):
                self.fail(line, f"objects: role {role!r} must be a name (letters, digits, _)")
            if not isinstance(spec, dict):
                self.fail(line, f"objects.{role}: expected a mapping, got {spec!r}")
            shape = spec.get("shape", "cube")
            if shape not in SHAPES:
                self.fail(spec.line_of("shape"), f"{where}shape: {shape!r} unknown; known: {list(SHAPES)}")
            self.keys(spec, {"shape", "color", "colors", "mass", *sizes[shape]}, f"objects.{role} ({shape})",
                      required=sizes[shape])
            if shape == "box":
                v = spec["size"]
                if not isinstance(v, list) or len(v) != 3:
                    self.fail(spec.line_of("size"), f"{where}size: expected [x, y, z] (each a number or a range)")
                size = [parse_range(x, spec.line_of("size"), f"{where}size[{i}]", self.fail) for i, x in enumerate(v)]
            else:
                size = [self.range(spec, k, where=where) for k in sizes[shape]]
            for lo, hi in size:
                if lo < 0.01 or hi > 0.2:
                    self.fail(line, f"objects.{role}: sizes must lie in [0.01, 0.2] m, got {size}")
            mass = self.range(spec, "mass", (0.1, 0.1), (0.005, 2.0), where)
            out[role] = ObjectRole(role, shape, size, self.colors(spec, where), mass, line)
        return out

    def targets(self, objects) -> dict[str, TargetDef]:
        d = self.data.get("targets")
        if d is None:
            return {}
        self.keys(d, set(d) if isinstance(d, dict) else set(), "targets", line=self.data.line_of("targets"))
        out = {}
        for name, spec in d.items():
            line = d.line_of(name)
            if not isinstance(name, str) or not NAME_RE.match(name) or name in objects:
                self.fail(line, f"targets: {name!r} must be a name that is not also an object role")
            spec = spec if spec is not None else LineDict()
            self.keys(spec, {"radius", "color"}, f"targets.{name}", line=line)
            radius = self.range(spec, "radius", (0.04, 0.04), (0.01, 0.2), f"targets.{name}.")[0]
            color = self.colors(spec, f"targets.{name}.", required=False) or [("green", (*COLORS["green"], 1.0))]
            out[name] = TargetDef(name, radius, color[0], line)
        return out

    def region(self, d, where: str, workspace, yaw_default=FULL_TURN, line: int | None = None) -> Region:
        self.keys(d, {"x", "y", "yaw"}, where, required=("x", "y"), line=line)
        r = Region(self.range(d, "x", where=where + "."), self.range(d, "y", where=where + "."),
                   self.range(d, "yaw", yaw_default, (-2 * math.pi, 2 * math.pi), where + "."), d.line)
        for axis in "xy":
            lo, hi = getattr(r, axis)
            if lo < workspace[axis][0] or hi > workspace[axis][1]:
                self.fail(d.line_of(axis), f"{where}.{axis}: [{lo}, {hi}] leaves the workspace "
                          f"{list(workspace[axis])} (unreachable targets)")
        return r

    def distractors(self, workspace) -> Distractors:
        d = self.data.get("distractors")
        if d is None:
            return Distractors()
        self.keys(d, {"count", "shapes", "size", "color", "colors", "region", "mass"}, "distractors",
                  line=self.data.line_of("distractors"))
        out = Distractors(line=d.line)
        c = d.get("count", [0, 0])
        c = [c, c] if isinstance(c, int) and not isinstance(c, bool) else c
        if not (isinstance(c, list) and len(c) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in c)
                and 0 <= c[0] <= c[1] <= 8):
            self.fail(d.line_of("count"), f"distractors.count: expected n or [low, high] with 0 <= low <= high <= 8, "
                      f"got {d.get('count')!r}")
        out.count = (c[0], c[1])
        shapes = d.get("shapes", ["cube"])
        for i, s in enumerate(shapes if isinstance(shapes, list) else [shapes]):
            if s not in ("cube", "cylinder"):
                self.fail(d.line_of("shapes"), f"distractors.shapes[{i}]: {s!r} unknown; known: ['cube', 'cylinder']")
        out.shapes = list(shapes) if isinstance(shapes, list) else [shapes]
        out.size = self.range(d, "size", out.size, (0.01, 0.1), "distractors.")
        out.mass = self.range(d, "mass", out.mass, (0.005, 2.0), "distractors.")
        out.colors = self.colors(d, "distractors.", required=False) or [("grey", (*COLORS["grey"], 1.0))]
        if out.count[1] > 0:
            if "region" not in d:
                self.fail(d.line, "distractors: a region {x: [..], y: [..]} is needed when count > 0")
            out.region = self.region(d["region"], "distractors.region", workspace, line=d.line_of("region"))
        return out

    def layout(self, objects, targets, workspace, scene: SceneSpec):
        d = self.data["layout"]
        self.keys(d, {"in_distribution", "out_of_distribution", "min_separation"}, "layout",
                  required=("in_distribution",), line=self.data.line_of("layout"))
        min_sep = self.range(d, "min_separation", (0.1, 0.1), (0.0, 0.5), "layout.")[0]
        placed = set(objects) | set(targets)
        out = {}
        for split, key in (("id", "in_distribution"), ("ood", "out_of_distribution")):
            if key not in d:
                continue
            regions = d[key]
            self.keys(regions, placed, f"layout.{key}", line=d.line_of(key))
            if split == "id":
                missing = sorted(placed - set(regions))
                if missing:
                    self.fail(regions.line, f"layout.{key}: no region for {missing}; every object and target "
                              "needs one")
            out[split] = {}
            for name, r in regions.items():
                yaw_default = (0.0, 0.0) if name in targets else FULL_TURN
                region = self.region(r, f"layout.{key}.{name}", workspace, yaw_default, regions.line_of(name))
                self.on_table(region, scene, region.line, f"layout.{key}.{name}")
                out[split][name] = region
        return out, min_sep

    def on_table(self, r: Region, scene: SceneSpec, line: int, where: str):
        t = scene.table
        x0, x1 = t.center[0] - t.size[0] / 2, t.center[0] + t.size[0] / 2
        y0, y1 = t.center[1] - t.size[1] / 2, t.center[1] + t.size[1] / 2
        if r.x[0] < x0 or r.x[1] > x1 or r.y[0] < y0 or r.y[1] > y1:
            self.fail(line, f"{where}: x {list(r.x)}, y {list(r.y)} is not on the table "
                      f"(x [{x0:.2f}, {x1:.2f}], y [{y0:.2f}, {y1:.2f}])")

    def steps(self, names, workspace, objects) -> list[Step]:
        from comsim.factory.primitives import PRIMITIVES

        steps, held = [], None
        for prim, raw, line in self.entries("program", "primitive", "`- grasp: {object: cube}`", PRIMITIVES):
            spec = PRIMITIVES[prim]
            values, lines = parse_params(spec.params, raw, line, prim, names, self.fail)
            step = Step(prim, values, line, lines)
            for pname, v in values.items():  # literal points must be inside the workspace box
                if isinstance(v, Ref) and v.kind == "point":
                    p = list(v.point) + ([] if len(v.point) == 3 else [workspace["z"][0]])
                    if not all(workspace[a][0] <= c <= workspace[a][1] for a, c in zip("xyz", p)):
                        self.fail(lines[pname], f"{prim}.{pname}: {list(v.point)} is outside the workspace "
                                  f"{workspace} (unreachable target)")
            held = spec.check_sequence(step, held, objects, self.fail)
            steps.append(step)
        return steps

    def entries(self, key: str, kind: str, example: str, known: dict):
        """(name, its parameters, its line) of each item of the list ``key``, each a one-entry mapping whose
        name is one of ``known`` (a ``kind``: primitive or predicate)."""
        d = self.data[key]
        if not isinstance(d, list) or not d:
            self.fail(self.data.line_of(key), f"{key}: expected a non-empty list of {kind}s")
        for i, item in enumerate(d):
            line = d.line_of(i)
            if not isinstance(item, dict) or len(item) != 1:
                self.fail(line, f"{key}[{i}]: expected one {kind} like {example}, got {item!r}")
            (name, raw), = item.items()
            if name not in known:
                self.fail(line, f"{kind} {name!r} unknown; known: {sorted(known)}")
            yield name, raw, line

    def success(self, names) -> list[Check]:
        from comsim.factory.success import PREDICATES

        out = []
        for pred, raw, line in self.entries("success", "predicate", "`- stacked: {top: a, base: b}`", PREDICATES):
            values, lines = parse_params(PREDICATES[pred].params, raw, line, pred, names, self.fail)
            for k, v in values.items():
                if isinstance(v, tuple) and v[0] != v[1]:
                    self.fail(lines[k], f"{pred}.{k}: a success condition takes a number, not a range {list(v)}")
                if isinstance(v, Ref) and v.kind == "object" and PREDICATES[pred].params[k].kind == "place":
                    self.fail(lines[k], f"{pred}.{k}: {v.name!r} is an object; expected a target or [x, y]")
            out.append(Check(pred, values, line))
        return out


def vocabulary() -> str:
    """What a task file may use: primitives and predicates with their parameters (from the code)."""
    from comsim.factory.params import REQUIRED
    from comsim.factory.primitives import PRIMITIVES
    from comsim.factory.success import PREDICATES

    def params(specs) -> list[str]:
        out = []
        for name, p in specs.items():
            default = "required" if p.default is REQUIRED else f"default {p.default}"
            bounds = f", in [{p.bounds[0]:.4g}, {p.bounds[1]:.4g}]" if p.bounds else ""
            out.append(f"    {name} ({p.kind}, {default}{bounds}){': ' + p.doc if p.doc else ''}")
        return out

    lines = ["Primitives (program:), floats may be [low, high] ranges drawn per episode:"]
    for name, prim in PRIMITIVES.items():
        lines += [f"  {name}: {(type(prim).__doc__ or '').strip().splitlines()[0]}", *params(prim.params)]
    lines.append("Success predicates (success:), all must hold on the final state:")
    for name, pred in PREDICATES.items():
        lines += [f"  {name}: {(type(pred).__doc__ or '').strip().splitlines()[0]}", *params(pred.params)]
    lines.append(f"Colours: {sorted(COLORS)}, [r, g, b] or {SCENE_COLOR}<object or marker of the scene>; shapes: {list(SHAPES)}")
    return "\n".join(lines)
