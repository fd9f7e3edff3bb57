"""Malformed inputs, as a new user would hand them over, across every kind the CLI reads.

Each case builds one bad input (scene/task YAML, lab cell, experiment, translator config or
folder, LeRobot dataset, calibration folder, output path) next to good shared fixtures, runs
the command in-process, and asserts: exit code 2, a one-line message on stderr that names
the file, no traceback, and nothing written or changed anywhere under the test folders.

The inputs are tiny (4-frame 32x32 datasets made with the library's own writer, a micro
translator saved with ``save_pretrained``) so the whole file runs in well under a minute.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from comsim import cli
from comsim.episode import Episode, Provenance
from comsim.io.lerobot import DatasetError, DatasetWriter, LeRobotDataset

ROOT = Path(__file__).resolve().parents[1]
SCENE = ROOT / "configs" / "twin" / "panda_cell.yaml"
LAB = ROOT / "configs" / "lab" / "default.yaml"
TINY = ROOT / "configs" / "translator" / "tiny.yaml"
EYE = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0.5], [0, 0, 0, 1]]

from test_convert import SHORT_TASK as TASK  # noqa: E402  (a valid reach task to break one field of)


# ----------------------------------------------------------------------------- shared fixtures


def sim_episode(seed: int, T: int = 4, cams=("front_sim",), size: int = 32) -> Episode:
    rng = np.random.default_rng(seed)
    frames = {c: rng.integers(0, 255, (T, size, size, 3), dtype=np.uint8) for c in cams}
    return Episode(frames=frames, action=rng.normal(size=(T, 8)).astype(np.float32),
                   state=rng.normal(size=(T, 8)).astype(np.float32), fps=10, task="reach",
                   provenance=Provenance(source="sim", task="reach", seed=seed))


def write_sim(root: Path, n: int = 2, **kw) -> Path:
    with DatasetWriter(root, 10) as w:
        for i in range(n):
            w.add_episode(sim_episode(i, **kw))
    return root


def save_micro_translator(path: Path) -> Path:
    from comsim.config import from_dict
    from comsim.translator.codec import PixelCodec
    from comsim.translator.data import ActionNormalizer
    from comsim.translator.training import TranslatorConfig, build_model, make_pipeline

    torch.manual_seed(0)
    cfg = from_dict(TranslatorConfig, {"model": {"dim": 32, "depth": 1, "heads": 2, "patch_size": [1, 8, 8]},
                                       "data": {"num_frames": 4, "resolution": [32, 32], "camera": "front"}})
    model = build_model(cfg, PixelCodec(), 8)
    return make_pipeline(cfg, model.eval(), PixelCodec(), ActionNormalizer(np.zeros(8), np.ones(8)),
                         fps=10).save_pretrained(path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    write_sim(root / "sim")
    write_sim(root / "real", cams=("front",))  # what a real robot's camera recorded
    write_sim(root / "paired", cams=("front", "front_sim"))  # a twin replay's pairs (translator training)
    save_micro_translator(root / "micro")
    (root / "task.yaml").write_text(TASK.format(scene=SCENE))
    return root


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def edit_json(path: Path, fn) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


def rewrite_column(ds_root: Path, name: str, fn) -> None:
    """Replace a column of every data file (the writer refuses such data, so it is made by hand)."""
    for f in sorted((ds_root / "data").rglob("*.parquet")):
        t = pq.read_table(f)
        x = np.stack(t[name].to_pylist()).astype(np.float32)
        fn(x)
        t = t.set_column(t.column_names.index(name), name,
                         pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1]))
        pq.write_table(t, f)


def scene_with(tmp: Path, **camera) -> Path:
    doc = yaml.safe_load(SCENE.read_text())
    doc["cameras"][0].update(camera)
    p = tmp / "scene.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def lab_with(tmp: Path, mutate) -> Path:
    doc = yaml.safe_load(LAB.read_text())
    mutate(doc)
    p = tmp / "cell.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def translator_cfg(tmp: Path, text: str | None = None, **over) -> Path:
    doc = yaml.safe_load(TINY.read_text())
    doc["train"]["output_dir"] = str(tmp / "runs")
    for dotted, v in over.items():
        node = doc
        *head, last = dotted.split("__")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = v
    p = tmp / "translator.yaml"
    p.write_text(text if text is not None else yaml.safe_dump(doc))
    return p


def experiment(tmp: Path, doc: dict | None = None, text: str | None = None) -> Path:
    p = tmp / "exp.yaml"
    p.write_text(text if text is not None else yaml.safe_dump(doc))
    return p


def calib_folder(tmp: Path, K=None, qpos="0 -0.785 0 -2.356 0 1.571 0.785", with_color=True) -> Path:
    import cv2

    d = tmp / "calib"
    for sub in ("color", "mask", "qpos"):
        (d / sub).mkdir(parents=True)
    if with_color:
        cv2.imwrite(str(d / "color" / "000000.png"), np.zeros((48, 64, 3), np.uint8))
        cv2.imwrite(str(d / "mask" / "000000.png"), np.zeros((48, 64), np.uint8))
        (d / "qpos" / "000000.txt").write_text(qpos)
    if K is not None:
        (d / "camera_intrinsics.json").write_text(json.dumps({"K": K, "width": 64, "height": 48}))
    else:
        (d / "K.txt").write_text("60 0 32\n0 60 24\n0 0 1\n")
    return d


# ----------------------------------------------------------------------------- the cases

CASES: dict[str, object] = {}


def case(kind: str):
    def register(fn):
        CASES[f"{kind}:{fn.__name__}"] = fn
        return fn
    return register


# Each case returns (program, argv, text the message must contain). program: comsim | train | eval_policy.

# -- scene YAML (generate --scene, twin replay --twin)
@case("scene")
def camera_name_escapes(t, s):
    sc = scene_with(t, name="../../escaped")
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--scene", str(sc), "--out", str(t / "out"),
                      "--episodes", "1", "--no-progress"], str(sc)


@case("scene")
def camera_name_absolute(t, s):
    sc = scene_with(t, name="/tmp/escaped")
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--scene", str(sc), "--out", str(t / "out"),
                      "--no-progress"], "cameras[0].name"


@case("scene")
def nan_in_T_cam_from_base(t, s):
    T = yaml.safe_load(SCENE.read_text())["cameras"][0]["T_cam_from_base"]
    T[0][0] = float("nan")
    sc = scene_with(t, T_cam_from_base=T)
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--scene", str(sc), "--out", str(t / "out"),
                      "--no-progress"], "T_cam_from_base"


@case("scene")
def K_as_mapping(t, s):
    sc = scene_with(t, K={"fx": 100, "fy": 100, "cx": 64, "cy": 64})
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(sc), "--out", str(t / "out")], \
        "cameras[0].K"


@case("scene")
def scene_not_a_mapping(t, s):
    sc = t / "scene.yaml"
    sc.write_text("- just\n- a list\n")
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(sc), "--out", str(t / "out")], str(sc)


@case("scene")
def scene_unknown_key(t, s):
    sc = t / "scene.yaml"
    sc.write_text(SCENE.read_text() + "\ncamras: []\n")
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(sc), "--out", str(t / "out")], str(sc)


# -- task YAML (generate)
@case("task")
def task_unknown_key(t, s):
    p = t / "task.yaml"
    p.write_text(TASK.format(scene=SCENE) + "colour: red\n")
    return "comsim", ["generate", "--task", str(p), "--out", str(t / "out"), "--no-progress"], str(p)


@case("task")
def task_python_tag(t, s):
    p = t / "task.yaml"
    p.write_text(TASK.format(scene=SCENE).replace('"Reach above the {cube.color} cube."',
                                                  "!!python/object/apply:os.system ['touch pwned']"))
    return "comsim", ["generate", "--task", str(p), "--out", str(t / "out"), "--no-progress"], str(p)


@case("task")
def task_missing_scene(t, s):
    p = t / "task.yaml"
    p.write_text(TASK.format(scene=t / "nowhere.yaml"))
    return "comsim", ["generate", "--task", str(p), "--out", str(t / "out"), "--no-progress"], "nowhere.yaml"


@case("task")
def task_file_missing(t, s):
    return "comsim", ["generate", "--task", str(t / "missing.yaml"), "--out", str(t / "out"), "--no-progress"], \
        "missing.yaml"


# -- lab cells (lab record --cell)
def _record(t, cell, *extra):
    return ["lab", "record", "--task", "push", "--episodes", "1", "--cell", str(cell), "--out", str(t / "out"),
            *extra]


@case("lab_cell")
def region_off_the_table(t, s):
    cell = lab_with(t, lambda d: d["tasks"]["push"]["regions"]["red_cube"].update(x=[1.5, 1.7]))
    return "comsim", _record(t, cell), "tasks.push.regions.red_cube.x"


@case("lab_cell")
def push_target_off_the_table(t, s):
    cell = lab_with(t, lambda d: d["tasks"]["push"].update(target=[0.5, 3.0]))
    return "comsim", _record(t, cell), "tasks.push.target"


@case("lab_cell")
def nan_speed(t, s):
    cell = lab_with(t, lambda d: d["operator"].update(nominal_speed=float("nan")))
    return "comsim", _record(t, cell), "operator.nominal_speed"


@case("lab_cell")
def lab_camera_name_with_slash(t, s):
    def mutate(d):
        d["scene"]["cameras"][0]["name"] = "front/../../x"
        d["camera"] = "front/../../x"
    return "comsim", _record(t, lab_with(t, mutate)), "scene.cameras[0].name"


@case("lab_cell")
def lab_unknown_key(t, s):
    cell = lab_with(t, lambda d: d.update(fsp=10))
    return "comsim", _record(t, cell), str(t / "cell.yaml")


@case("lab_cell")
def lab_fps_zero_flag(t, s):
    return "comsim", ["lab", "record", "--task", "push", "--episodes", "1", "--fps", "0", "--out", str(t / "out")], \
        "--fps"


# -- experiments (eval/eval_policy.py --experiment)
@case("experiment")
def experiment_all_datasets_missing(t, s):
    doc = {"name": "nothing", "task": "push", "output_dir": str(t / "exp_out"),
           "datasets": {"real": {"path": str(t / "no_real")}},
           "arms": [{"name": "real", "sources": [{"dataset": "real"}]}]}
    return "eval_policy", ["--experiment", str(experiment(t, doc))], "no_real"


@case("experiment")
def experiment_unknown_key(t, s):
    doc = {"name": "x", "task": "push", "output_dir": str(t / "exp_out"), "trian": {}}
    p = experiment(t, doc)
    return "eval_policy", ["--experiment", str(p)], str(p)


@case("experiment")
def experiment_not_yaml(t, s):
    p = experiment(t, text="name: [unclosed\n")
    return "eval_policy", ["--experiment", str(p)], str(p)


# -- translator training configs (train/train_translator.py)
@case("translator_config")
def config_unknown_key(t, s):
    p = translator_cfg(t, train__stepz=3)
    return "train", ["--config", str(p)], str(p)


@case("translator_config")
def config_nan_learning_rate(t, s):
    p = translator_cfg(t, train__learning_rate=float("nan"))
    return "train", ["--config", str(p)], "train.learning_rate"


@case("translator_config")
def config_wrong_type(t, s):
    p = translator_cfg(t, model__dim="wide")
    return "train", ["--config", str(p)], "model.dim"


@case("translator_config")
def config_missing(t, s):
    return "train", ["--config", str(t / "nope.yaml")], "nope.yaml"


@case("translator_config")
def config_bad_dropout(t, s):
    p = translator_cfg(t, train__p_drop_sim=1.5)
    return "train", ["--config", str(p)], str(p)


# -- translator folders (convert --model)
def _convert(t, s, model, inp=None, out=None, *extra):
    return ["convert", "--model", str(model), "--input", str(inp or s / "sim"), "--output", str(out or t / "out"),
            "--no-progress", "--steps", "1", *extra]


@case("translator_folder")
def model_without_translator_json(t, s):
    m = copy(s / "micro", t / "m")
    (m / "translator.json").unlink()
    return "comsim", _convert(t, s, m), str(m)


@case("translator_folder")
def translator_json_invalid(t, s):
    m = copy(s / "micro", t / "m")
    (m / "translator.json").write_text("{not json")
    return "comsim", _convert(t, s, m), str(m / "translator.json")


@case("translator_folder")
def translator_json_without_camera(t, s):
    m = copy(s / "micro", t / "m")
    edit_json(m / "translator.json", lambda d: d.pop("camera"))
    return "comsim", _convert(t, s, m), "camera"


@case("translator_folder")
def translator_camera_escapes(t, s):
    m = copy(s / "micro", t / "m")
    edit_json(m / "translator.json", lambda d: d.update(camera="../../front"))
    return "comsim", _convert(t, s, m), str(m / "translator.json")


@case("translator_folder")
def truncated_safetensors(t, s):
    m = copy(s / "micro", t / "m")
    w = m / "transformer" / "diffusion_pytorch_model.safetensors"
    w.write_bytes(w.read_bytes()[:200])
    return "comsim", _convert(t, s, m), str(m)


@case("translator_folder")
def missing_transformer_config(t, s):
    m = copy(s / "micro", t / "m")
    (m / "transformer" / "config.json").unlink()
    return "comsim", _convert(t, s, m), str(m)


@case("translator_folder")
def codec_names_a_hub_id(t, s):
    m = copy(s / "micro", t / "m")
    (m / "codec.json").write_text(json.dumps({"type": "diffusers_vae", "pretrained": "someone/some-vae"}))
    return "comsim", _convert(t, s, m), str(m / "codec.json")


@case("translator_folder")
def action_dim_mismatch(t, s):
    m = copy(s / "micro", t / "m")
    edit_json(m / "translator.json", lambda d: d.update(action_dim=7))
    return "comsim", _convert(t, s, m), "action_dim"


@case("dataset")
def info_fps_disagrees_with_videos(t, s):
    d = copy(s / "sim", t / "d")
    edit_json(d / "meta" / "info.json", lambda i: i.update(fps=30))
    return "comsim", _convert(t, s, s / "micro", d), "fps"


@case("translator_folder")
def fps_mismatch(t, s):
    m = copy(s / "micro", t / "m")
    edit_json(m / "translator.json", lambda d: d.update(fps=30))
    return "comsim", _convert(t, s, m), "fps"


# -- LeRobot datasets (convert --input, twin replay --real, eval video)
@case("dataset")
def video_key_escapes(t, s):
    d = copy(s / "sim", t / "d")
    edit_json(d / "meta" / "info.json",
              lambda i: i["features"].update({"../../escaped": i["features"].pop("observation.images.front_sim")}))
    return "comsim", _convert(t, s, s / "micro", d), str(d / "meta" / "info.json")


@case("dataset")
def data_path_absolute(t, s):
    d = copy(s / "sim", t / "d")
    outside = t / "elsewhere.parquet"
    shutil.copy(next((d / "data").rglob("*.parquet")), outside)
    edit_json(d / "meta" / "info.json", lambda i: i.update(data_path=str(outside)))
    return "comsim", _convert(t, s, s / "micro", d), "data_path"


@case("dataset")
def data_path_dotdot(t, s):
    d = copy(s / "sim", t / "d")
    edit_json(d / "meta" / "info.json", lambda i: i.update(data_path="../d/" + i["data_path"]))
    return "comsim", _convert(t, s, s / "micro", d), "data_path"


@case("dataset")
def video_path_template_broken(t, s):
    d = copy(s / "sim", t / "d")
    edit_json(d / "meta" / "info.json", lambda i: i.update(video_path="videos/{camera}/{nope}.mp4"))
    return "comsim", _convert(t, s, s / "micro", d), "video_path"


@case("dataset")
def videos_symlinked_outside(t, s):
    d = copy(s / "sim", t / "d")
    shutil.move(d / "videos", t / "videos_elsewhere")
    (d / "videos").symlink_to(t / "videos_elsewhere")
    return "comsim", _convert(t, s, s / "micro", d), "video_path"


@case("dataset")
def info_json_missing(t, s):
    d = copy(s / "sim", t / "d")
    (d / "meta" / "info.json").unlink()
    return "comsim", _convert(t, s, s / "micro", d), str(d / "meta" / "info.json")


@case("dataset")
def info_json_invalid(t, s):
    d = copy(s / "sim", t / "d")
    (d / "meta" / "info.json").write_text("{")
    return "comsim", ["eval", "video", "--pred", str(d), "--ref", str(s / "sim"), "--metrics", "psnr"], \
        str(d / "meta" / "info.json")


@case("dataset")
def corrupt_data_parquet(t, s):
    d = copy(s / "sim", t / "d")
    f = next((d / "data").rglob("*.parquet"))
    f.write_bytes(b"PAR1" + b"\0" * 64)
    return "comsim", _convert(t, s, s / "micro", d), str(f)


@case("dataset")
def corrupt_episodes_index(t, s):
    d = copy(s / "sim", t / "d")
    f = next((d / "meta" / "episodes").rglob("*.parquet"))
    f.write_bytes(f.read_bytes()[:40])
    return "comsim", _convert(t, s, s / "micro", d), str(f)


@case("dataset")
def empty_dataset(t, s):
    d = copy(s / "sim", t / "d")
    f = next((d / "meta" / "episodes").rglob("*.parquet"))
    pq.write_table(pq.read_table(f).slice(0, 0), f)
    edit_json(d / "meta" / "info.json", lambda i: i.update(total_episodes=0, total_frames=0))
    return "comsim", _convert(t, s, s / "micro", d), str(d)


@case("dataset")
def nan_actions_convert(t, s):
    d = copy(s / "sim", t / "d")
    rewrite_column(d, "action", lambda x: x.__setitem__((1, 2), np.nan))
    return "comsim", _convert(t, s, s / "micro", d), "'action'"


@case("dataset")
def nan_states_replay(t, s):
    d = copy(s / "real", t / "d")
    rewrite_column(d, "observation.state", lambda x: x.__setitem__((0, 0), np.inf))
    return "comsim", ["twin", "replay", "--real", str(d), "--twin", str(SCENE), "--out", str(t / "out")], \
        "observation.state"


@case("dataset")
def already_real_frames(t, s):
    d = write_sim(t / "d", cams=("front", "front_sim"))
    return "comsim", _convert(t, s, s / "micro", d), str(d / "meta" / "info.json")


# -- calibration folders (twin calibrate, twin replay --calibration)
@case("calibration")
def calibration_folder_missing(t, s):
    return "comsim", ["twin", "calibrate", str(t / "nothing"), "--out", str(t / "out")], "nothing"


@case("calibration")
def intrinsics_nan(t, s):
    d = calib_folder(t, K=[60, float("nan"), 32, 24])
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "camera_intrinsics.json")


@case("calibration")
def intrinsics_as_mapping(t, s):
    d = calib_folder(t, K={"fx": 60, "fy": 60, "cx": 32, "cy": 24})
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "camera_intrinsics.json")


@case("calibration")
def qpos_not_numbers(t, s):
    d = calib_folder(t, qpos="zero one two")
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], "000000.txt"


@case("calibration")
def calibration_json_nan_pose(t, s):
    c = t / "calibration.json"
    c.write_text(json.dumps({"T_cam_from_base": [[float("nan")] * 4] + EYE[1:], "K": [60, 60, 16, 16]}))
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(SCENE), "--out", str(t / "out"),
                      "--calibration", str(c)], str(c)


# -- output paths
@case("output")
def convert_output_is_input(t, s):
    d = copy(s / "sim", t / "d")
    return "comsim", _convert(t, s, s / "micro", d, d), str(d)


@case("output")
def convert_output_inside_input(t, s):
    d = copy(s / "sim", t / "d")
    return "comsim", _convert(t, s, s / "micro", d, d / "pseudo"), str(d / "pseudo")


@case("output")
def convert_output_is_a_file(t, s):
    f = t / "out"
    f.write_text("my notes\n")
    return "comsim", _convert(t, s, s / "micro", None, f), str(f)


@case("output")
def convert_output_foreign_folder(t, s):
    (t / "out").mkdir()
    (t / "out" / "thesis.tex").write_text("precious\n")
    return "comsim", _convert(t, s, s / "micro"), str(t / "out")


@case("output")
def generate_out_is_a_lab_dataset(t, s):
    lab = copy(s / "sim", t / "lab")
    (lab / "lab_truth.json").write_text(json.dumps({"format": 1, "task": {"name": "push"}}))
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--out", str(lab), "--no-progress"], str(lab)


@case("output")
def generate_out_is_a_file(t, s):
    f = t / "out"
    f.write_text("not a folder\n")
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--out", str(f), "--no-progress"], str(f)


@case("output")
def lab_record_into_user_folder(t, s):
    (t / "out" / "calibration").mkdir(parents=True)
    (t / "out" / "calibration" / "my_stills.png").write_bytes(b"\x89PNG user data")
    return "comsim", ["lab", "record", "--task", "push", "--episodes", "1", "--out", str(t / "out")], str(t / "out")


@case("output")
def lab_record_out_is_a_file(t, s):
    (t / "out").write_text("notes\n")
    return "comsim", ["lab", "record", "--task", "push", "--episodes", "1", "--out", str(t / "out")], str(t / "out")


@case("output")
def calibrate_out_is_a_file(t, s):
    d = calib_folder(t)
    (t / "out").write_text("notes\n")
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(t / "out")


@case("output")
def replay_out_is_the_real_dataset(t, s):
    d = copy(s / "real", t / "d")
    return "comsim", ["twin", "replay", "--real", str(d), "--twin", str(SCENE), "--out", str(d)], str(d)


@case("output")
def replay_into_user_folder(t, s):
    (t / "out").mkdir()
    (t / "out" / "keep.txt").write_text("mine\n")
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(SCENE), "--out", str(t / "out")], \
        str(t / "out")


@case("output")
def i3d_url_without_opt_in(t, s):
    return "comsim", ["eval", "video", "--pred", str(s / "sim"), "--ref", str(s / "sim"), "--camera", "front_sim",
                      "--metrics", "fvd", "--i3d", "http://127.0.0.1:9/i3d.pt"], "--i3d"


# -- checks before the first write: inputs that a command would otherwise find only after making its files
@case("scene")
def odd_camera_size(t, s):
    sc = scene_with(t, width=127, height=127, K=[110.0, 110.0, 63.5, 63.5])
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--scene", str(sc), "--out", str(t / "out"),
                      "--episodes", "1", "--no-progress"], str(sc)


@case("scene")
def camera_too_large(t, s):
    sc = scene_with(t, width=100000, height=100000)
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--scene", str(sc), "--out", str(t / "out"),
                      "--no-progress"], "at most"


@case("scene")
def scene_not_utf8(t, s):
    sc = t / "scene.yaml"
    sc.write_bytes(b"\xff\xfe" + SCENE.read_bytes())
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(sc), "--out", str(t / "out")], str(sc)


@case("task")
def task_not_utf8(t, s):
    p = t / "task.yaml"
    p.write_bytes(TASK.format(scene=SCENE).encode("utf-16"))
    return "comsim", ["generate", "--task", str(p), "--out", str(t / "out"), "--no-progress"], str(p)


@case("lab_cell")
def lab_cell_not_utf8(t, s):
    p = t / "cell.yaml"
    p.write_bytes(b"\x80" + LAB.read_bytes())
    return "comsim", _record(t, p), str(p)


@case("flag")
def generate_negative_seed(t, s):
    return "comsim", ["generate", "--task", str(s / "task.yaml"), "--out", str(t / "out"), "--seed", "-1",
                      "--no-progress"], "--seed"


@case("flag")
def lab_record_negative_seed(t, s):
    return "comsim", ["lab", "record", "--task", "push", "--episodes", "1", "--out", str(t / "out"), "--seed", "-3"], \
        "--seed"


@case("flag")
def lab_record_negative_stills(t, s):
    return "comsim", ["lab", "record", "--task", "push", "--episodes", "1", "--out", str(t / "out"),
                      "--calibration-stills", "-2"], "--calibration-stills"


@case("flag")
def convert_negative_seed(t, s):
    return "comsim", _convert(t, s, s / "micro", None, None, "--seed", "-1"), "--seed"


@case("flag")
def convert_nan_guidance(t, s):
    return "comsim", _convert(t, s, s / "micro", None, None, "--w-sim", "nan"), "--w-sim"


@case("flag")
def replay_unknown_channel(t, s):
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(SCENE), "--out", str(t / "out"),
                      "--channels", "seg,xray"], "--channels"


@case("flag")
def replay_unknown_camera(t, s):
    return "comsim", ["twin", "replay", "--real", str(s / "real"), "--twin", str(SCENE), "--out", str(t / "out"),
                      "--camera", "side"], "side"


@case("flag")
def eval_no_episodes(t, s):
    return "comsim", ["eval", "video", "--pred", str(s / "sim"), "--ref", str(s / "sim"), "--camera", "front_sim",
                      "--metrics", "psnr", "--max-episodes", "0"], "max_episodes"


@case("flag")
def lab_pairs_negative_count(t, s):
    return "comsim", ["lab", "pairs", "--out", str(t / "out"), "--push", "-1"], "--push"


@case("output")
def eval_out_is_a_folder(t, s):
    (t / "report").mkdir()
    return "comsim", ["eval", "video", "--pred", str(s / "sim"), "--ref", str(s / "sim"), "--camera", "front_sim",
                      "--metrics", "psnr", "--out", str(t / "report")], str(t / "report")


# -- media: truncated or corrupt video and image files (one line naming the file, not FFmpeg's traceback)
def _video(ds: Path) -> Path:
    return next((ds / "videos").rglob("*.mp4"))


def _truncated(ds: Path) -> Path:
    f = _video(ds)
    f.write_bytes(f.read_bytes()[:2000])
    return f


@case("media")
def convert_truncated_mp4(t, s):
    f = _truncated(copy(s / "sim", t / "d"))
    return "comsim", _convert(t, s, s / "micro", t / "d"), str(f)


@case("media")
def convert_empty_mp4(t, s):
    f = _video(copy(s / "sim", t / "d"))
    f.write_bytes(b"")
    return "comsim", _convert(t, s, s / "micro", t / "d"), str(f)


@case("media")
def convert_mp4_holds_a_png(t, s):
    f = _video(copy(s / "sim", t / "d"))  # the header parses (an image stream); its frames do not decode
    f.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    return "comsim", _convert(t, s, s / "micro", t / "d"), str(f)


@case("media")
def eval_truncated_mp4(t, s):
    f = _truncated(copy(s / "sim", t / "d"))
    return "comsim", ["eval", "video", "--pred", str(t / "d"), "--ref", str(s / "sim"), "--camera", "front_sim",
                      "--metrics", "psnr"], str(f)


@case("media")
def eval_mp4_folder_truncated(t, s):
    (t / "mp4s").mkdir()
    shutil.copy(_video(s / "sim"), t / "mp4s" / "a.mp4")
    (t / "mp4s" / "b.mp4").write_bytes(_video(s / "sim").read_bytes()[:1500])
    return "comsim", ["eval", "video", "--pred", str(t / "mp4s"), "--ref", str(t / "mp4s"), "--metrics", "psnr"], \
        str(t / "mp4s" / "b.mp4")


@case("media")
def eval_frame_not_an_image(t, s):
    (t / "frames" / "ep0").mkdir(parents=True)
    (t / "frames" / "ep0" / "000.png").write_bytes(b"not a png")
    return "comsim", ["eval", "video", "--pred", str(t / "frames"), "--ref", str(t / "frames"), "--metrics",
                      "psnr"], "000.png"


@case("media")
def replay_truncated_mp4(t, s):
    f = _truncated(copy(s / "real", t / "d"))
    return "comsim", ["twin", "replay", "--real", str(t / "d"), "--twin", str(SCENE), "--out", str(t / "out")], str(f)


@case("media")
def training_truncated_mp4(t, s):
    f = _truncated(copy(s / "paired", t / "d"))
    return "train", ["--config", str(_paired_cfg(t, t / "d"))], str(f)


# -- translator training: every setting in range before translator_config.json is written
def _paired_cfg(t: Path, data: Path, **over) -> Path:
    return translator_cfg(t, data__paths=[str(data)], data__num_frames=4, data__val_episodes=1, **over)


@case("translator_config")
def config_negative_learning_rate(t, s):
    p = translator_cfg(t, train__learning_rate=-1)
    return "train", ["--config", str(p)], "train.learning_rate"


@case("translator_config")
def config_zero_steps(t, s):
    p = translator_cfg(t, train__max_steps=0)
    return "train", ["--config", str(p)], "train.max_steps"


@case("translator_config")
def config_zero_checkpointing_steps(t, s):
    p = translator_cfg(t, train__checkpointing_steps=0)
    return "train", ["--config", str(p)], "train.checkpointing_steps"


@case("translator_config")
def config_unknown_scheduler(t, s):
    p = translator_cfg(t, train__lr_scheduler="zigzag")
    return "train", ["--config", str(p)], "train.lr_scheduler"


@case("translator_config")
def config_betas_out_of_range(t, s):
    p = translator_cfg(t, train__adam_betas=[2.0, 3.0])
    return "train", ["--config", str(p)], "train.adam_betas"


@case("translator_config")
def config_ema_decay_above_one(t, s):
    p = translator_cfg(t, train__ema_decay=2.0)
    return "train", ["--config", str(p)], "train.ema_decay"


@case("translator_config")
def config_zero_patch(t, s):
    p = translator_cfg(t, model__patch_size=[0, 4, 4])
    return "train", ["--config", str(p)], "model.patch_size"


@case("translator_config")
def config_no_blocks(t, s):
    p = translator_cfg(t, model__depth=0)
    return "train", ["--config", str(p)], "model.depth"


@case("translator_config")
def config_not_utf8(t, s):
    p = t / "translator.yaml"
    p.write_bytes(b"\xff" + TINY.read_bytes())
    return "train", ["--config", str(p)], str(p)


@case("translator_config")
def config_vae_not_found(t, s):
    p = translator_cfg(t, codec__type="diffusers_vae", codec__pretrained=str(t / "no_vae"))
    return "train", ["--config", str(p)], "codec.pretrained"


@case("translator_config")
def training_data_is_sim_only(t, s):
    return "train", ["--config", str(_paired_cfg(t, s / "sim"))], str(s / "sim")


@case("translator_config")
def training_episodes_shorter_than_a_window(t, s):
    p = translator_cfg(t, data__paths=[str(s / "paired")], data__num_frames=8, data__val_episodes=1)
    return "train", ["--config", str(p)], str(s / "paired")


@case("output")
def training_output_dir_is_a_file(t, s):
    (t / "runs").write_text("notes\n")
    return "train", ["--config", str(translator_cfg(t))], "train.output_dir"


@case("output")
def training_output_dir_is_a_user_folder(t, s):
    (t / "runs").mkdir()
    (t / "runs" / "thesis.tex").write_text("precious\n")
    return "train", ["--config", str(translator_cfg(t))], str(t / "runs")


@case("output")
def training_over_checkpoints_without_resume(t, s):
    (t / "runs" / "checkpoint-2").mkdir(parents=True)
    (t / "runs" / "translator_config.json").write_text("{}")
    return "train", ["--config", str(translator_cfg(t))], "--resume_from_checkpoint"


# -- calibration folders: intrinsics and distortion files
@case("calibration")
def K_txt_not_numbers(t, s):
    d = calib_folder(t)
    (d / "K.txt").write_text("hello world\n")
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "K.txt")


@case("calibration")
def K_txt_binary(t, s):
    d = calib_folder(t)
    (d / "K.txt").write_bytes(b"\xff\xfe\x00\x01")
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "K.txt")


@case("calibration")
def dist_txt_not_numbers(t, s):
    d = calib_folder(t)
    (d / "dist.txt").write_text("a b c d\n")
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "dist.txt")


@case("calibration")
def dist_txt_nan(t, s):
    d = calib_folder(t)
    (d / "dist.txt").write_text("nan 0 0 0 0\n")
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "dist.txt")


@case("calibration")
def intrinsics_json_invalid(t, s):
    d = calib_folder(t, K=[60, 60, 32, 24])
    (d / "camera_intrinsics.json").write_text('{"K": [60, 60')
    return "comsim", ["twin", "calibrate", str(d), "--out", str(t / "out")], str(d / "camera_intrinsics.json")


# -- datasets a command reads in full: refused before the first write
@case("dataset")
def replay_states_of_seven_values(t, s):
    rng = np.random.default_rng(0)
    ep = Episode(frames={"front": rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)},
                 action=np.zeros((4, 7), np.float32), state=np.zeros((4, 7), np.float32), fps=10, task="push",
                 provenance=Provenance(source="real", task="push", seed=0))
    with DatasetWriter(t / "d", 10) as w:
        w.add_episode(ep)
    return "comsim", ["twin", "replay", "--real", str(t / "d"), "--twin", str(SCENE), "--out", str(t / "out")], \
        "observation.state"


@case("dataset")
def convert_parquet_narrower_than_info(t, s):
    d = copy(s / "sim", t / "d")
    _narrow_actions(d)
    return "comsim", _convert(t, s, s / "micro", d), "'action'"


@case("dataset")
def convert_parquet_without_states(t, s):
    d = copy(s / "sim", t / "d")
    f = next((d / "data").rglob("*.parquet"))
    pq.write_table(pq.read_table(f).drop(["observation.state"]), f)
    return "comsim", _convert(t, s, s / "micro", d), "'observation.state'"


@case("dataset")
def replay_parquet_narrower_than_info(t, s):
    d = copy(s / "real", t / "d")
    _narrow_actions(d)
    return "comsim", ["twin", "replay", "--real", str(d), "--twin", str(SCENE), "--out", str(t / "out")], "'action'"


def _narrow_actions(ds: Path) -> None:
    """7 actions per frame in the data file, while info.json still says 8."""
    for f in sorted((ds / "data").rglob("*.parquet")):
        t = pq.read_table(f)
        x = np.stack(t["action"].to_pylist()).astype(np.float32)[:, :7]
        pq.write_table(t.set_column(t.column_names.index("action"), "action",
                                    pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 7)), f)


@case("flag")
def convert_output_empty_string(t, s):  # an unset shell variable: not the working directory
    return "comsim", ["convert", "--model", str(s / "micro"), "--input", str(s / "sim"), "--output", "",
                      "--steps", "1"], "--output"


# ----------------------------------------------------------------------------- the check


def _script_main(name: str):
    path = ROOT / ({"train": "train/train_translator.py", "eval_policy": "eval/eval_policy.py"}[name])
    spec = importlib.util.spec_from_file_location(f"_script_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def snapshot(*roots: Path) -> dict:
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            st = p.lstat()
            out[str(p)] = (p.is_dir(), st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_input_is_refused_cleanly(name, shared, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a command that writes relative paths would write here: checked too
    work = tmp_path / "case"
    work.mkdir()
    prog, argv, named = CASES[name](work, shared)
    before = snapshot(tmp_path, shared)
    capsys.readouterr()
    main = cli.main if prog == "comsim" else _script_main(prog)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse refuses flags itself (exit 2, usage and one error line)
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, f"exit code {rc}; stderr: {err[-2000:]}"
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert named in lines[0], f"message does not name {named!r}: {lines[0]}"
    assert snapshot(tmp_path, shared) == before, "files were written or changed"
    assert not Path("/tmp/escaped").exists() and not (tmp_path / "pwned").exists()


def test_enough_malformed_inputs_of_every_kind():
    kinds = {name.split(":")[0] for name in CASES}
    assert len(CASES) >= 100 and kinds == {"scene", "task", "lab_cell", "experiment", "translator_config",
                                           "translator_folder", "dataset", "calibration", "output", "flag", "media"}


# ----------------------------------------------------------------------------- library level


def test_reader_refuses_paths_out_of_the_dataset(shared, tmp_path):
    d = copy(shared / "sim", tmp_path / "d")
    info = d / "meta" / "info.json"
    good = json.loads(info.read_text())
    for key, value in (("data_path", "/etc/passwd"), ("data_path", "../x/{chunk_index}.parquet"),
                       ("video_path", "../../{video_key}.mp4")):
        info.write_text(json.dumps({**good, key: value}))
        with pytest.raises(DatasetError, match=key):
            LeRobotDataset(d)
    info.write_text(json.dumps(good))
    assert len(LeRobotDataset(d)) == 2  # and the intact dataset still reads


def test_writer_refuses_escaping_names_and_symlinked_folders(tmp_path):
    from comsim.errors import ComSimError

    with pytest.raises(ComSimError, match="plain name"):
        DatasetWriter(tmp_path / "a", 10).add_episode(sim_episode(0, cams=("../../x",)))
    assert not (tmp_path / "x.mp4").exists() and not any(tmp_path.rglob("*.mp4"))
    # A dataset folder whose videos/ is a symlink elsewhere: close() refuses to write through it.
    outside = tmp_path / "outside"
    outside.mkdir()
    w = DatasetWriter(tmp_path / "b", 10)
    w.add_episode(sim_episode(0))
    (tmp_path / "b" / "videos").symlink_to(outside)
    with pytest.raises(DatasetError, match="inside"):
        w.close()
    assert not any(outside.rglob("*"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".staging").symlink_to(outside)
    with pytest.raises(DatasetError, match="inside"):
        DatasetWriter(tmp_path / "d", 10, resume=True)
    with pytest.raises(DatasetError, match="finite"):
        ep = sim_episode(1)
        ep.state[2, 3] = np.nan
        DatasetWriter(tmp_path / "c", 10).add_episode(ep)


def test_codec_hub_id_needs_opt_in_but_a_local_vae_loads_offline(tmp_path, monkeypatch):
    from diffusers import AutoencoderKL

    from comsim.translator.codec import CodecError, DiffusersVAECodec, load_codec

    vae = AutoencoderKL(block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",), latent_channels=2, norm_num_groups=4,
                        layers_per_block=1)
    DiffusersVAECodec("tiny", vae=vae).save_pretrained(tmp_path / "m")
    codec = load_codec(tmp_path / "m")  # the copied-in VAE: offline
    assert codec.latent_channels == 2
    (tmp_path / "m" / "codec.json").write_text(json.dumps({"type": "diffusers_vae", "pretrained": "org/vae"}))
    monkeypatch.delenv("COMSIM_ALLOW_DOWNLOAD", raising=False)
    with pytest.raises(CodecError, match="allow-download"):
        load_codec(tmp_path / "m")
    (tmp_path / "m" / "codec.json").write_text(json.dumps({"type": "diffusers_vae", "pretrained": "../m/vae"}))
    with pytest.raises(CodecError, match="inside"):
        load_codec(tmp_path / "m")


def test_convert_retries_cleanly_after_a_bad_model(shared, tmp_path):
    """A bad model folder leaves nothing behind, so the rerun with the right one just works."""
    bad = copy(shared / "micro", tmp_path / "bad")
    w = bad / "transformer" / "diffusion_pytorch_model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    out = tmp_path / "pseudo"
    assert cli.main(_convert(tmp_path, shared, bad, None, out)) == 2 and not out.exists()
    assert cli.main(_convert(tmp_path, shared, shared / "micro", None, out)) == 0
    assert len(LeRobotDataset(out)) == 2


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    import comsim.convert

    def boom(*a, **k):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(comsim.convert, "convert_dataset", boom)
    with pytest.raises(ZeroDivisionError):
        cli.main(["convert", "--model", "m", "--input", "i", "--output", "o"])
