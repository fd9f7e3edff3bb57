"""`comsim generate --from-demos`: new episodes in the demonstrator's own style (MimicGen-style).

    report = generate_from_demos("runs/paired", episodes=200, out="data/mimic_push", workers=2)

The real demonstrations' twin replay (a paired dataset, ``demos.py``) is cut into free-space
and object-centric segments. Each attempt then:

1. draws a new layout from the task's regions exactly as the factory does
   (``layout.sample_setup``: the in-distribution or, with ``split="ood"``, the out-of-distribution
   regions, distractors included) and one source demonstration;
2. moves each object-centric segment rigidly with its object: a rotation ``dyaw`` about the
   object's centre in the demonstration and a shift ``(dx, dy)`` on the table (SE(2); the
   hand's orientation turns with it). A cube looks the same every quarter turn, so the
   rotation is the smallest one that matches the new yaw; the two-finger hand is the same
   after a half turn, so the wrist turns by at most a quarter turn either way. A push is
   about the object on its way to its goal: the rotation turns the demonstrated push
   direction onto the new one, and the hand's offset goes from the object's start (before
   the first touch) to the goal's (as the object arrives), in step with the object's own
   progress in the demonstration, so a longer or shorter push stretches the stroke;
3. bends the free-space motion between segments (and from the start pose to the first one)
   from one segment's transform to the next in proportion to the distance the hand has
   travelled along it, so the demonstrator's path, pauses and timing are kept;
4. turns every hand pose into joints with IK (warm-started frame to frame) and runs the
   actions in the aligned twin's physics with no rendering; an attempt is kept only when
   the task's success check passes, and is then run again, identically, with the camera
   and the control videos recorded exactly as the factory records (``EpisodeRecorder``).

Episode ``k`` tries attempts ``0, 1, ...`` with seed ``episode_seed(seed, k, attempt)`` until one
succeeds (at most ``max_attempts``), so the dataset does not depend on the number of workers
or on interruptions; failed attempts are never written, they are counted in the kept
episode's provenance (``discarded_attempts``) and in ``generation_report.json``. Provenance
names the source demonstration (paired dataset and episode, and the recording it replays),
each transform, the segments, the attempt and the seed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from comsim.episode import episode_seed
from comsim.errors import ComSimError, InputError
from comsim.factory.demos import (Segment, SourceDemo, Sources, aligned_twin, load_sources, subtasks,
                                  twin_objects)
from comsim.factory.expert import EpisodeRecorder, EpisodeResult
from comsim.factory.generate import HEADER_FILE, REPORT_FILE, TASK_FILE, check_counts, write_report
from comsim.factory.layout import SPLITS, EpisodeSetup, sample_setup
from comsim.factory.program import TASKS_DIR, TaskProgram, load_program, task_in_scene
from comsim.io.files import atomic_output, write_json
from comsim.io.keys import CONTROLS
from comsim.io.lerobot import DatasetWriter, LeRobotDataset, check_resumable, dataset_complete, dataset_fingerprint
from comsim.io.lock import output_lock
from comsim.io.paths import check_output_path, claim_output
from comsim.workers import run_jobs
from comsim.sim.ik import solve_ik
from comsim.sim.motion import IK_TOLERANCE, symmetry_period

COMMAND = "comsim generate --from-demos"
# max_attempts is not among them: it only decides when to give up, never what a kept episode is
RESUME_KEYS = ("task", "program_hash", "paired_hash", "seed", "split", "controls", "fps")
SOURCE_STREAM = 7  # the random stream of an attempt's seed that picks its source demonstration
HAND_PERIOD = np.pi  # a two-finger hand looks the same after a half turn about its axis
IK_ROT_TOLERANCE = 0.05  # rad, as the scripted expert's reachability check


class DemoDerivedError(ComSimError, RuntimeError):
    """Generation that cannot go on (e.g. no attempt of an episode succeeded); the message says why."""


# ---------------------------------------------------------------- transforms


@dataclass
class Placement:
    """A rigid move on the table: rotate by ``dyaw`` about ``about`` (x, y), then shift by ``(dx, dy)``.
    ``wrist``: how far the hand turns (``dyaw`` up to the hand's half-turn symmetry)."""
    dx: float = 0.0
    dy: float = 0.0
    dyaw: float = 0.0
    about: tuple[float, float] = (0.0, 0.0)

    @property
    def wrist(self) -> float:
        return float(self.dyaw - HAND_PERIOD * np.round(self.dyaw / HAND_PERIOD))

    def apply(self, xy: np.ndarray) -> np.ndarray:
        c, s = np.cos(self.dyaw), np.sin(self.dyaw)
        d = np.asarray(xy, np.float64) - self.about
        return np.stack([c * d[..., 0] - s * d[..., 1], s * d[..., 0] + c * d[..., 1]], -1) + self.about + \
            [self.dx, self.dy]

    def blend(self, other: "Placement", w: float) -> "Placement":
        """The placement ``w`` of the way to ``other``, which turns by as much about the same point."""
        return Placement(self.dx + w * (other.dx - self.dx), self.dy + w * (other.dy - self.dy), self.dyaw, self.about)

    def describe(self) -> dict:
        r = lambda v: round(float(v), 5)  # noqa: E731
        return {"dx": r(self.dx), "dy": r(self.dy), "dyaw": r(self.dyaw), "about": [r(v) for v in self.about]}


def _wrap(a: float, period: float) -> float:
    """``a`` plus the multiple of ``period`` that brings it nearest 0 (no period: 0)."""
    return 0.0 if period <= 0 else float(a - period * np.round(a / period))


def object_placement(src_xy, src_yaw: float, new_xy, new_yaw: float, period: float) -> Placement:
    """The move that takes an object from its pose in the demonstration to its new pose; ``period``:
    the yaw symmetry of its shape (0: turning it changes nothing)."""
    return Placement(*(np.asarray(new_xy, np.float64) - src_xy), _wrap(new_yaw - src_yaw, period), tuple(src_xy))


@dataclass
class Plan:
    """An attempt's hand motion, frame by frame, before IK."""
    pos: np.ndarray  # (T, 3)
    rot: np.ndarray  # (T, 3, 3)
    grip: np.ndarray  # (T,)
    transforms: dict  # name -> Placement.describe() (per object or target)
    segments: list[dict]


def segment_placements(demo: SourceDemo, seg: Segment, setup: EpisodeSetup):
    """(placement at each frame of ``seg``, {name: placement} to report). Grasp and place move with the
    object; a push goes from the object's placement to the goal's as the object advances."""
    st, frames = seg.subtask, np.arange(seg.start, seg.end + 1)
    if st.kind != "push":
        ref = st.frame
        if ref.kind == "object":
            x, y, yaw = setup.poses[ref.name]
            p = object_placement(demo.pos[ref.name][seg.start, :2], demo.yaw[ref.name][seg.start], (x, y), yaw,
                                 symmetry_period(setup.roles[ref.name].shape))
        elif ref.kind == "target":
            p = object_placement(demo.goals[ref.name], 0.0, setup.targets[ref.name], 0.0, 0.0)
        else:
            p = Placement()
        return [p] * len(frames), {str(ref): p}
    name = st.frame.name
    start = demo.pos[name][seg.start, :2]
    goal_src = demo.frame_xy(st.goal, seg.start)
    goal_new = setup.targets[st.goal.name] if st.goal.kind == "target" else np.asarray(st.goal.point[:2])
    obj_new = np.asarray(setup.poses[name][:2], np.float64)
    d_src, d_new = goal_src - start, goal_new - obj_new
    turn = float(np.arctan2(d_new[1], d_new[0]) - np.arctan2(d_src[1], d_src[0]))
    turn = float(np.arctan2(np.sin(turn), np.cos(turn)))
    at_object = object_placement(start, 0.0, obj_new, turn, 2 * np.pi)
    c, s = np.cos(turn), np.sin(turn)
    at_goal_shift = goal_new - (np.array([[c, -s], [s, c]]) @ (goal_src - start) + start)
    at_goal = Placement(*at_goal_shift, turn, tuple(start))
    length = max(float(np.linalg.norm(d_src)), 1e-6)
    progress = np.clip((demo.pos[name][frames, :2] - start) @ (d_src / length) / length, 0.0, 1.0)
    progress = np.maximum.accumulate(progress)  # the stroke never goes back once the object moved on
    return [at_object.blend(at_goal, w) for w in progress], {name: at_object, str(st.goal): at_goal}


def plan_attempt(demo: SourceDemo, setup: EpisodeSetup) -> Plan:
    """The demonstration's hand motion moved onto ``setup``'s layout (see the module docstring)."""
    T = len(demo)
    per_frame: list = [None] * T  # (placement a, placement b, weight of b)
    transforms, described = {}, []
    ends = []
    for seg in demo.segments:
        ps, named = segment_placements(demo, seg, setup)
        transforms.update({k: v.describe() for k, v in named.items()})
        for t, p in zip(range(seg.start, seg.end + 1), ps):
            per_frame[t] = (p, p, 0.0)
        ends.append((seg.start, seg.end, ps[0], ps[-1]))
        described.append({**seg.describe(), "length_frames": seg.end - seg.start + 1})
    # free space: from the previous transform (none before the first segment) to the next one
    prev_end, prev_p = -1, Placement()
    for start, end, first, last in ends:
        _bend(demo, per_frame, prev_end, start, prev_p, first)
        prev_end, prev_p = end, last
    pos = demo.tcp_pos.copy()
    rot = demo.tcp_rot.copy()
    for t, (a, b, w) in enumerate(per_frame):
        xy = demo.tcp_pos[t, :2]
        pos[t, :2] = (1 - w) * a.apply(xy) + w * b.apply(xy)
        turn = (1 - w) * a.wrist + w * b.wrist
        c, s = np.cos(turn), np.sin(turn)
        rot[t] = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ demo.tcp_rot[t]
    return Plan(pos, rot, demo.action[:, 7].astype(np.float64), transforms, described)


def _bend(demo: SourceDemo, per_frame: list, before: int, after: int, a: Placement, b: Placement) -> None:
    """Frames strictly between ``before`` and ``after`` go from placement ``a`` to ``b`` in proportion to
    the distance the hand travels in the demonstration (its pauses bend nothing)."""
    frames = np.arange(before + 1, after)
    if not len(frames):
        return
    path = demo.tcp_pos[max(before, 0):after + 1]
    steps = np.linalg.norm(np.diff(path, axis=0), axis=1)
    if before < 0:
        steps = np.r_[0.0, steps]  # frame 0 is the start: no distance travelled yet
    travelled = np.cumsum(steps)
    total = travelled[-1]
    for i, t in enumerate(frames):
        w = travelled[i] / total if total > 1e-9 else (i + 1) / (len(frames) + 1)
        per_frame[t] = (a, b, float(w))


class Unreachable(Exception):
    """IK cannot put the hand where the plan asks at some frame."""


def plan_actions(plan: Plan, robot_scene, q0: np.ndarray) -> np.ndarray:
    """Joint targets (T, 8) for the plan: IK frame by frame, each warm-started from the last."""
    q = np.asarray(q0, np.float64)
    out = np.empty((len(plan.pos), 8), np.float32)
    quat = np.zeros(4)
    for t in range(len(plan.pos)):
        mujoco.mju_mat2Quat(quat, plan.rot[t].reshape(-1))
        res = solve_ik(robot_scene, plan.pos[t], quat, q_init=q)
        if res.pos_err > IK_TOLERANCE or res.rot_err > IK_ROT_TOLERANCE:
            raise Unreachable(f"frame {t}: hand pose {np.round(plan.pos[t], 3).tolist()} out of reach "
                              f"(IK error {res.pos_err * 1000:.1f} mm, {np.degrees(res.rot_err):.1f} deg)")
        q = res.q
        out[t, :7], out[t, 7] = q, plan.grip[t]
    return out


def run_actions(program: TaskProgram, setup: EpisodeSetup, actions: np.ndarray, controls=(),
                render: bool = True) -> EpisodeRecorder:
    """Step ``actions`` in the episode's scene (recording as the factory does), then settle."""
    with EpisodeRecorder(program, setup, setup.build_scene(program), controls, render=render) as rec:
        for a in actions:
            rec.step(a)
        rec.settle()
    return rec


# ---------------------------------------------------------------- one episode


def choose_demo(usable: list[SourceDemo], seed: int) -> SourceDemo:
    """The attempt's source demonstration: uniform over the usable ones, from the attempt's seed."""
    return usable[int(np.random.default_rng([seed, SOURCE_STREAM]).integers(len(usable)))]


def attempt(program: TaskProgram, sources: Sources, robot_scene, seed: int, split: str,
            controls=(), render: bool = True) -> tuple[EpisodeResult | None, dict]:
    """One attempt: (the recorded episode, or None when it failed; a summary with the failure)."""
    setup = sample_setup(program, seed, split)
    demo = choose_demo(sources.usable, seed)
    summary = {"seed": seed, "source_episode": demo.episode, "failure": None, "detail": ""}
    plan = plan_attempt(demo, setup)
    max_frames = int(round(program.max_seconds * program.fps))
    if len(plan.pos) > max_frames:
        summary.update(failure="timeout", detail=f"{len(plan.pos)} frames > max_seconds={program.max_seconds}")
        return None, summary
    try:
        actions = plan_actions(plan, robot_scene, demo.action[0, :7])
    except Unreachable as e:
        summary.update(failure="unreachable", detail=str(e))
        return None, summary
    ok, verdicts = run_actions(program, setup, actions, render=False).judge()
    if not ok:
        summary.update(failure="predicate", detail=f"not met: {[k for k, v in verdicts.items() if not v]}")
        return None, summary
    if not render:
        return None, summary
    rec = run_actions(program, setup, actions, controls)
    extra = {"generator": "demo_derived",
             "source_demo": {"dataset": str(sources.paired), "episode": demo.episode, "replays": demo.origin},
             "transform": plan.transforms, "segments": plan.segments}
    result = rec.finish(twin_hash=sources.twin_hash, extra=extra)
    if not result.success:  # the same actions in the same physics: a difference is a bug, not data
        raise RuntimeError(f"seed {seed}: the recorded run failed ({result.detail}) where the physics-only run "
                           "succeeded")
    setup_doc = result.episode.provenance.extra["setup"]
    for key in ("speed", "step_params"):  # the scripted expert's settings: not used here
        setup_doc.pop(key, None)
    return result, summary


def make_episode(program: TaskProgram, sources: Sources, robot_scene, index: int, seed: int, split: str,
                 max_attempts: int, controls=()) -> EpisodeResult:
    """Episode ``index``: its attempts in order until one succeeds; the failed ones are counted in its
    provenance. DemoDerivedError when none of ``max_attempts`` does."""
    discarded = []
    for a in range(max_attempts):
        result, summary = attempt(program, sources, robot_scene, episode_seed(seed, index, a), split, controls)
        if result is not None:
            result.episode.provenance.extra.update(episode_index=index, attempt=a, discarded_attempts=discarded)
            return result
        discarded.append({"attempt": a, **summary})
    reasons = Counter(d["failure"] for d in discarded)
    raise DemoDerivedError(f"{program.path}: episode {index}: none of {max_attempts} attempts succeeded "
                           f"(failures: {dict(reasons)}); rerun with a larger --max-attempts to go on, or check "
                           f"the source demonstrations in {sources.paired}")


# ---------------------------------------------------------------- the dataset

_WORKER: dict = {}


def _init_worker(program_path: str, sources: Sources, parent: int | None = None) -> None:
    os.environ.setdefault("LP_NUM_THREADS", "1")  # one llvmpipe render thread per worker (see generate.py)
    if parent is not None:
        from comsim.workers import exit_with_parent
        exit_with_parent(parent)
    from comsim.factory.expert import robot_only_scene

    program = load_program(program_path)
    _WORKER.update(program=program, sources=sources, robot=robot_only_scene(program))


def _work(args) -> dict:
    out, index, seed, split, max_attempts, controls = args
    w = _WORKER
    result = make_episode(w["program"], w["sources"], w["robot"], index, seed, split, max_attempts, controls)
    DatasetWriter(out, w["program"].fps, resume=True).add_episode(result.episode, episode_index=index)
    return {"index": index, "attempts": result.episode.provenance.extra["attempt"] + 1}


def paired_hash(paired: Path) -> str:
    """Identity of a paired dataset's content: its episodes and its aligned twin."""
    twin = paired / "twin_aligned.yaml"
    h = hashlib.sha256(dataset_fingerprint(paired).encode())
    h.update(twin.read_bytes() if twin.is_file() else b"")
    return h.hexdigest()[:16]


def default_task(paired: Path) -> str:
    """The built-in program of the demonstrations' task: ``lab_<task>`` (configs/tasks/)."""
    task = LeRobotDataset(paired).episode_info(0)["provenance"].task
    name = f"lab_{task}"
    if not task or not (TASKS_DIR / f"{name}.yaml").is_file():
        raise InputError(None, "--task", f"a task program (the demonstrations' task {task!r} has no built-in "
                         f"configs/tasks/lab_<task>.yaml)", "none")
    return name


def check_demos(paired: str | Path, task: str | Path | None = None, split: str = "id",
                scratch: Path | None = None) -> tuple[TaskProgram, Sources]:
    """The task program moved into the paired dataset's aligned twin (written to ``scratch``/task.yaml)
    and the checked, segmented source demonstrations; writes nothing else."""
    paired = Path(paired)
    task = task if task is not None else default_task(paired)
    scene_path, spec, _ = aligned_twin(paired)
    mine = load_program(task)  # errors name the user's file and line, not the scratch copy's
    twin_objects(mine, spec, scene_path)
    subtasks(mine)
    with tempfile.TemporaryDirectory() as tmp:
        program = load_program(task_in_scene(task, scene_path, Path(scratch or tmp) / TASK_FILE))
        if split not in program.layout:
            raise InputError(program.path, "layout.out_of_distribution", "a section for split 'ood'", "none")
        return program, load_sources(paired, program)


def generate_from_demos(paired: str | Path, episodes: int, out: str | Path, *, task: str | Path | None = None,
                        workers: int = 1, seed: int = 0, split: str = "id", max_attempts: int = 50,
                        controls: tuple[str, ...] | list[str] = (), progress: bool = True) -> dict:
    """Generate ``episodes`` successful episodes of ``task`` (default: the demonstrations' built-in
    ``lab_<task>``) from the demonstrations in the paired dataset ``paired``, in its aligned twin.

    Everything is checked (the paired dataset, its fields and twin, the task, the output folder)
    before anything is written. Resumes a partial run in ``out``. Returns the report
    (``OUT/generation_report.json``): attempts, successes, failures by reason, per source demo.
    """
    check_counts(episodes=episodes, workers=workers, max_attempts=max_attempts)
    if split not in SPLITS:
        raise InputError(None, "split", f"one of {list(SPLITS)}", split)
    controls = tuple(controls)
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise InputError(None, "controls", f"some of {list(CONTROLS)}", bad)
    paired = Path(paired)
    out = check_output_path(out)
    claim_output(out, HEADER_FILE, None, (), COMMAND)  # a foreign folder is refused before any work
    with tempfile.TemporaryDirectory() as tmp:
        program, sources = check_demos(paired, task, split, Path(tmp))
        header = {"command": COMMAND, "task": program.name, "program": TASK_FILE,
                  "program_hash": program.hash, "paired": str(paired.resolve()), "paired_hash": paired_hash(paired),
                  "seed": seed, "split": split, "only_success": True, "max_attempts": max_attempts,
                  "controls": list(controls), "fps": program.fps, "camera": program.camera,
                  "twin_spec_hash": sources.twin_hash, "sources": sources.describe()}
        claim_output(out, HEADER_FILE, header, RESUME_KEYS, COMMAND, made="was generated")
        check_resumable(out, episodes, "generate")
        with output_lock(out, COMMAND):  # one writer per output; everything above wrote nothing
            # again, now that no other writer can be at work: a run that made this folder meanwhile
            resuming = claim_output(out, HEADER_FILE, header, RESUME_KEYS, COMMAND, made="was generated")
            if not resuming:
                write_json(header, out / HEADER_FILE)  # first file: it makes the folder this run's
            with atomic_output(out / TASK_FILE) as dst:
                shutil.copyfile(program.path, dst)
            return _generate(out, header, sources, episodes, workers, seed, split, max_attempts, controls, progress)


def _generate(out: Path, header: dict, sources: Sources, episodes: int, workers: int, seed: int, split: str,
              max_attempts: int, controls: tuple, progress: bool) -> dict:
    """The writing part of ``generate_from_demos``, with the output locked and every input checked."""
    program_path = str((out / TASK_FILE).resolve())
    program = load_program(program_path)
    writer = DatasetWriter(out, program.fps, resume=True)
    if dataset_complete(out):  # finished before (with as many episodes: checked)
        return _report(out, header, workers, None)
    todo = [i for i in range(episodes) if i not in writer.finished_episodes]
    jobs = [(str(out), i, seed, split, max_attempts, controls) for i in todo]
    t0 = time.perf_counter()
    run_jobs(_work, jobs, workers, f"generate {program.name} from demos", progress,
             lambda done: f"yield={len(done)}/{sum(r['attempts'] for r in done)}", _init_worker,
             (program_path, sources), init_inline=True)
    elapsed = time.perf_counter() - t0
    writer.close()
    return _report(out, header, workers, elapsed, len(jobs))


def _report(out: Path, header: dict, workers: int, elapsed: float | None, generated: int = 0) -> dict:
    """The factory's report (attempts, successes, failures by reason) plus the source demos' share."""
    report = write_report(out, header, workers, elapsed=elapsed, generated=generated)
    ds = LeRobotDataset(out)
    per_source: dict[str, Counter] = {}
    for i in range(len(ds)):
        extra = ds.episode_info(i)["provenance"].extra
        for d in extra.get("discarded_attempts", []):
            per_source.setdefault(str(d["source_episode"]), Counter())["attempts"] += 1
        c = per_source.setdefault(str(extra["source_demo"]["episode"]), Counter())
        c["attempts"] += 1
        c["successes"] += 1
    report.update(generator="demo_derived", paired=header["paired"], sources=header["sources"],
                  per_source={k: {"attempts": v["attempts"], "successes": v["successes"]}
                              for k, v in sorted(per_source.items(), key=lambda kv: int(kv[0]))},
                  episodes_per_second=None if not elapsed or not generated else round(generated / elapsed, 4))
    write_json(report, out / REPORT_FILE)
    return report
