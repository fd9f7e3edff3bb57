"""Source demonstrations for demo-derived generation: a paired dataset's episodes in the twin's frame,
replayed in the twin's physics and cut into free-space and object-centric segments.

    sources = load_sources("runs/paired", program)     # every check happens here, before anything is written
    sources.usable                                     # the demos whose twin replay meets the task's success check

What a paired dataset (``comsim twin replay``) holds, and what is read from it:
- ``PAIRED/twin_aligned.yaml``: the aligned twin. Its hash must be ``spec_hash`` in
  ``twin_alignment.json`` and every episode's ``twin_spec_hash``: the actions are in this twin's frame.
- per episode: ``action`` (the demonstrator's joint targets + gripper command, frame by frame),
  ``observation.state`` (its first row: where the arm started) and ``twin_object_pos`` /
  ``twin_object_quat``; the objects' initial poses are the ones the replay's provenance records
  (``refined_objects`` or ``localized_objects``), else the first row of those fields.
The objects' poses over time and the robot's contacts with them come from a physics replay of
the actions in the aligned twin (``twin.track.PhysicsReplay``, stepped as ``comsim twin replay``
steps), so a ``kinematic`` replay, whose objects never move, serves as well. The commanded
hand pose at each frame is the forward kinematics of that frame's action.

Which parts of a demonstration are about which object follows from the task program:
``grasp: {object: o}`` is about ``o``, ``push: {object: o, to: g}`` about ``o`` on its way to
``g``, ``stack: {on: b}`` / ``place: {at: t}`` about ``b`` / ``t``. Each part is anchored on the
twin's contacts (grasp: the first touch of ``o`` until ``o`` leaves the table; push: the first to
the last touch of ``o``; stack/place: the last touch of the object in the hand, its release) and
grows both ways while the hand stays near the part's object (the approach, the lift). What lies
between parts is free-space motion.

A demonstration is used only when its twin replay meets the task's success check: one that the
twin does not reproduce would pass its failure on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import mujoco
import numpy as np

from comsim.errors import ComSimError, InputError
from comsim.factory.layout import EpisodeSetup, ObjectInstance
from comsim.factory.params import Ref
from comsim.factory.program import TaskProgram
from comsim.factory.success import SceneState, judge
from comsim.io.lerobot import LeRobotDataset
from comsim.sim.motion import object_yaw
from comsim.sim.scene import yaw_quat
from comsim.sim.spec import SceneSpec, load_scene_spec, spec_hash
from comsim.twin.replay import ALIGNMENT_FILE
from comsim.twin.track import PhysicsReplay

ALIGNED_TWIN = "twin_aligned.yaml"  # written by `comsim twin replay` next to its episodes
NEAR_PUSH = 0.14  # m from the object's centre within which a push is about it (the hand starts ~11 cm away)
NEAR = 0.12  # m ... within which a grasp or a placement is about its object (the hand hovers ~10 cm above it)
LIFTED = 0.02  # m above where it was touched: a grasped object has left the table


class SourceDemoError(ComSimError, ValueError):
    """A paired dataset that cannot give source demonstrations; the message names the file and field."""


@dataclass
class Subtask:
    """One object-centric part of the task: ``kind`` grasp | push | place, about ``frame`` (an object
    role, a target or a point); ``held``: the role in the hand (place); ``goal``: where a push goes."""
    kind: str
    frame: Ref
    held: str | None = None
    goal: Ref | None = None
    line: int = 0

    def describe(self) -> str:
        if self.kind == "push":
            return f"push {self.frame} to {self.goal}"
        return f"grasp {self.frame}" if self.kind == "grasp" else f"place {self.held} on {self.frame}"


def subtasks(program: TaskProgram) -> list[Subtask]:
    """The object-centric parts of ``program``, in order."""
    out, held = [], None
    for step in program.steps:
        p = step.params
        if step.primitive == "grasp":
            held = p["object"].name
            out.append(Subtask("grasp", p["object"], line=step.line))
        elif step.primitive == "push":
            out.append(Subtask("push", p["object"], goal=p["to"], line=step.line))
        elif step.primitive in ("stack", "place"):
            out.append(Subtask("place", p["on"] if step.primitive == "stack" else p["at"], held=held, line=step.line))
        elif step.primitive == "release":
            held = None
    if not out:
        program.fail(program.steps[0].line, "demo-derived generation needs an object-centric step "
                     "(grasp, push, stack or place) to tell which object a demonstration's motion is about")
    return out


@dataclass
class Segment:
    """Frames ``start``..``end`` (inclusive) of a demonstration are about ``subtask``'s object;
    ``anchor``: the frames the contacts pin down."""
    subtask: Subtask
    start: int
    end: int
    anchor: tuple[int, int]

    def describe(self) -> dict:
        return {"subtask": self.subtask.describe(), "frames": [self.start, self.end], "anchor": list(self.anchor)}


@dataclass
class SourceDemo:
    """One demonstration in the aligned twin's frame (all arrays per frame)."""
    episode: int  # in the paired dataset
    origin: dict  # the recording it replays: {"dataset", "episode"}
    action: np.ndarray  # (T, 8) joint targets + gripper command
    tcp_pos: np.ndarray  # (T, 3) the commanded hand position (forward kinematics of the action)
    tcp_rot: np.ndarray  # (T, 3, 3) ... and orientation
    pos: dict[str, np.ndarray]  # role -> (T, 3) object centre in the twin's physics replay
    yaw: dict[str, np.ndarray]  # role -> (T,)
    touch: dict[str, np.ndarray]  # role -> (T,) bool: the robot touches it
    goals: dict[str, np.ndarray] = field(default_factory=dict)  # target -> (2,) where it was in this demo
    segments: list[Segment] = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # the task's success checks on the replay's last frame
    problem: str | None = None  # why the demo is not used; None: used

    def __len__(self) -> int:
        return len(self.action)

    def frame_xy(self, ref: Ref, t: int) -> np.ndarray:
        """Where ``ref`` (an object role, target or point) was at frame ``t`` on the table."""
        return self.frame_pos(ref, t)[:2]

    def frame_pos(self, ref: Ref, t: int) -> np.ndarray:
        """... in 3-D (an object's centre; a target or point on the table)."""
        if ref.kind == "object":
            return self.pos[ref.name][t]
        if ref.kind == "target":
            return np.r_[self.goals[ref.name], 0.0]
        return np.r_[ref.point[:2], ref.point[2] if len(ref.point) == 3 else 0.0]


@dataclass
class Sources:
    paired: Path
    spec: SceneSpec  # the aligned twin
    spec_path: Path
    twin_hash: str
    objects: dict[str, str]  # role -> the twin's object
    demos: list[SourceDemo]

    @property
    def usable(self) -> list[SourceDemo]:
        return [d for d in self.demos if d.problem is None]

    def describe(self) -> dict:
        return {"paired": str(self.paired), "twin_spec_hash": self.twin_hash, "objects": self.objects,
                "used": [d.episode for d in self.usable],
                "excluded": {str(d.episode): d.problem for d in self.demos if d.problem is not None}}


# ---------------------------------------------------------------- loading and checking


def aligned_twin(paired: Path) -> tuple[Path, SceneSpec, str]:
    """The aligned twin of a paired dataset, checked against ``twin_alignment.json``."""
    path, al_path = paired / ALIGNED_TWIN, paired / ALIGNMENT_FILE
    for p in (path, al_path):
        if not p.is_file():
            raise InputError(p, None, "the aligned twin that `comsim twin replay` writes next to its episodes",
                             "no such file")
    spec = load_scene_spec(path)
    h = spec_hash(spec)
    try:
        al = json.loads(al_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(al_path, None, "a JSON object", f"unreadable ({e})") from None
    if not isinstance(al, dict) or al.get("spec_hash") != h:
        raise InputError(al_path, "spec_hash", f"{h} (the hash of {path})",
                         al.get("spec_hash") if isinstance(al, dict) else al)
    return path, spec, h


def twin_objects(program: TaskProgram, spec: SceneSpec, where: Path) -> dict[str, str]:
    """Role -> the twin's object it is: the one whose look it takes (``color: scene:<name>``), else the
    one named like the role."""
    names = [o.name for o in spec.objects]
    out = {}
    for role, r in program.objects.items():
        looks = {c[0] for c in r.colors}
        if len(looks) == 1 and next(iter(looks)) in names:
            out[role] = next(iter(looks))
        elif role in names:
            out[role] = role
        else:
            program.fail(r.line, f"objects.{role}: which object of the twin {where} is it? Give it that object's "
                         f"look (`color: scene:<name>`); the twin has {names}")
    return out


def _source_goal(program: TaskProgram, target: str, spec: SceneSpec, final_xy: np.ndarray) -> np.ndarray:
    """Where ``target`` was in the demonstrations: the twin's marker whose look it takes, else where the
    object sent to it ended."""
    markers = {m.name: m for m in spec.markers}
    look = program.targets[target].color[0]
    return np.asarray(markers[look].pos[:2], np.float64) if look in markers else np.asarray(final_xy, np.float64)


def _initial_poses(ds: LeRobotDataset, e: int, cols: dict, spec: SceneSpec, wanted: list[str]) -> dict:
    """{twin object: (pos, quat)} at frame 0, as the replay set them: the poses its provenance records
    (``refined_objects``, else the ``localized_objects`` found; exact, where the stored tracks are
    float32 and a push amplifies their rounding), else the replay's first ``twin_object_pos``."""
    names = [o.name for o in spec.objects]
    extra = ds.episode_info(e)["provenance"].extra
    found = (extra.get("refined_objects") or {}).get("objects") or extra.get("localized_objects")
    if isinstance(found, dict) and found:
        return {n: (np.asarray(r["pos"], np.float64), yaw_quat(float(r["yaw"]))) for n, r in found.items()
                if n in names and isinstance(r, dict) and r.get("found", True) and "pos" in r and "yaw" in r}
    if "twin_object_pos" in cols and "twin_object_quat" in cols:
        pos = cols["twin_object_pos"].reshape(len(cols["twin_object_pos"]), -1, 3)
        quat = cols["twin_object_quat"].reshape(len(cols["twin_object_quat"]), -1, 4)
        if pos.shape[1] != len(names) or quat.shape[1] != len(names):
            raise InputError(ds.root / "meta" / "info.json", "features.twin_object_pos",
                             f"one pose per object of the aligned twin ({names})", f"{pos.shape[1]} poses")
        return {n: (pos[0, i].astype(np.float64), quat[0, i].astype(np.float64)) for i, n in enumerate(names)}
    raise InputError(f"{ds.root}: episode {e}", "twin_object_pos",
                     f"where the twin found the objects {wanted} (a physics replay by `comsim twin replay` "
                     "records it)", "missing, and no refined_objects/localized_objects in the provenance")


def tcp_poses(scene, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hand position (T, 3) and orientation (T, 3, 3) for joint positions (T, 7) (scratch data; the scene
    is not touched)."""
    m, d = scene.model, scene.scratch_data
    d.qpos[:] = scene.data.qpos
    pos, rot = np.empty((len(q), 3)), np.empty((len(q), 3, 3))
    for t, qt in enumerate(np.asarray(q, np.float64)):
        d.qpos[scene.arm_qadr] = qt
        mujoco.mj_kinematics(m, d)
        pos[t] = d.site_xpos[scene.tcp_site]
        rot[t] = d.site_xmat[scene.tcp_site].reshape(3, 3)
    return pos, rot


def load_sources(paired: str | Path, program: TaskProgram) -> Sources:
    """Read, check, replay and segment every episode of the paired dataset ``paired`` for ``program``
    (already moved into the aligned twin). Raises a ComSimError naming the file and field on bad input,
    and when no demonstration is usable."""
    paired = Path(paired)
    spec_path, spec, twin_hash = aligned_twin(paired)
    ds = LeRobotDataset(paired)
    info = paired / "meta" / "info.json"
    for key in ("action", "observation.state"):
        shape = (ds.features.get(key) or {}).get("shape")
        if not shape or shape[-1] < 8:
            raise InputError(info, f"features.{key}", "7 joint positions + the gripper (8 values)", shape)
    if abs(float(ds.fps) - program.fps) > 1e-9:
        raise InputError(info, "fps", f"{program.fps}, the fps of the task {program.path}", ds.fps)
    objects = twin_objects(program, spec, spec_path)
    steps = subtasks(program)
    demos = [_load_demo(ds, e, spec, twin_hash, program, objects, steps) for e in range(len(ds))]
    sources = Sources(paired, spec, spec_path, twin_hash, objects, demos)
    if not sources.usable:
        raise SourceDemoError(f"{paired}: none of its {len(demos)} episodes is a usable demonstration of "
                              f"{program.name}: " + "; ".join(f"episode {d.episode}: {d.problem}" for d in demos))
    return sources


def _load_demo(ds: LeRobotDataset, e: int, spec: SceneSpec, twin_hash: str, program: TaskProgram,
               objects: dict[str, str], steps: list[Subtask]) -> SourceDemo:
    where = f"{ds.root}: episode {e}"
    prov = ds.episode_info(e)["provenance"]
    if prov.twin_spec_hash != twin_hash:
        raise InputError(where, "provenance.twin_spec_hash", f"{twin_hash}, the hash of {ds.root / ALIGNED_TWIN}",
                         prov.twin_spec_hash)
    cols = ds.read_columns(e, ["action", "observation.state", "timestamp", "twin_object_pos", "twin_object_quat"])
    action, state = cols["action"].astype(np.float64), cols["observation.state"].astype(np.float64)
    if not (np.all(np.isfinite(action)) and np.all(np.isfinite(state))):
        raise InputError(where, "action/observation.state", "finite numbers", "NaN or inf")
    poses = _initial_poses(ds, e, cols, spec, list(objects.values()))
    timestamps = cols["timestamp"].reshape(-1) if "timestamp" in cols else np.arange(len(action)) / ds.fps
    replay = PhysicsReplay(spec, state, action, timestamps)
    pos, quat, touch, _ = replay.run(poses)
    tcp_pos, tcp_rot = tcp_poses(replay.scene, action[:, :7])
    names = replay.scene.object_names
    demo = SourceDemo(
        episode=e, origin={"dataset": prov.extra.get("real_dataset"), "episode": prov.extra.get("real_episode")},
        action=action[:, :8].astype(np.float32), tcp_pos=tcp_pos, tcp_rot=tcp_rot,
        pos={r: pos[:, names.index(n)] for r, n in objects.items()},
        yaw={r: np.array([object_yaw(q) for q in quat[:, names.index(n)]]) for r, n in objects.items()},
        touch={r: touch[:, names.index(n)] for r, n in objects.items()})
    for st in steps:  # where each target was in this demonstration
        if st.kind == "push" and st.goal.kind == "target":
            demo.goals[st.goal.name] = _source_goal(program, st.goal.name, spec, demo.pos[st.frame.name][-1, :2])
        if st.kind == "place" and st.frame.kind == "target" and st.held is not None:
            demo.goals[st.frame.name] = _source_goal(program, st.frame.name, spec, demo.pos[st.held][-1, :2])
    for name in program.targets:
        demo.goals.setdefault(name, np.asarray(_source_goal(program, name, spec, [np.nan, np.nan])))
    ok, demo.checks = _replay_checks(demo, program, spec, objects, float(replay.scene.get_state()[7]))
    if not ok:
        demo.problem = f"its twin replay fails the task's checks {[k for k, v in demo.checks.items() if not v]}"
        return demo
    try:
        demo.segments = segment(demo, steps)
    except _Unusable as why:
        demo.problem = str(why)
    return demo


def _replay_checks(demo: SourceDemo, program: TaskProgram, spec: SceneSpec, objects: dict[str, str],
                   gripper_width: float) -> tuple[bool, dict]:
    """The task's success checks on the last frame of the demonstration's twin replay."""
    by_name = {o.name: o for o in spec.objects}
    roles = {}
    for role, name in objects.items():
        o, shape = by_name[name], program.objects[role].shape
        size = [o.size[0]] if shape == "cube" else list(o.size)
        roles[role] = ObjectInstance(role, shape, size, name, tuple(o.rgba), o.mass)
    setup = EpisodeSetup(program.name, 0, "id", roles, [], {}, demo.goals,
                         {n: t.radius for n, t in program.targets.items()},
                         {n: t.color[1] for n, t in program.targets.items()}, [], 0.0, "")
    final = SceneState(pos={r: demo.pos[r][-1] for r in roles},
                       quat={r: yaw_quat(demo.yaw[r][-1]) for r in roles},
                       gripper_width=gripper_width, touching_robot={r: bool(demo.touch[r][-1]) for r in roles})
    return judge(program, setup, final)


class _Unusable(Exception):
    """A demonstration whose contacts do not show the task's parts (the message says what is missing)."""


def _anchor(demo: SourceDemo, st: Subtask) -> tuple[int, int]:
    if st.kind == "place":
        if st.held is None:
            raise _Unusable(f"{st.describe()}: nothing is held")
        touched = np.flatnonzero(demo.touch[st.held])
        if not len(touched):
            raise _Unusable(f"the hand never touches {st.held}")
        return int(touched[-1]), int(touched[-1])
    name = st.frame.name
    touched = np.flatnonzero(demo.touch[name])
    if not len(touched):
        raise _Unusable(f"the hand never touches {name}")
    a = int(touched[0])
    if st.kind == "push":
        return a, int(touched[-1])
    z = demo.pos[name][:, 2]
    lifted = np.flatnonzero(z[a:] - z[a] > LIFTED)
    if not len(lifted):
        raise _Unusable(f"{name} never leaves the table")
    return a, a + int(lifted[0])


def segment(demo: SourceDemo, steps: list[Subtask]) -> list[Segment]:
    """The demonstration's object-centric segments, one per subtask, in order and not overlapping; the
    last one runs to the end (the retreat moves with the last object)."""
    anchors = [_anchor(demo, st) for st in steps]
    for k in range(1, len(anchors)):
        if anchors[k][0] <= anchors[k - 1][1]:
            raise _Unusable(f"{steps[k].describe()} (frame {anchors[k][0]}) does not follow "
                            f"{steps[k - 1].describe()} (frame {anchors[k - 1][1]})")
    hand = demo.tcp_pos
    out, prev_end = [], -1
    for k, (st, (a, b)) in enumerate(zip(steps, anchors)):
        near = NEAR_PUSH if st.kind == "push" else NEAR
        ref = demo.frame_pos(st.frame, a)
        s = a
        while s - 1 > prev_end and np.linalg.norm(hand[s - 1] - ref) < near:
            s -= 1
        if k == len(steps) - 1:
            e = len(demo) - 1
        else:
            ref = demo.frame_pos(st.frame, b if st.kind == "push" else a)
            e = b
            while e + 1 < anchors[k + 1][0] - 1 and np.linalg.norm(hand[e + 1] - ref) < near:
                e += 1
        out.append(Segment(st, s, e, (a, b)))
        prev_end = e
    return out
