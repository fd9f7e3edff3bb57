"""`comsim lab record`: scripted teleoperation in the lab, saved as a LeRobotDataset.

Each episode runs the closed-loop ``LabEnv`` with the ``ScriptedTeleoperator``: frame k
stores the observation (image, state) and the action the operator then sent; the success
flag is the task predicate on the state after the last action. Episode k's seed depends
only on (seed, k), so an interrupted recording resumed later produces exactly the
episodes an uninterrupted one would have.

Crash safety: an episode's hidden truth is written first, then the episode is staged by
``DatasetWriter.add_episode`` (an atomic rename); a kill at any moment leaves only whole
staged episodes, which a rerun with the same arguments keeps. ``lab_truth.json`` says
``"complete": true`` only once the dataset is closed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from comsim.episode import Episode, Provenance
from comsim.errors import InputError
from comsim.episode import check_seed
from comsim.io.files import write_json
from comsim.io.lerobot import DatasetWriter, check_resumable, dataset_complete
from comsim.io.lock import output_lock
from comsim.io.paths import OutputFolderError, check_output_path, claim_output
from comsim.lab.cell import LabCell, load_lab_cell
from comsim.lab.env import OPERATOR_STREAM, LabEnv
from comsim.lab.stills import CALIBRATION_DIR, DONE_FILE as STILLS_DONE, record_calibration_stills
from comsim.lab.tasks import make_task
from comsim.episode import episode_seed  # noqa: F401  (comsim.lab exports it)
from comsim.lab.teleop import ScriptedTeleoperator
from comsim.lab.truth import (INTRINSICS_FILE, TRUTH_FILE, camera_intrinsics, episode_summary,
                              read_episode_truth, truth_header, write_episode_truth)

STILLS = 12  # calibration stills per recording (plus the robot-free one)
RESUME_KEYS = ("task", "seed", "fps", "cell_hash")  # must match to continue a recording


def record_episode(env: LabEnv, seed: int) -> tuple[Episode, dict[str, np.ndarray]]:
    """One scripted demonstration: the Episode and its hidden per-frame truth."""
    obs = env.reset(seed)
    operator = ScriptedTeleoperator(env, np.random.default_rng([seed, OPERATOR_STREAM]))
    names = env.scene.object_names
    images, states, actions, obj_pos, obj_quat, tcp, cam = [], [], [], [], [], [], []
    for action in operator.demonstrate():
        truth = env.truth()
        if env.realism["camera"]:
            cam.append(env.camera_pose())
        images.append(obs["image"])
        states.append(obs["state"])
        actions.append(action)
        obj_pos.append([truth.object_pos[n] for n in names])
        obj_quat.append([truth.object_quat[n] for n in names])
        tcp.append(env.scene.tcp_pose()[0])
        obs, success, done = env.step(action)
        if done:
            break
    final = env.truth()
    success = env.task.success(final)
    cell_hash = env.cell.hash()
    ep = Episode(frames={env.cell.camera: np.stack(images)}, action=np.stack(actions), state=np.stack(states),
                 fps=env.fps, task=env.task.instruction, success=success,
                 provenance=Provenance(source="lab", task=env.task_name, seed=seed, twin_spec_hash=None,
                                       extra={"cell_hash": cell_hash}))
    truth = {
        "seed": np.int64(seed), "success": np.bool_(success), "object_names": np.array(names),
        "object_pos": np.array(obj_pos), "object_quat": np.array(obj_quat), "tcp_pos": np.array(tcp),
        "gripper_width": ep.state[:, 7].astype(np.float64),
        "final_object_pos": np.array([final.object_pos[n] for n in names]),
        "final_object_quat": np.array([final.object_quat[n] for n in names]),
        "final_gripper_width": np.float64(final.gripper_width),
        "final_touching_robot": np.array([final.touching_robot[n] for n in names]),
        "operator_speed": np.float64(operator.style.speed),
        "operator_events": np.array([f"{k}: {what}" for k, what in operator.events], dtype=str),
    }
    if cam:  # the camera moved (comsim.lab.realism): its true pose at every frame
        truth["camera_T_cam_from_base"] = np.array(cam)
    return ep, truth


def record_dataset(task: str, episodes: int, out: str | Path, seed: int = 0,
                   cell: LabCell | str | Path | None = None, fps: int | None = None,
                   resume: bool = True, calibration_stills: int = STILLS) -> Path:
    """Record ``episodes`` scripted demonstrations of ``task`` into the LeRobotDataset ``out``.

    ``cell``: a LabCell or a lab cell YAML (default: configs/lab/default.yaml); ``fps``:
    default the cell's. With ``resume`` (default), an interrupted recording in ``out`` is
    continued; without it ``out`` must be empty. ``calibration_stills``: full-resolution
    stills (+ a robot-free one) written first into ``out/calibration`` (``lab/stills.py``);
    0 for none. Returns ``out``.
    """
    cell = cell if isinstance(cell, LabCell) else load_lab_cell(cell)
    task_obj = make_task(task, cell)  # unknown task: fails before anything touches the disk
    if episodes < 1:
        raise InputError(None, "episodes", "at least 1", episodes)
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, int) or fps < 1):
        raise InputError(None, "--fps", "a positive whole number of frames/s", fps)
    if isinstance(calibration_stills, bool) or not isinstance(calibration_stills, int) or calibration_stills < 0:
        raise InputError(None, "--calibration-stills", "a whole number >= 0 (0: none)", calibration_stills)
    check_seed(seed)
    fps = int(fps or cell.fps)
    out = check_output_path(out)
    header = {"command": "comsim lab record", **truth_header(cell, task_obj, seed, fps)}
    # Only a new or empty folder, or this recording's own (lab_truth.json with the same settings):
    # resuming rewrites OUT/calibration, which must never be a user's folder.
    if claim_output(out, TRUTH_FILE, header, RESUME_KEYS, "comsim lab record", made="was recorded") and not resume:
        raise OutputFolderError(f"{out}: holds an interrupted recording with these settings; rerun without "
                                "--no-resume to continue it, or choose an empty folder")
    check_resumable(out, episodes, "record")
    with output_lock(out, "comsim lab record"):  # one writer per output; everything above wrote nothing
        claim_output(out, TRUTH_FILE, header, RESUME_KEYS, "comsim lab record", made="was recorded")  # meanwhile?
        return _record(cell, task, episodes, out, seed, fps, header, calibration_stills)


def _record(cell: LabCell, task: str, episodes: int, out: Path, seed: int, fps: int, header: dict,
            calibration_stills: int) -> Path:
    """The writing part of ``record_dataset``, with the output locked and every input checked."""
    writer = DatasetWriter(out, fps, resume=True)
    if dataset_complete(out):  # closed before (with as many episodes: checked)
        _write_final_truth(out, header, episodes)
        return out

    write_json(header, out / TRUTH_FILE)  # first: it makes the folder this recording's
    write_json(camera_intrinsics(cell), out / INTRINSICS_FILE)
    todo = [i for i in range(episodes) if i not in writer.finished_episodes]
    stills = out / CALIBRATION_DIR
    if todo or (calibration_stills and not (stills / STILLS_DONE).is_file()):
        with LabEnv(cell, task, fps) as env:
            if calibration_stills:
                record_calibration_stills(env, stills, n=calibration_stills, seed=seed)
            for i in tqdm(todo, desc=f"lab {task}", unit="episode"):
                ep, truth = record_episode(env, episode_seed(seed, i))
                write_episode_truth(out, i, truth)  # first: a staged episode always has its truth
                writer.add_episode(ep, episode_index=i)
    writer.close()
    _write_final_truth(out, header, episodes)
    return out


def _write_final_truth(out: Path, header: dict, episodes: int) -> None:
    summaries = [episode_summary(i, read_episode_truth(out, i)) for i in range(episodes)]
    write_json({**header, "complete": True, "episodes": summaries}, out / TRUTH_FILE)
