"""One episode's world, drawn from its seed: object instances, poses, targets, distractors, parameters.

``sample_setup(program, seed, split)`` is a pure function of its arguments: the same seed
gives the same episode on any machine and in any worker. Separate random streams keep
the draws independent (changing the distractors does not move the task objects):

    [seed, LAYOUT, draw]  task object and target poses (rejection sampling)
    [seed, INSTANCES]     sizes, colours, masses of the task objects
    [seed, DISTRACTORS]   distractor count, shapes, colours, poses
    [seed, PARAMS]        primitive parameters given as ranges, and the expert's speed

``split`` is "id" (poses from ``layout.in_distribution``) or "ood" (from
``layout.out_of_distribution``, rejecting poses that fall inside the in-distribution region).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from comsim.factory.params import sample
from comsim.factory.program import ObjectRole, ProgramError, Region, TaskProgram
from comsim.sim.motion import tcp_yaw
from comsim.sim.scene import Scene, add_marker, build_mjspec
from comsim.sim.spec import ObjectSpec, SceneSpec

LAYOUT, INSTANCES, DISTRACTORS, PARAMS = 0, 1, 2, 3
MAX_LAYOUT_DRAWS = 1000
SPLITS = ("id", "ood")


@dataclass
class ObjectInstance:
    """A concrete object: shape, size (m), colour. Sizes follow ``ObjectRole.size``."""
    name: str
    shape: str  # cube | box | cylinder
    size: list[float]  # cube: [side]; box: [x, y, z]; cylinder: [radius, height]
    color: str
    rgba: tuple[float, ...]
    mass: float

    @property
    def half_height(self) -> float:
        return {"cube": self.size[0], "box": self.size[-1], "cylinder": self.size[-1]}[self.shape] / 2

    @property
    def grasp_width(self) -> float:
        """What the fingers close on (the expert grasps across the narrow side)."""
        return {"cube": self.size[0], "box": min(self.size[:2]), "cylinder": 2 * self.size[0]}[self.shape]

    @property
    def footprint(self) -> float:
        return {"cube": self.size[0], "box": float(np.mean(self.size[:2])), "cylinder": 2 * self.size[0]}[self.shape]

    def spec(self, x: float, y: float, yaw: float) -> ObjectSpec:
        if self.shape == "cylinder":
            shape, size = "cylinder", list(self.size)
        else:
            shape, size = "box", (list(self.size) * 3 if self.shape == "cube" else list(self.size))
        return ObjectSpec(name=self.name, shape=shape, size=size, rgba=list(self.rgba), mass=self.mass,
                          pos=[x, y], yaw=yaw)

    def describe(self) -> dict:
        return {"name": self.name, "shape": self.shape, "size": [round(s, 5) for s in self.size],
                "color": self.color, "mass": round(self.mass, 4)}


@dataclass
class EpisodeSetup:
    task: str
    seed: int
    split: str
    roles: dict[str, ObjectInstance]  # task objects, in program order
    distractors: list[ObjectInstance]
    poses: dict[str, tuple[float, float, float]]  # object name -> (x, y, yaw), distractors too
    targets: dict[str, np.ndarray]  # target name -> (x, y)
    target_radius: dict[str, float]
    target_rgba: dict[str, tuple]
    step_params: list[dict]  # per program step, ranges drawn
    speed: float  # nominal TCP speed, m/s
    instruction: str
    layout_draws: int = 1
    home_tcp: np.ndarray = field(default_factory=lambda: np.zeros(3))
    home_yaw: float = 0.0

    def scene_spec(self, program: TaskProgram) -> SceneSpec:
        """The twin cell with this episode's objects (task roles first: segmentation labels 2, 3, ...); the
        program's targets replace the cell's markers (a target may take a marker's look: ``scene:NAME``)."""
        spec = copy.deepcopy(program.scene)
        spec.objects = [inst.spec(*self.poses[inst.name]) for inst in [*self.roles.values(), *self.distractors]]
        spec.markers = []
        return spec

    def build_scene(self, program: TaskProgram) -> Scene:
        spec = self.scene_spec(program)
        ms = build_mjspec(spec)
        for name, xy in self.targets.items():
            add_marker(ms, name, xy, self.target_radius[name], self.target_rgba[name])
        return Scene(spec, mjspec=ms)

    def describe(self) -> dict:
        """JSON-able summary for the episode's provenance."""
        r = lambda v: round(float(v), 5)  # noqa: E731
        return {"split": self.split, "instruction": self.instruction, "layout_draws": self.layout_draws,
                "speed": r(self.speed),
                "objects": [{**inst.describe(), "role": role, "pose": [r(v) for v in self.poses[inst.name]]}
                            for role, inst in self.roles.items()],
                "distractors": [{**d.describe(), "pose": [r(v) for v in self.poses[d.name]]} for d in self.distractors],
                "targets": {n: [r(v) for v in xy] for n, xy in self.targets.items()},
                "step_params": [{k: (r(v) if isinstance(v, float) else v if isinstance(v, (bool, int)) or v is None
                                     else str(v)) for k, v in p.items()} for p in self.step_params]}


def _instance(role: ObjectRole, rng: np.random.Generator, name: str | None = None) -> ObjectInstance:
    size = [sample(s, rng) for s in role.size]
    color, rgba = role.colors[rng.integers(len(role.colors))] if len(role.colors) > 1 else role.colors[0]
    return ObjectInstance(name or role.name, role.shape, size, color, rgba, sample(role.mass, rng))


def _draw_pose(rng, region: Region, avoid: Region | None) -> tuple[float, float, float] | None:
    x, y = rng.uniform(*region.x), rng.uniform(*region.y)
    yaw = sample(region.yaw, rng)
    if avoid is not None and avoid.contains(x, y):
        return None  # out-of-distribution draws must leave the in-distribution region
    return float(x), float(y), float(yaw)


def sample_setup(program: TaskProgram, seed: int, split: str = "id", draw: int = 0) -> EpisodeSetup:
    """The episode of ``seed``; ``draw`` > 0 gives another layout for the same seed (after an
    unreachable one), keeping instances, distractor looks and parameters."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    if split not in program.layout:
        raise ProgramError(f"{program.path}: split 'ood' needs a layout.out_of_distribution section")
    inst_rng = np.random.default_rng([seed, INSTANCES])
    roles = {r: _instance(o, inst_rng) for r, o in program.objects.items()}
    poses, targets = _sample_layout(program, roles, np.random.default_rng([seed, LAYOUT, draw]), split)
    distractors = _sample_distractors(program, roles, poses, targets, np.random.default_rng([seed, DISTRACTORS, draw]))
    rng = np.random.default_rng([seed, PARAMS])
    step_params = [{k: sample(v, rng) for k, v in step.params.items()} for step in program.steps]
    speed = sample(program.speed, rng)
    instruction = program.instruction_for({r: inst.color for r, inst in roles.items()})
    return EpisodeSetup(program.name, seed, split, roles, distractors, poses, targets,
                        {n: t.radius for n, t in program.targets.items()},
                        {n: t.color[1] for n, t in program.targets.items()}, step_params, speed, instruction,
                        layout_draws=draw + 1)


def _sample_layout(program: TaskProgram, roles, rng, split):
    regions = program.layout[split]
    id_regions = program.layout["id"]
    names = list(program.objects) + list(program.targets)
    for _ in range(MAX_LAYOUT_DRAWS):
        placed = {}
        for name in names:
            region = regions.get(name, id_regions[name])
            avoid = id_regions[name] if split == "ood" and name in regions else None
            pose = _draw_pose(rng, region, avoid)
            if pose is None:
                break
            placed[name] = pose
        else:
            xy = [np.array(p[:2]) for p in placed.values()]
            if all(np.linalg.norm(a - b) >= program.min_separation for i, a in enumerate(xy) for b in xy[i + 1:]):
                poses = {n: placed[n] for n in program.objects}
                targets = {n: np.array(placed[n][:2]) for n in program.targets}
                return poses, targets
    line = program.layout[split][next(iter(regions))].line if regions else 1
    raise ProgramError(f"{program.where(line)}: layout ({split}): no arrangement keeps min_separation="
                       f"{program.min_separation} m in {MAX_LAYOUT_DRAWS} draws; widen the regions or lower it")


def _segment_distance(p, a, b) -> float:
    ab = b - a
    t = np.clip((p - a) @ ab / max(ab @ ab, 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * ab)))


def _sample_distractors(program: TaskProgram, roles, poses, targets, rng) -> list[ObjectInstance]:
    """Distractors keep ``min_separation`` from every task object and target, and from the straight
    paths between them (where the expert carries or pushes), so they distract without blocking."""
    d = program.distractors
    n = int(rng.integers(d.count[0], d.count[1] + 1)) if d.count[1] > 0 else 0
    if n == 0:
        return []
    anchors = [np.array(p[:2]) for p in poses.values()] + list(targets.values())
    segments = [(a, b) for i, a in enumerate(anchors) for b in anchors[i + 1:]]
    out = []
    for k in range(n):
        shape = d.shapes[rng.integers(len(d.shapes))]
        s = sample(d.size, rng)
        size = [s] if shape == "cube" else [s / 2, s]
        color, rgba = d.colors[rng.integers(len(d.colors))]
        inst = ObjectInstance(f"distractor_{k}", shape, size, color, rgba, sample(d.mass, rng))
        for _ in range(200):
            x, y, yaw = _draw_pose(rng, d.region, None)
            p = np.array([x, y])
            clear = min(program.min_separation, 0.06 + s)  # small things may come a little closer
            if all(np.linalg.norm(p - a) >= clear for a in anchors) and \
                    all(_segment_distance(p, a, b) >= clear for a, b in segments):
                poses[inst.name] = (x, y, yaw)
                anchors.append(p)
                out.append(inst)
                break
        # a distractor with no free spot is left out (the episode records how many it has)
    return out


def home_pose(scene: Scene) -> tuple[np.ndarray, float]:
    """Where the hand is when an episode starts (the spec's initial posture)."""
    pos, quat = scene.tcp_pose()
    return pos, tcp_yaw(quat)


def ood_fraction(setup: EpisodeSetup, program: TaskProgram) -> float:
    """Share of the task objects and targets outside their in-distribution region (0 for "id")."""
    id_regions = program.layout["id"]
    pts = {**{n: p[:2] for n, p in setup.poses.items() if n in program.objects}, **setup.targets}
    return sum(not id_regions[n].contains(*xy) for n, xy in pts.items()) / max(len(pts), 1)

