"""comsim.sim: specs, camera conversion, scene physics (servos, grasp, push), rendering, IK.

Real MuJoCo and real EGL rendering throughout. The first run builds the light meshes
into the cache (~5 s); later runs reuse them.
"""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

from pathlib import Path  # noqa: E402

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy import ndimage  # noqa: E402
import yaml  # noqa: E402

from comsim.config import ConfigError  # noqa: E402
from comsim.sim.camera import as_K, look_at, opencv_to_mujoco, project_points, scale_K  # noqa: E402
from comsim.sim.ik import solve_ik, top_down_quat  # noqa: E402
from comsim.sim.render import SceneRenderer  # noqa: E402
from comsim.sim.scene import MARKER_PREFIX, MARKER_TOP_Z, Scene, build_mjspec  # noqa: E402
from comsim.sim.spec import load_scene_spec, panda_assets_dir, scene_spec_from_dict, spec_hash  # noqa: E402

CELL = Path(__file__).resolve().parents[1] / "configs" / "twin" / "panda_cell.yaml"
AWAY = [1.9, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]  # arm turned away from the workspace


def cell_dict() -> dict:
    return yaml.safe_load(CELL.read_text())


def write_yaml(tmp_path: Path, data: dict, name: str = "cell.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def run_to(scene: Scene, q, grip: float, steps: int) -> None:
    """Linear joint-space motion to q over `steps` control steps."""
    q0 = scene.get_state()[:7]
    for i in range(1, steps + 1):
        scene.step(np.concatenate([q0 + (np.asarray(q) - q0) * i / steps, [grip]]))


# ---------------------------------------------------------------- specs


def test_default_cell_spec_and_hash():
    spec = load_scene_spec(CELL)
    assert [o.name for o in spec.objects] == ["red_cube", "blue_cube"]
    assert spec.cameras[0].width == 128 and spec.physics.integrator == "implicitfast"
    assert spec_hash(spec) == spec_hash(load_scene_spec(CELL))
    assert spec_hash(spec) != spec_hash(load_scene_spec(CELL, ["table.friction=0.9"]))


def _bad(data_edit):
    d = cell_dict()
    data_edit(d)
    return d


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["cameras"][0].update(fov=60), ["cameras[0]", "unknown key", "fov"]),
    (lambda d: d["robot"].update(colour="red"), ["robot", "unknown key", "colour"]),
    (lambda d: d["cameras"][0].update(T_cam_from_base=np.eye(4)[:3].tolist()),
     ["cameras[0].T_cam_from_base", "4x4 rigid transform"]),
    (lambda d: d["cameras"][0].update(T_cam_from_base=(2 * np.eye(4)).tolist()),
     ["cameras[0].T_cam_from_base", "rigid"]),
    (lambda d: d["cameras"][0].update(K=[100, 100, 64, 64, 1]), ["cameras[0].K", "[fx, fy, cx, cy]"]),
    (lambda d: d["objects"][1].update(shape="sphere"), ["objects[1].shape", "sphere"]),
    (lambda d: d["objects"][0].update(size=[0.05, 0.05]), ["objects[0].size", "expected 3"]),
    (lambda d: d["robot"].update(init_qpos=[0.0] * 6), ["robot.init_qpos", "expected 7"]),
    (lambda d: d["robot"].update(mjcf="no/such/robot.xml"), ["robot.mjcf", "robot.xml", "not found"]),
    (lambda d: d["objects"][1].update(name="red_cube"), ["objects[1].name", "duplicate object name"]),
    (lambda d: d.update(markers=[{"name": "t", "pos": [0.5, 0]}, {"name": "t", "pos": [0.4, 0]}]),
     ["markers[1].name", "duplicate marker name"]),
    (lambda d: d.update(markers=[{"name": "t", "pos": [0.5]}]), ["markers[0].pos", "expected 2"]),
])
def test_bad_specs_fail_with_file_and_key(tmp_path, edit, expected):
    path = write_yaml(tmp_path, _bad(edit))
    with pytest.raises(ConfigError) as e:
        load_scene_spec(path)
    msg = str(e.value)
    assert "cell.yaml" in msg, msg
    for part in expected:
        assert part in msg, msg


def test_a_spec_starts_from_its_base_and_changes_some_keys(tmp_path):
    """``base:``: mappings merge key by key, lists replace; the shipped push cell is the nominal cell
    and its target sticker; a base that is missing or leads back to itself is an error naming the file."""
    push = load_scene_spec(CELL.parent / "panda_cell_push.yaml")
    cell = load_scene_spec(CELL)
    assert push.cameras == cell.cameras and push.objects == cell.objects and push.table == cell.table
    assert [(m.name, m.pos, m.radius) for m in push.markers] == [("push_target", [0.5, 0.12], 0.04)]
    assert cell.markers == [] and spec_hash(push) != spec_hash(cell)
    write_yaml(tmp_path, cell_dict())
    child = tmp_path / "child.yaml"
    child.write_text("base: cell.yaml\ntable: {friction: 0.9}\nobjects: []\n")
    spec = load_scene_spec(child)
    assert spec.table.friction == 0.9 and spec.table.rgba == cell.table.rgba and spec.objects == []
    (tmp_path / "loop.yaml").write_text("base: child2.yaml\n")
    (tmp_path / "child2.yaml").write_text("base: loop.yaml\n")
    for path, words in ((tmp_path / "loop.yaml", ["loop.yaml", "base", "itself"]),
                        (write_yaml(tmp_path, {"base": "nowhere.yaml"}, "lost.yaml"), ["lost.yaml", "base",
                                                                                         "nowhere.yaml", "not found"])):
        with pytest.raises(ConfigError) as e:
            load_scene_spec(path)
        assert all(w in str(e.value) for w in words), str(e.value)
    # the base's own relative robot.mjcf is read from the base's folder, not the child's
    (tmp_path / "cells").mkdir()
    _panda_copy(tmp_path / "cells" / "robot")
    write_yaml(tmp_path / "cells", {**cell_dict(), "robot": {"mjcf": "robot/panda.xml"}})
    (tmp_path / "own_robot.yaml").write_text("base: cells/cell.yaml\n")
    assert Path(load_scene_spec(tmp_path / "own_robot.yaml").robot.mjcf).resolve() == (tmp_path / "cells" / "robot" / "panda.xml").resolve()


def test_a_marker_is_a_flat_disc_the_camera_sees_and_nothing_touches():
    """A marker draws its rgba where it lies on the table, is background in segmentation, and a cube
    set on it rests on the table top, not on the disc."""
    d = cell_dict()
    d["objects"] = [{"name": "red_cube", "shape": "box", "size": [0.05] * 3, "pos": [0.45, 0.05]}]
    d["markers"] = [{"name": "sticker", "pos": [0.45, 0.05], "radius": 0.06, "rgba": [0.1, 0.9, 0.2, 1.0]}]
    scene = Scene(scene_spec_from_dict(d))
    cam = scene.spec.cameras[0]
    with SceneRenderer(scene, "front") as r:
        rgb, seg = r.rgb(), r.segmentation()
    u, v = project_points(cam.K, cam.T_cam_from_base, [[0.488, 0.026, 0.0]])[0]  # on the disc, camera side of the cube
    px = rgb[int(round(v)), int(round(u))].astype(int)
    assert px[1] > px[0] + 60 and px[1] > px[2] + 60, px
    assert seg[int(round(v)), int(round(u))] == 0
    # its seen face is where the calibration takes the sticker's point of known place (calibrate.marker_face)
    geom = np.zeros(1, np.int32)
    depth = mujoco.mj_ray(scene.model, scene.data, np.array([0.488, 0.026, 0.5]), np.array([0.0, 0.0, -1.0]),
                          None, 1, -1, geom)
    assert scene.model.geom(int(geom[0])).name.startswith(MARKER_PREFIX)
    assert abs(0.5 - depth - MARKER_TOP_Z) < 1e-9 and MARKER_TOP_Z > 0.0
    for _ in range(50):
        scene.step(np.concatenate([scene.get_state()[:7], [1.0]]))
    assert abs(scene.object_pose("red_cube")[0][2] - 0.025) < 1e-3
    with pytest.raises(ConfigError, match=r"markers\[0\]\.radius"):
        scene_spec_from_dict({**d, "markers": [{**d["markers"][0], "radius": 0}]})


def _panda_copy(folder: Path, skip: str | None = None) -> Path:
    """The built-in Panda as ONE MJCF (arm + hand) beside links to its meshes."""
    folder.mkdir(parents=True)
    src = panda_assets_dir()
    for f in src.iterdir():
        if f.name != skip:
            (folder / f.name).symlink_to(f)
    arm = mujoco.MjSpec.from_file(str(src / "panda.xml"))
    hand = mujoco.MjSpec.from_file(str(src / "panda_hand.xml"))
    hand.delete(hand.site("wrist_site"))
    arm.body("panda_link8").add_frame(quat=[0.92387953, 0, 0, -0.38268343]).attach_body(
        hand.body("panda_hand"), "hand_", "")
    xml = arm.to_xml()
    (folder / "panda.xml").unlink()
    (folder / "panda.xml").write_text(xml)
    return folder / "panda.xml"


def test_missing_mesh_fails_before_compiling(tmp_path):
    _panda_copy(tmp_path / "robot", skip="link3.obj")
    d = cell_dict()
    d["robot"] = {"mjcf": "robot/panda.xml"}
    with pytest.raises(ConfigError) as e:
        load_scene_spec(write_yaml(tmp_path, d))
    msg = str(e.value)
    assert "cell.yaml" in msg and "robot.mjcf" in msg and "link3.obj" in msg, msg


def test_robot_from_mjcf_and_menagerie_root(tmp_path, monkeypatch):
    _panda_copy(tmp_path / "franka_emika_panda")
    d = cell_dict()
    d["robot"] = {"menagerie": "franka_emika_panda"}
    path = write_yaml(tmp_path, d)
    monkeypatch.delenv("MENAGERIE_ROOT", raising=False)
    with pytest.raises(ConfigError, match="robot.menagerie.*MENAGERIE_ROOT"):
        load_scene_spec(path)
    monkeypatch.setenv("MENAGERIE_ROOT", str(tmp_path))
    scene = Scene(load_scene_spec(path))
    assert scene.get_state().shape == (8,)
    d["robot"] = {"mjcf": "franka_emika_panda/panda.xml"}
    scene2 = Scene(load_scene_spec(write_yaml(tmp_path, d)))
    np.testing.assert_allclose(scene.tcp_pose()[0], scene2.tcp_pose()[0], atol=1e-9)


# ---------------------------------------------------------------- camera


def test_camera_projection_matches_opencv_with_offcentre_principal_point():
    W, H = 320, 240
    K = [260.0, 270.0, W / 2 + 41.3, H / 2 - 27.6]  # principal point well off-centre
    T = look_at([1.0, -0.45, 0.55], [0.45, 0.0, 0.1])
    probes = [[0.45, 0.0, 0.1], [0.6, 0.2, 0.3], [0.3, -0.2, 0.05], [0.7, -0.1, 0.2]]
    d = {"cameras": [{"name": "cam", "width": W, "height": H, "K": K, "T_cam_from_base": T.tolist()}],
         "objects": [{"name": f"p{i}", "size": [0.008] * 3, "pos": p} for i, p in enumerate(probes)],
         "robot": {"init_qpos": AWAY}}
    scene = Scene(scene_spec_from_dict(d))
    with SceneRenderer(scene, "cam") as r:
        seg = r.segmentation()
    expected = project_points(K, T, probes)
    for i, uv in enumerate(expected):
        ys, xs = np.nonzero(seg == 2 + i)
        assert len(xs) > 4, f"probe {i} not visible"
        assert abs(xs.mean() - uv[0]) < 1.0 and abs(ys.mean() - uv[1]) < 1.0, (i, xs.mean(), ys.mean(), uv)
    # A principal point on the wrong side would be off by 2 x 41 px: the sign matters.
    p = opencv_to_mujoco(K, T, W, H)
    assert p.principal_pixel[0] < 0 < p.principal_pixel[1]


def test_K_forms_and_scaling():
    K = [110.0, 110.0, 63.5, 63.5]
    np.testing.assert_allclose(as_K([[110, 0, 63.5], [0, 110, 63.5], [0, 0, 1]]), K)
    np.testing.assert_allclose(scale_K(K, 128, 128, 256, 256), [220, 220, 127.5, 127.5])
    with pytest.raises(ValueError, match="skew"):
        as_K([[110, 1, 63.5], [0, 110, 63.5], [0, 0, 1]])


# ---------------------------------------------------------------- rendering


def test_rgb_segmentation_depth_of_the_cell():
    scene = Scene(load_scene_spec(CELL))
    cam = scene.spec.cameras[0]
    with SceneRenderer(scene, "front") as r:
        rgb, seg, depth = r.rgb(), r.segmentation(), r.depth()
    assert rgb.shape == (128, 128, 3) and rgb.dtype == np.uint8
    assert seg.dtype == np.int32 and set(np.unique(seg)) == {0, 1, 2, 3}
    red = rgb[seg == 2].mean(axis=0)
    blue = rgb[seg == 3].mean(axis=0)
    assert red[0] > 2 * red[2] and blue[2] > 2 * blue[0], (red, blue)
    # The cube centre projects onto its own label.
    u, v = project_points(cam.K, cam.T_cam_from_base, [scene.object_pose("red_cube")[0]])[0]
    assert seg[int(round(v)), int(round(u))] == 2
    # Depth of the table top: intersect each table pixel's ray with the plane z = 0.
    fx, fy, cx, cy = cam.K
    T = np.asarray(cam.T_cam_from_base)
    R_base_from_cam, centre = T[:3, :3].T, -T[:3, :3].T @ T[:3, 3]
    vs, us = np.nonzero(seg == 0)
    rays = np.stack([(us - cx) / fx, (vs - cy) / fy, np.ones_like(us, dtype=float)], 1) @ R_base_from_cam.T
    z_cam = -centre[2] / rays[:, 2]  # ray (z_cam = 1 per unit) hits z = 0 at this optical depth
    on_table = (z_cam > 0) & (depth[vs, us] < 3)
    hit = centre + rays * z_cam[:, None]
    on_table &= (np.abs(hit[:, 0] - 0.4) < 0.55) & (np.abs(hit[:, 1]) < 0.35)
    assert on_table.sum() > 500
    np.testing.assert_allclose(depth[vs, us][on_table], z_cam[on_table], atol=1e-3)


def test_surface_normals_from_the_cells_depth():
    """Normals derived from a MuJoCo depth render (the ``normal`` control video): on the table top they are the
    table's up axis seen from the camera, they face the camera, and they survive the uint8 encoding."""
    from comsim.twin.camera_model import normal_to_rgb, normals_from_depth

    scene = Scene(load_scene_spec(CELL))
    cam = scene.spec.cameras[0]
    with SceneRenderer(scene, "front") as r:
        seg, depth = r.segmentation(), r.depth()
    n = normals_from_depth(depth, cam.K)
    assert n.shape == (128, 128, 3) and n.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1.0, atol=1e-4)
    up_in_cam = np.asarray(cam.T_cam_from_base)[:3, :3] @ [0.0, 0.0, 1.0]
    inner = np.zeros_like(seg, bool)
    inner[100:128, 40:100] = True  # the near table top, away from its far edge and the walls behind it
    table = inner & ~ndimage.binary_dilation(seg != 0, iterations=2)  # central differences straddle object edges
    assert table.sum() > 1000
    assert np.degrees(np.arccos(np.clip(n[table] @ up_in_cam, -1, 1))).max() < 1.0
    robot = seg == 1
    assert (n[robot] @ up_in_cam < 0.9).mean() > 0.5  # the arm's surfaces point every way
    fx, fy, cx, cy = cam.K
    v, u = np.mgrid[0:128, 0:128]
    rays = np.stack([(u - cx) / fx, (v - cy) / fy, np.ones((128, 128))], -1)
    assert ((n * rays).sum(-1) <= 1e-6).all()  # every normal faces the camera
    decoded = normal_to_rgb(n).astype(np.float32) / 127.5 - 1.0
    assert np.abs(decoded - n).max() < 1 / 127


def test_renderer_size_and_errors():
    scene = Scene(load_scene_spec(CELL))
    with SceneRenderer(scene, "front", 256, 256) as r:
        assert r.rgb().shape == (256, 256, 3)
    with pytest.raises(ValueError, match="aspect"):
        SceneRenderer(scene, "front", 256, 128)
    with pytest.raises(ValueError, match="no camera"):
        SceneRenderer(scene, "nope")
    r = SceneRenderer(scene.model, "front")
    assert r.rgb(scene.data).shape == (128, 128, 3)
    r.close()
    with pytest.raises(RuntimeError):
        r.rgb(scene.data)


def test_mjspec_can_be_edited_before_compiling():
    """The lab's route: add textures, materials, lights and props, then compile."""
    spec = load_scene_spec(CELL)
    ms = build_mjspec(spec)
    ms.add_texture(name="grain", type=mujoco.mjtTexture.mjTEXTURE_2D, builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER,
                   width=64, height=64, rgb1=[0.6, 0.5, 0.4], rgb2=[0.5, 0.4, 0.3])
    ms.add_material(name="wood", textures=["", "grain"], texrepeat=[8, 8])
    ms.geom("table").material = "wood"
    ms.worldbody.add_light(pos=[0.5, 0.5, 1.5], dir=[0, 0, -1], castshadow=True)
    ms.worldbody.add_geom(name="prop", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.04, 0.04, 0.04],
                          pos=[0.3, -0.25, 0.04], rgba=[0.1, 0.9, 0.1, 1])
    scene = Scene(spec, mjspec=ms)
    with SceneRenderer(scene, "front") as r:
        rgb, seg = r.rgb(), r.segmentation()
    cam = spec.cameras[0]
    u, v = np.round(project_points(cam.K, cam.T_cam_from_base, [[0.3, -0.25, 0.04]])[0]).astype(int)
    assert seg[v, u] == 0  # props are background for the contract's labels
    assert rgb[v, u, 1] > 2 * rgb[v, u, 0], rgb[v, u]
    assert set(np.unique(seg)) == {0, 1, 2, 3}


def _collision_boxes(scene: Scene) -> np.ndarray:
    """World-frame bounding boxes of the robot's colliding mesh geoms, in body order."""
    m, d = scene.model, scene.data
    boxes = []
    for g in range(m.ngeom):
        if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and (m.geom_contype[g] or m.geom_conaffinity[g]):
            mesh = m.geom_dataid[g]
            v = m.mesh_vert[m.mesh_vertadr[mesh]:m.mesh_vertadr[mesh] + m.mesh_vertnum[mesh]]
            v = v @ d.geom_xmat[g].reshape(3, 3).T + d.geom_xpos[g]
            boxes.append(np.concatenate([v.min(0), v.max(0)]))
    return np.array(boxes)


def test_light_meshes_keep_the_silhouette_and_the_collisions():
    d = cell_dict()
    K = [560.0, 560.0, 319.5, 239.5]
    T = look_at([0.9, -0.55, 0.75], [0.3, 0.0, 0.35])
    d["cameras"] = [{"name": "big", "width": 640, "height": 480, "K": K, "T_cam_from_base": T.tolist()}]
    d["robot"]["init_qpos"] = [0.3, -0.2, 0.1, -2.1, 0.1, 2.0, 0.5]
    masks, faces, boxes = {}, {}, {}
    for visual in ("light", "full"):
        d["robot"]["visual"] = visual
        scene = Scene(scene_spec_from_dict(d))
        faces[visual] = int(scene.model.mesh_facenum.sum())
        boxes[visual] = _collision_boxes(scene)
        with SceneRenderer(scene, "big") as r:
            masks[visual] = r.segmentation() == 1
    light, full = masks["light"], masks["full"]
    iou = (light & full).sum() / (light | full).sum()
    assert full.sum() > 20000, "the robot should fill a good part of the image"
    assert iou >= 0.97, iou  # measured 0.996
    assert faces["light"] < faces["full"] / 2
    # Light visuals collide with the exact hull of the original meshes: same physics.
    assert len(boxes["light"]) == len(boxes["full"]) == 9  # link0-7 + hand
    np.testing.assert_allclose(boxes["light"], boxes["full"], atol=1e-6)


# ---------------------------------------------------------------- physics and control


def test_servos_track_and_state_vector():
    scene = Scene(load_scene_spec(CELL))
    s = scene.get_state()
    assert s.shape == (8,) and s[7] == pytest.approx(0.08)
    target = np.array([0.3, -0.3, 0.2, -2.0, 0.1, 1.9, 0.5])
    for _ in range(50):  # 1 s
        scene.step(np.concatenate([target, [0.5]]))
    s = scene.get_state()
    assert np.abs(s[:7] - target).max() < 1e-2
    assert s[7] == pytest.approx(0.04, abs=2e-3)  # command 0.5 -> half open
    assert scene.control_dt == pytest.approx(0.02)


def test_reset_and_object_poses():
    scene = Scene(load_scene_spec(CELL))
    pos, quat = scene.object_pose("red_cube")
    np.testing.assert_allclose(pos, [0.5, -0.12, 0.025])
    scene.set_object_pose("red_cube", [0.3, 0.1, 0.2], [1, 0, 0, 0])
    np.testing.assert_allclose(scene.object_pose("red_cube")[0], [0.3, 0.1, 0.2])
    for _ in range(25):
        scene.step(np.concatenate([scene.spec.robot.init_qpos, [1.0]]))
    assert scene.object_pose("red_cube")[0][2] == pytest.approx(0.025, abs=2e-3)  # fell onto the table
    scene.reset(object_poses={"blue_cube": [0.6, 0.0, 0.025]})
    np.testing.assert_allclose(scene.object_pose("red_cube")[0], [0.5, -0.12, 0.025])
    np.testing.assert_allclose(scene.object_pose("blue_cube")[0], [0.6, 0.0, 0.025])
    with pytest.raises(KeyError, match="red_cube"):
        scene.object_pose("green_cube")


def test_ik_reaches_top_down_targets_within_limits():
    scene = Scene(load_scene_spec(CELL))
    for pos, yaw in [([0.5, -0.12, 0.03], 0.3), ([0.35, 0.25, 0.2], -1.0), ([0.65, 0.0, 0.1], 0.0)]:
        res = solve_ik(scene, pos, top_down_quat(yaw))
        assert res.converged and res.pos_err < 1e-3 and res.rot_err < 1e-2, res
        lo, hi = scene.arm_range.T
        assert np.all(res.q >= lo) and np.all(res.q <= hi)
        scene.set_robot_qpos(res.q, 0.08)
        tcp_pos, tcp_quat = scene.tcp_pose()
        np.testing.assert_allclose(tcp_pos, pos, atol=1e-3)
        assert abs(abs(np.dot(tcp_quat, top_down_quat(yaw))) - 1) < 1e-4


def test_scripted_grasp_lift_and_carry():
    scene = Scene(load_scene_spec(CELL))
    start, _ = scene.object_pose("red_cube")
    down = top_down_quat(0.3)  # the cube's yaw: fingers close on two opposite faces
    above = solve_ik(scene, start + [0, 0, 0.10], down).q
    run_to(scene, above, 1.0, 50)
    at = solve_ik(scene, start, down, q_init=above).q
    run_to(scene, at, 1.0, 40)
    run_to(scene, at, 0.0, 30)  # close
    width = scene.get_state()[7]
    assert 0.045 < width < 0.05, width  # stopped by the 5 cm cube, not squeezed through
    offset = scene.object_pose("red_cube")[0] - scene.tcp_pose()[0]
    lift = solve_ik(scene, start + [0, 0, 0.12], down, q_init=at).q
    run_to(scene, lift, 0.0, 40)
    run_to(scene, lift, 0.0, 10)  # the servos lag a moving target by a few mm
    lifted = scene.object_pose("red_cube")[0]
    assert lifted[2] > start[2] + 0.10, lifted
    carry = solve_ik(scene, [0.35, 0.2, 0.2], top_down_quat(1.0), q_init=lift).q
    run_to(scene, carry, 0.0, 40)  # 0.8 s, turning the wrist on the way
    for _ in range(10):
        scene.step(np.concatenate([carry, [0.0]]))
    slip = np.linalg.norm(scene.object_pose("red_cube")[0] - scene.tcp_pose()[0]) - np.linalg.norm(offset)
    assert abs(slip) < 0.01, slip
    assert scene.object_pose("red_cube")[0][2] > 0.15


def test_push_slides_the_cube_along_the_table():
    scene = Scene(load_scene_spec(CELL))
    start, _ = scene.object_pose("red_cube")
    yaw = 0.3
    d = np.array([np.cos(yaw), np.sin(yaw), 0.0])
    down = top_down_quat(yaw)  # fingers close across the push: both push side by side
    behind = start - 0.07 * d  # TCP at the cube's mid-height, 7 cm behind its centre
    q = solve_ik(scene, behind + [0, 0, 0.1], down).q
    run_to(scene, q, 0.0, 40)
    q = solve_ik(scene, behind, down, q_init=q).q
    run_to(scene, q, 0.0, 30)
    max_z = 0.0
    for i in range(1, 21):  # 15 cm in 2 s
        q = solve_ik(scene, behind + d * 0.0075 * i, down, q_init=q).q
        run_to(scene, q, 0.0, 5)
        max_z = max(max_z, scene.object_pose("red_cube")[0][2])
    end, quat = scene.object_pose("red_cube")
    moved = np.dot(end - start, d)
    # Contact starts when the finger front (1.05 cm ahead of the TCP) meets the face 2.5 cm
    # ahead of the centre: 15 - (7 - 3.55) = 11.55 cm of pushing.
    assert 0.10 < moved < 0.13, moved
    assert max_z < 0.03, max_z  # slid, did not fly or climb
    assert abs(end[2] - 0.025) < 3e-3


_RENDER_THEN_IMPORT_TRANSLATOR = """
import sys
from comsim.sim import Scene, SceneRenderer, load_scene_spec
scene = Scene(load_scene_spec(sys.argv[1]))
with SceneRenderer(scene, "front") as r:
    before = r.rgb().mean()
    import comsim.translator.pipeline  # noqa: F401  (diffusers, torch and, where installed, triton)
    import comsim.translator.training  # noqa: F401
    after = r.rgb().mean()
print(before == after)
"""


def test_translator_can_be_imported_after_mujoco_has_rendered():
    # The demo renders the lab, then trains the translator in the same process: Triton's LLVM
    # loaded after Mesa's GL context used to kill the process with a segfault.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _RENDER_THEN_IMPORT_TRANSLATOR, str(CELL)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "MUJOCO_GL": "egl"})
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.strip().endswith("True")
