"""MuJoCo scenes from a SceneSpec: build an MjSpec, compile it, drive the robot.

``build_mjspec(spec)`` returns an uncompiled ``mujoco.MjSpec`` so that callers (the lab)
can add textures, lights or materials before compiling; ``Scene(spec, mjspec=...)``
compiles it and wraps model + data with the robot vectors of CONTRACTS.md:
action (8,) = 7 absolute joint targets + gripper command in [0, 1] (1 = open);
state (8,) = 7 joint positions + gripper opening width in metres.

Names in the compiled model: robot elements start with ``robot/``, objects are bodies,
free joints and geoms named ``object/<name>``, cameras keep their spec names, and the
static world is ``table``, ``floor`` and ``backdrop``.
"""
from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from comsim.sim import meshes
from comsim.sim.camera import opencv_to_mujoco
from comsim.sim.spec import (ConfigError, RobotSpec, SceneSpec, load_scene_spec, panda_assets_dir,
                             robot_mjcf_path, validate_scene_spec)

ROBOT_PREFIX = "robot/"
OBJECT_PREFIX = "object/"
MARKER_PREFIX = "marker/"  # flat discs with no collision: label 0 (background) in segmentation
MARKER_CENTRE_Z, MARKER_HALF_HEIGHT = 0.0006, 0.0005  # m: a marker disc, 0.1 mm clear of the table top
MARKER_TOP_Z = MARKER_CENTRE_Z + MARKER_HALF_HEIGHT  # m above the table top: the face the camera sees
ARM_ACTUATORS = [f"{ROBOT_PREFIX}act_joint{i}" for i in range(1, 8)]
GRIPPER_ACTUATOR = f"{ROBOT_PREFIX}act_gripper"
TCP_SITE = f"{ROBOT_PREFIX}tcp"
FINGER_TRAVEL = 0.04  # metres per finger (Franka Hand: 0-80 mm opening)
TCP_OFFSET = 0.1034  # hand frame origin -> between the fingertips (dm-robotics-panda's TCP)
FINGER_DAMPING = 500.0  # N s/m per finger
ARMATURE = 0.1  # reflected rotor inertia (mujoco_menagerie's Panda); keeps stiff servos stable

# Collision bits: robot geoms do not collide with each other (hull overlaps between
# non-adjacent links would otherwise fight the servos) but do with everything else.
ROBOT_CONTYPE, ROBOT_CONAFFINITY = 1, 2
WORLD_CONTYPE, WORLD_CONAFFINITY = 3, 3
HIDDEN_GROUP = 3  # collision-only geoms; MjvOption shows groups 0-2 by default

_INTEGRATORS = {"implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
                "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT,
                "RK4": mujoco.mjtIntegrator.mjINT_RK4, "Euler": mujoco.mjtIntegrator.mjINT_EULER}
_CONES = {"elliptic": mujoco.mjtCone.mjCONE_ELLIPTIC, "pyramidal": mujoco.mjtCone.mjCONE_PYRAMIDAL}


def yaw_quat(yaw: float) -> np.ndarray:
    return np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])


# ---------------------------------------------------------------- building


def apply_robot_tint(ms: mujoco.MjSpec, tint) -> None:
    """Multiply the robot's materials and rgba-coloured geoms by ``tint`` (r, g, b)."""
    t = list(np.clip(np.asarray(tint, np.float64), 0.0, 4.0)) + [1.0]
    for mat in ms.materials:
        if mat.name.startswith(ROBOT_PREFIX):
            mat.rgba = [min(1.0, a * b) for a, b in zip(mat.rgba, t)]
    for geom in ms.geoms:
        if geom.name.startswith(ROBOT_PREFIX) and not geom.material:
            geom.rgba = [min(1.0, a * b) for a, b in zip(geom.rgba, t)]


def add_marker(ms: mujoco.MjSpec, name: str, xy, radius: float, rgba) -> None:
    """A flat disc on the table top, under the objects, that nothing collides with (a target sticker)."""
    ms.worldbody.add_geom(name=MARKER_PREFIX + name, type=mujoco.mjtGeom.mjGEOM_CYLINDER,
                          size=[radius, MARKER_HALF_HEIGHT, 0], pos=[xy[0], xy[1], MARKER_CENTRE_Z],
                          rgba=list(rgba),
                          contype=0, conaffinity=0)


def build_mjspec(spec: SceneSpec) -> mujoco.MjSpec:
    """The whole cell as an uncompiled MjSpec (robot, table, markers, backdrop, objects, cameras, lights)."""
    validate_scene_spec(spec)
    s = mujoco.MjSpec()
    s.modelname = "comsim_cell"
    _set_options(s, spec)
    world = s.worldbody
    t, b = spec.table, spec.backdrop
    world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[4, 4, 0.1],
                   pos=[0, 0, -t.height], rgba=b.floor_rgba,
                   contype=WORLD_CONTYPE, conaffinity=WORLD_CONAFFINITY)
    world.add_geom(name="backdrop", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.01, 4, b.wall_height / 2],
                   pos=[b.wall_x - 0.01, 0, -t.height + b.wall_height / 2], rgba=b.wall_rgba,
                   contype=0, conaffinity=0)
    world.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_BOX,
                   size=[t.size[0] / 2, t.size[1] / 2, t.height / 2],
                   pos=[t.center[0], t.center[1], -t.height / 2], rgba=t.rgba,
                   friction=[t.friction, 0.005, 0.0001],
                   contype=WORLD_CONTYPE, conaffinity=WORLD_CONAFFINITY)

    for mk in spec.markers:
        add_marker(s, mk.name, mk.pos, mk.radius, mk.rgba)

    robot = _robot_mjspec(spec.robot)
    world.add_frame(pos=spec.robot.base_pos).attach_body(robot.worldbody.first_body(), ROBOT_PREFIX, "")
    _add_robot_control(s, spec.robot)
    if spec.robot.tint is not None:
        apply_robot_tint(s, spec.robot.tint)

    for o in spec.objects:
        z = o.pos[2] if len(o.pos) == 3 else o.half_height
        body = world.add_body(name=OBJECT_PREFIX + o.name, pos=[o.pos[0], o.pos[1], z], quat=yaw_quat(o.yaw))
        body.add_freejoint(name=OBJECT_PREFIX + o.name)
        if o.shape == "box":
            gtype, size = mujoco.mjtGeom.mjGEOM_BOX, [v / 2 for v in o.size]
        else:
            gtype, size = mujoco.mjtGeom.mjGEOM_CYLINDER, [o.size[0], o.size[1] / 2, 0]
        body.add_geom(name=OBJECT_PREFIX + o.name, type=gtype, size=size, rgba=o.rgba, mass=o.mass,
                      friction=[o.friction, 0.005, 0.0001], condim=4,
                      contype=WORLD_CONTYPE, conaffinity=WORLD_CONAFFINITY)

    T_world_from_base = np.eye(4)
    T_world_from_base[:3, 3] = spec.robot.base_pos
    for cam in spec.cameras:
        p = opencv_to_mujoco(cam.K, cam.T_cam_from_base, cam.width, cam.height, T_world_from_base)
        world.add_camera(name=cam.name, pos=p.pos, quat=p.quat, resolution=p.resolution,
                         sensor_size=p.sensorsize, focal_pixel=p.focal_pixel,
                         principal_pixel=p.principal_pixel)
    for light in spec.lights:
        world.add_light(pos=light.pos, dir=light.dir, diffuse=light.diffuse, ambient=light.ambient,
                        specular=light.specular, castshadow=light.castshadow and spec.render.shadows,
                        type=(mujoco.mjtLightType.mjLIGHT_DIRECTIONAL if light.directional
                              else mujoco.mjtLightType.mjLIGHT_SPOT), cutoff=90)
    return s


def _set_options(s: mujoco.MjSpec, spec: SceneSpec) -> None:
    p, r = spec.physics, spec.render
    s.option.timestep = p.timestep
    s.option.integrator = _INTEGRATORS[p.integrator]
    s.option.cone = _CONES[p.cone]
    s.option.impratio = p.impratio
    s.option.noslip_iterations = p.noslip_iterations
    s.visual.quality.offsamples = r.offsamples
    s.visual.quality.shadowsize = r.shadowsize
    # Offscreen buffer: big enough for every camera (SceneRenderer grows it on demand).
    s.visual.global_.offwidth = max([640] + [c.width for c in spec.cameras])
    s.visual.global_.offheight = max([480] + [c.height for c in spec.cameras])
    s.visual.headlight.ambient = r.headlight_ambient
    s.visual.headlight.diffuse = r.headlight_diffuse
    s.stat.extent = 2.0  # fixes znear/zfar (fractions of the extent) whatever the robot


def _robot_mjspec(r: RobotSpec) -> mujoco.MjSpec:
    """Arm + hand as one MjSpec, stripped of its own actuators and ready for ours."""
    path = robot_mjcf_path(r)
    robot = mujoco.MjSpec.from_file(str(path))
    if r.visual == "light":
        _use_light_meshes(robot, r.light_tolerance)
    if not (r.mjcf or r.menagerie):  # built-in: attach the hand like a real Panda (-45 deg about z)
        hand = mujoco.MjSpec.from_file(str(panda_assets_dir() / "panda_hand.xml"))
        hand.delete(hand.site("wrist_site"))  # the arm has one of that name
        if r.visual == "light":
            _use_light_meshes(hand, r.light_tolerance)
        robot.body("panda_link8").add_frame(quat=[0.92387953, 0, 0, -0.38268343]).attach_body(
            hand.body("panda_hand"), "hand/", "")
    for group in (robot.actuators, robot.tendons, robot.equalities, robot.keys):
        for el in list(group):
            robot.delete(el)

    joints = [j for j in robot.joints]
    arm = [j for j in joints if j.type == mujoco.mjtJoint.mjJNT_HINGE][:7]
    fingers = [j for j in joints if j.type == mujoco.mjtJoint.mjJNT_SLIDE]
    if len(arm) != 7 or len(fingers) != 2:
        raise ConfigError(f"robot: {path} must be Panda-like (7 hinge arm joints, 2 slide finger joints); "
                          f"found {len(arm)} hinge and {len(fingers)} slide joints")
    for i, j in enumerate(arm):
        j.name = f"joint{i + 1}"
        j.armature = ARMATURE
        j.damping = np.maximum(j.damping, 0.0)  # dm-robotics-panda's joint 6 has a negative damping
    for i, j in enumerate(fingers):
        j.name = f"finger_joint{i + 1}"
        j.range = [0.0, FINGER_TRAVEL]
        # Passive damping sets the closing speed (saturated force / damping ~ 0.14 m/s, the
        # real hand's order); as a joint property it is integrated implicitly and stays
        # exact when the gripper force saturates (a saturated actuator kv made it chatter).
        j.damping = [FINGER_DAMPING, 0, 0]
    finger_bodies = [j.parent for j in fingers]
    hand = finger_bodies[0].parent
    hand.add_site(name="tcp", pos=[0, 0, TCP_OFFSET], size=[0.005, 0, 0], group=HIDDEN_GROUP)

    for body in robot.bodies:
        if body.name != "world":
            body.gravcomp = 1.0  # the real Panda's controller compensates gravity
    for geom in robot.geoms:
        if geom.contype or geom.conaffinity:
            geom.contype, geom.conaffinity = ROBOT_CONTYPE, ROBOT_CONAFFINITY
    for fb in finger_bodies:
        _add_finger_pads(fb, r.finger_friction)
    return robot


def _add_finger_pads(finger: mujoco.MjsBody, friction: float) -> None:
    """Replace the finger's contact geometry with a fingertip pad + a recessed finger box.

    In the finger frame the finger closes along +y and the fingertip's inner face is the
    plane y = 0 for z in [0.036, 0.054] (the Franka finger mesh). The pad's high-priority
    contact (friction, torsional friction, stiff solref) is what holds a grasped box;
    the rest of the finger only needs to push things.
    """
    for geom in finger.geoms:
        geom.contype = geom.conaffinity = 0
    common = dict(type=mujoco.mjtGeom.mjGEOM_BOX, contype=ROBOT_CONTYPE, conaffinity=ROBOT_CONAFFINITY,
                  group=HIDDEN_GROUP, rgba=[0.9, 0.2, 0.9, 0.5])
    finger.add_geom(name=f"{finger.name}_pad", pos=[0, 0.005, 0.045], size=[0.0085, 0.005, 0.009],
                    friction=[friction, 0.02, 0.0001], condim=4, priority=1,
                    solref=[0.01, 1.0], solimp=[0.95, 0.99, 0.001, 0.5, 2], **common)
    finger.add_geom(name=f"{finger.name}_body", pos=[0, 0.019, 0.018], size=[0.0105, 0.007, 0.018],
                    **common)


def _use_light_meshes(robot: mujoco.MjSpec, tol: float) -> None:
    """Swap OBJ visuals for decimated copies; collide with the exact hull of the original."""
    base = Path(robot.modelfiledir) / (robot.meshdir or "")
    texture = next((Path(robot.modelfiledir) / (robot.texturedir or "") / t.file
                    for t in robot.textures if t.file), None)
    hulls = {}
    for mesh in list(robot.meshes):
        src = Path(mesh.file) if Path(mesh.file).is_absolute() else base / mesh.file
        if src.suffix.lower() != ".obj":
            continue  # STL/MSH visuals stay as they are
        visual, hull = meshes.light_mesh_files(src, tol, texture)
        mesh.file = str(visual)
        hull_mesh = robot.add_mesh(name=f"{mesh.name}_hull", file=str(hull))
        hull_mesh.scale = mesh.scale
        hulls[mesh.name] = hull_mesh.name
    for geom in list(robot.geoms):
        if geom.type != mujoco.mjtGeom.mjGEOM_MESH or geom.meshname not in hulls:
            continue
        if geom.contype or geom.conaffinity:
            geom.parent.add_geom(type=mujoco.mjtGeom.mjGEOM_MESH, meshname=hulls[geom.meshname],
                                 pos=geom.pos, quat=geom.quat, contype=geom.contype,
                                 conaffinity=geom.conaffinity, friction=geom.friction,
                                 group=HIDDEN_GROUP, rgba=[0.5, 0.5, 0.5, 0.3])
            geom.contype = geom.conaffinity = 0


def _add_robot_control(s: mujoco.MjSpec, r: RobotSpec) -> None:
    """Position servos on the 7 joints and a coupled, force-limited gripper."""
    P = ROBOT_PREFIX
    for i in range(7):
        joint = s.joint(f"{P}joint{i + 1}")
        kp, kv = r.arm_kp[i], r.arm_kv[i]
        s.add_actuator(name=ARM_ACTUATORS[i], trntype=mujoco.mjtTrn.mjTRN_JOINT, target=joint.name,
                       gainprm=[kp] + [0] * 9, biastype=mujoco.mjtBias.mjBIAS_AFFINE,
                       biasprm=[0, -kp, -kv] + [0] * 7, ctrlrange=joint.range, ctrllimited=1,
                       forcerange=[-r.arm_torque_limit[i], r.arm_torque_limit[i]], forcelimited=1)
    f1, f2 = f"{P}finger_joint1", f"{P}finger_joint2"
    s.add_equality(name=f"{P}finger_coupling", type=mujoco.mjtEq.mjEQ_JOINT, name1=f1, name2=f2,
                   solref=[0.005, 1.0], solimp=[0.95, 0.99, 0.001, 0.5, 2])
    tendon = s.add_tendon(name=f"{P}gripper")
    tendon.wrap_joint(f1, 0.5)
    tendon.wrap_joint(f2, 0.5)
    # Force on the tendon F pushes each finger with F/2, so F = 2 x squeeze force.
    # Servo: F = kp * (cmd * travel - L), saturating 1 cm before the target; the damping
    # is the fingers' own (see FINGER_DAMPING).
    fmax = 2.0 * r.gripper_force
    kp = fmax / 0.01
    s.add_actuator(name=GRIPPER_ACTUATOR, trntype=mujoco.mjtTrn.mjTRN_TENDON, target=tendon.name,
                   gainprm=[kp * FINGER_TRAVEL] + [0] * 9, biastype=mujoco.mjtBias.mjBIAS_AFFINE,
                   biasprm=[0, -kp, 0] + [0] * 7, ctrlrange=[0, 1], ctrllimited=1,
                   forcerange=[-fmax, fmax], forcelimited=1)


# ---------------------------------------------------------------- labels


def geom_labels(model: mujoco.MjModel) -> np.ndarray:
    """(ngeom,) segmentation label per geom: 0 background, 1 robot, 2 + i object i (CONTRACTS.md)."""
    labels = np.zeros(model.ngeom, dtype=np.int32)
    object_bodies = [b for b in range(model.nbody) if model.body(b).name.startswith(OBJECT_PREFIX)]
    body_label = np.zeros(model.nbody, dtype=np.int32)
    for b in range(model.nbody):
        if model.body(b).name.startswith(ROBOT_PREFIX):
            body_label[b] = 1
    for i, b in enumerate(object_bodies):  # body ids follow the spec's object order
        body_label[b] = 2 + i
    labels[:] = body_label[model.geom_bodyid]
    return labels


# ---------------------------------------------------------------- the scene


class Scene:
    """A compiled cell: model, data, and the robot/object interface of CONTRACTS.md."""

    n_arm = 7

    def __init__(self, spec: SceneSpec | str | Path, mjspec: mujoco.MjSpec | None = None):
        self.spec = load_scene_spec(spec) if isinstance(spec, (str, Path)) else spec
        self.mjspec = mjspec if mjspec is not None else build_mjspec(self.spec)
        self.model = self.mjspec.compile()
        self.data = mujoco.MjData(self.model)
        m = self.model
        self.arm_actuators = np.array([m.actuator(n).id for n in ARM_ACTUATORS])
        self.gripper_actuator = m.actuator(GRIPPER_ACTUATOR).id
        self.arm_joints = m.actuator_trnid[self.arm_actuators, 0].copy()
        self.arm_qadr = m.jnt_qposadr[self.arm_joints].copy()
        self.arm_dofadr = m.jnt_dofadr[self.arm_joints].copy()
        self.arm_range = m.jnt_range[self.arm_joints].copy()
        fingers = [m.joint(f"{ROBOT_PREFIX}finger_joint{i}").id for i in (1, 2)]
        self.finger_qadr = m.jnt_qposadr[fingers].copy()
        self.finger_dofadr = m.jnt_dofadr[fingers].copy()
        self.tcp_site = m.site(TCP_SITE).id
        self.object_names = [o.name for o in self.spec.objects]
        self._object_qadr = {n: m.jnt_qposadr[m.joint(OBJECT_PREFIX + n).id] for n in self.object_names}
        self._object_dofadr = {n: m.jnt_dofadr[m.joint(OBJECT_PREFIX + n).id] for n in self.object_names}
        self.scratch_data = mujoco.MjData(m)  # for IK and other what-ifs; never rendered
        self.reset()

    @property
    def control_dt(self) -> float:
        return self.model.opt.timestep * self.spec.physics.substeps

    def reset(self, arm_qpos=None, gripper: float | None = None, object_poses: dict | None = None) -> None:
        """Back to the spec's initial state (or the given one), at rest, servos holding it.

        ``gripper`` is a command in [0, 1] (1 = open; default: the spec's init_gripper);
        ``object_poses`` maps names to ``(pos, quat)`` or just ``pos``.
        """
        mujoco.mj_resetData(self.model, self.data)
        q = self.spec.robot.init_qpos if arm_qpos is None else arm_qpos
        gripper = self.spec.robot.init_gripper if gripper is None else gripper
        for o in self.spec.objects:
            z = o.pos[2] if len(o.pos) == 3 else o.half_height
            self._write_object(o.name, [o.pos[0], o.pos[1], z], yaw_quat(o.yaw))
        for name, pose in (object_poses or {}).items():
            pos, quat = pose if isinstance(pose, (tuple, list)) and len(pose) == 2 else (pose, None)
            self._write_object(name, pos, quat)
        self.set_robot_qpos(q, float(np.clip(gripper, 0, 1)) * 2 * FINGER_TRAVEL)

    def set_robot_qpos(self, q7, gripper_width: float) -> None:
        """Place the robot kinematically (zero velocity) and make the servos hold it."""
        q7 = np.asarray(q7, dtype=np.float64)
        if q7.shape != (7,):
            raise ValueError(f"set_robot_qpos: expected 7 joint positions, got shape {q7.shape}")
        half = float(np.clip(gripper_width / 2, 0.0, FINGER_TRAVEL))
        self.data.qpos[self.arm_qadr] = q7
        self.data.qpos[self.finger_qadr] = half
        self.data.qvel[self.arm_dofadr] = 0
        self.data.qvel[self.finger_dofadr] = 0
        self.data.ctrl[self.arm_actuators] = q7
        self.data.ctrl[self.gripper_actuator] = half / FINGER_TRAVEL
        mujoco.mj_forward(self.model, self.data)

    def step(self, action, n_substeps: int | None = None) -> np.ndarray:
        """Apply action (8,) for one control step; returns the new state (8,)."""
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (8,):
            raise ValueError(f"Scene.step: expected action of shape (8,), got {a.shape}")
        self.data.ctrl[self.arm_actuators] = a[:7]
        self.data.ctrl[self.gripper_actuator] = np.clip(a[7], 0.0, 1.0)
        mujoco.mj_step(self.model, self.data, nstep=n_substeps or self.spec.physics.substeps)
        mujoco.mj_forward(self.model, self.data)  # poses for rendering match the new qpos
        return self.get_state()

    def get_state(self) -> np.ndarray:
        """7 joint positions + gripper opening width (m)."""
        q = self.data.qpos
        return np.concatenate([q[self.arm_qadr], [q[self.finger_qadr].sum()]])

    def object_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        adr = self._adr(name)
        return self.data.qpos[adr:adr + 3].copy(), self.data.qpos[adr + 3:adr + 7].copy()

    def set_object_pose(self, name: str, pos, quat=None) -> None:
        self._write_object(name, pos, quat)
        mujoco.mj_forward(self.model, self.data)

    def tcp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """TCP position and quaternion (w, x, y, z); its z axis points out of the fingers."""
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, self.data.site_xmat[self.tcp_site])
        return self.data.site_xpos[self.tcp_site].copy(), quat

    def _adr(self, name: str) -> int:
        if name not in self._object_qadr:
            raise KeyError(f"no object {name!r}; the scene has {self.object_names}")
        return self._object_qadr[name]

    def _write_object(self, name: str, pos, quat=None) -> None:
        adr = self._adr(name)
        self.data.qpos[adr:adr + 3] = pos
        if quat is not None:
            q = np.asarray(quat, dtype=np.float64)
            self.data.qpos[adr + 3:adr + 7] = q / np.linalg.norm(q)
        dof = self._object_dofadr[name]
        self.data.qvel[dof:dof + 6] = 0
