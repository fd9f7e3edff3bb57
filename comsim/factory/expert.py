"""The scripted expert: vet a layout with IK, run a program in the twin, record the episode.

``vet_setup`` predicts the TCP poses a program will aim at from the initial layout and
checks each one against the workspace box and with IK (the robot alone: objects do not
change kinematics). ``run_episode`` then drives the scene frame by frame (``EpisodeRecorder``, which
any other driver of the arm records through too): frame k holds the
render and state BEFORE action k, as a camera and a logger would record them. After the
program the hand holds still for ``SETTLE_S`` so that the last frames show the state the
success predicate judges. A primitive that sees its own failure ends the program early; the
episode is still recorded (honest data), with ``success`` from the predicate and the reason.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from comsim.episode import Episode, Provenance
from comsim.factory.layout import EpisodeSetup, home_pose, sample_setup
from comsim.factory.primitives import PRIMITIVES, Expert, PlanState, PrimitiveFailure
from comsim.factory.program import ProgramError, TaskProgram
from comsim.factory.success import evaluate
from comsim.io.keys import control_key, sim_key
from comsim.sim.motion import CartesianCommander, UnreachableError, reachable
from comsim.sim.render import SceneRenderer
from comsim.sim.scene import Scene
from comsim.sim.spec import spec_hash
from comsim.io.labels import seg_to_rgb
from comsim.twin.camera_model import depth_to_rgb, normal_to_rgb, normals_from_depth

SETTLE_S = 0.5


@dataclass
class Unreachable:
    step: int  # index in program.steps
    line: int  # the line of the parameter that produced the pose
    pos: np.ndarray
    why: str


def plan_waypoints(program: TaskProgram, setup: EpisodeSetup) -> list[tuple[int, np.ndarray, float, str]]:
    """(step index, TCP position, yaw, parameter) of every pose the program will aim at."""
    ps = PlanState(setup, setup.home_tcp.copy(), setup.home_yaw,
                   objects={n: [np.array([*setup.poses[n][:2], setup.roles[n].half_height]), setup.poses[n][2]]
                            for n in setup.roles})
    out = []
    for i, (step, params) in enumerate(zip(program.steps, setup.step_params)):
        ps.waypoints = []
        PRIMITIVES[step.primitive].plan(ps, params)
        out += [(i, pos, yaw, param) for pos, yaw, param in ps.waypoints]
    return out


def vet_setup(program: TaskProgram, setup: EpisodeSetup, robot_scene: Scene) -> Unreachable | None:
    """The first planned pose outside the workspace or out of IK's reach, or None."""
    q = np.asarray(robot_scene.spec.robot.init_qpos, dtype=np.float64)
    for i, pos, yaw, param in plan_waypoints(program, setup):
        step = program.steps[i]
        line = step.param_lines.get(param, step.line)
        if not program.in_workspace(pos):
            return Unreachable(i, line, pos, f"outside the workspace {program.workspace}")
        res = reachable(robot_scene, pos, yaw, q_init=q)
        if not res.converged:
            return Unreachable(i, line, pos, f"out of the arm's reach (IK error {res.pos_err * 1000:.0f} mm)")
        q = res.q
    return None


def robot_only_scene(program: TaskProgram) -> Scene:
    """The cell with no objects: for IK checks and the home pose."""
    spec = copy.deepcopy(program.scene)
    spec.objects = []
    return Scene(spec)


@dataclass
class EpisodeResult:
    episode: Episode
    success: bool
    failure: str | None  # reason key, None when success
    detail: str = ""
    verdicts: dict = field(default_factory=dict)


def _controls_frame(renderer: SceneRenderer, controls: tuple[str, ...], K) -> dict[str, np.ndarray]:
    """Control videos encoded exactly as the twin's paired data encodes them (the translator
    trained on those must read these the same way); ``K``: the camera's intrinsics at the render's size."""
    out = {}
    if "seg" in controls:
        out["seg"] = seg_to_rgb(renderer.segmentation())
    if "depth" in controls or "normal" in controls:
        depth = renderer.depth()
        if "depth" in controls:
            out["depth"] = depth_to_rgb(depth)
        if "normal" in controls:
            out["normal"] = normal_to_rgb(normals_from_depth(depth, K))
    return out


class EpisodeRecorder:
    """Steps an episode's scene one frame per action and records it as a camera and a logger would.

    Frame k holds the render and state BEFORE action k. ``settle()`` holds the last action for
    ``SETTLE_S`` so that the last frames show the state the success predicate judges, and
    ``finish()`` judges it and makes the Episode (``<camera>_sim`` frames, the chosen control
    videos, the task objects' poses as ``observation.environment_state``). Whatever drives the
    arm (the scripted expert, a demonstration's transformed segments) records through this.
    ``render=False`` steps the same physics without drawing anything (``judge()`` only): a
    driver that knows its actions in advance finds out cheaply whether an episode succeeds.
    """

    def __init__(self, program: TaskProgram, setup: EpisodeSetup, scene: Scene, controls: tuple[str, ...] = (),
                 render: bool = True):
        self.program, self.setup, self.scene, self.controls = program, setup, scene, tuple(controls)
        self.render = render
        steps_per_frame = round(1.0 / (program.fps * scene.control_dt))
        if steps_per_frame < 1 or abs(1.0 / (program.fps * scene.control_dt) - steps_per_frame) > 1e-6:
            raise ValueError(f"{program.path}: fps {program.fps} is not a whole number of control steps of "
                             f"{scene.control_dt:g} s")
        self.n_sub = steps_per_frame * scene.spec.physics.substeps
        self.max_frames = int(round(program.max_seconds * program.fps))
        self.roles = list(setup.roles)
        self.rec = {"rgb": [], "state": [], "action": [], "env": [], **{c: [] for c in self.controls}}
        self.K = scene.spec.camera(program.camera).K  # the renderer draws the camera at its own resolution
        self.renderer: SceneRenderer | None = None

    def __enter__(self) -> "EpisodeRecorder":
        if self.render:
            self.renderer = SceneRenderer(self.scene, self.program.camera).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.renderer is not None:
            self.renderer.__exit__(*exc)

    def __len__(self) -> int:
        return len(self.rec["action"])

    def step(self, action) -> None:
        """Record the frame as it is now, then hold ``action`` for one frame."""
        rec, scene = self.rec, self.scene
        if self.render:
            rec["rgb"].append(self.renderer.rgb())
            for c, img in _controls_frame(self.renderer, self.controls, self.K).items():
                rec[c].append(img)
        rec["state"].append(scene.get_state().astype(np.float32))
        rec["env"].append(np.concatenate([np.concatenate(scene.object_pose(r)) for r in self.roles]))
        rec["action"].append(action)
        scene.step(action, n_substeps=self.n_sub)

    def settle(self) -> None:
        """Hold still so that the last frames show the state the predicate judges."""
        last = self.rec["action"][-1] if self.rec["action"] else np.concatenate(
            [self.scene.get_state()[:7], [self.scene.spec.robot.init_gripper]]).astype(np.float32)
        for _ in range(max(1, round(SETTLE_S * self.program.fps))):
            self.step(last)

    def judge(self) -> tuple[bool, dict[str, bool]]:
        """The task's predicates on the scene as it is now: (all pass, each verdict)."""
        return evaluate(self.program, self.setup, self.scene)

    def finish(self, failure: str | None = None, detail: str = "", twin_hash: str | None = None,
               extra: dict | None = None) -> EpisodeResult:
        """Judge the final state with the task's predicates and make the Episode; ``failure``: why the
        driver stopped early (None: it ran to the end), ``extra``: more provenance."""
        program, setup, rec = self.program, self.setup, self.rec
        success, verdicts = self.judge()
        if not success and failure is None:
            failed = [k for k, v in verdicts.items() if not v]
            failure, detail = "predicate", f"{program.path}: not met: {failed}"
        cam = program.camera
        frames = {sim_key(cam): np.stack(rec["rgb"])}
        frames.update({control_key(cam, c): np.stack(rec[c]) for c in self.controls})
        twin_hash = twin_hash or spec_hash(program.scene)
        prov = Provenance(source="sim", task=program.name, seed=setup.seed, twin_spec_hash=twin_hash,
                          extra={"program_hash": program.hash, "program": program.path.name, "setup": setup.describe(),
                                 "checks": verdicts, "failure": None if success else failure,
                                 "failure_detail": None if success else detail, **(extra or {})})
        ep = Episode(frames=frames, action=np.stack(rec["action"]), state=np.stack(rec["state"]), fps=program.fps,
                     task=setup.instruction, success=bool(success), provenance=prov,
                     extra={"observation.environment_state": np.stack(rec["env"]).astype(np.float32)})
        return EpisodeResult(ep, bool(success), None if success else failure, detail, verdicts)


def run_episode(program: TaskProgram, setup: EpisodeSetup, controls: tuple[str, ...] = (),
                twin_hash: str | None = None) -> EpisodeResult:
    """Simulate ``setup`` with the program's expert; the Episode holds ``<camera>_sim`` frames."""
    scene = setup.build_scene(program)
    ex = Expert(scene, setup, CartesianCommander(scene, 1.0 / program.fps, speed=setup.speed))
    failure, detail = None, ""
    with EpisodeRecorder(program, setup, scene, controls) as rec:
        for step, params in zip(program.steps, setup.step_params):
            try:
                for action in PRIMITIVES[step.primitive].run(ex, params):
                    rec.step(action)
                    if len(rec) >= rec.max_frames:
                        raise PrimitiveFailure("timeout", f"max_seconds={program.max_seconds} reached")
            except (PrimitiveFailure, UnreachableError) as e:
                failure = getattr(e, "reason", "unreachable")
                detail = f"{program.where(step.line)} ({step.primitive}): {e}"
                break
        rec.settle()
    return rec.finish(failure, detail, twin_hash)


def prepare_setup(program: TaskProgram, seed: int, split: str, robot_scene: Scene, max_draws: int = 20):
    """``sample_setup`` with layouts redrawn until IK can reach every planned pose.

    Returns (setup, redraws). A seed whose ``max_draws`` layouts are all unreachable means the
    task's regions are mostly out of reach: a ProgramError naming the line, not a bad seed.
    """
    home, home_yaw = home_pose(robot_scene)
    last = None
    for draw in range(max_draws):
        setup = sample_setup(program, seed, split, draw)
        setup.home_tcp, setup.home_yaw = home, home_yaw
        last = vet_setup(program, setup, robot_scene)
        if last is None:
            return setup, draw
    step = program.steps[last.step]
    raise ProgramError(f"{program.where(last.line)}: {step.primitive}: {max_draws} layouts in a row put a target "
                       f"{np.round(last.pos, 3).tolist()} {last.why}; move the regions or targets into reach")
