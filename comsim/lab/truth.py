"""What a lab recording writes next to its LeRobotDataset, outside ``meta/``:

    DIR/camera_intrinsics.json        PUBLIC: K (fx, fy, cx, cy), width, height and OpenCV
                                      distortion coefficients, like a factory calibration.
                                      The twin may read it.
    DIR/lab_truth.json                HIDDEN: true T_cam_from_base, true object colours and
                                      sizes, the task, the cell (and its hash), and per
                                      episode: seed, success, initial and final object poses.
    DIR/lab_truth/episode_XXXXXX.npz  HIDDEN: per-frame object poses, TCP position, gripper
                                      width (aligned with the dataset's frames) and the state
                                      after the last action (``final_*``).

The twin never reads the hidden files; evaluators do, through ``load_lab_truth``. Every
file is written atomically (temporary name, then rename).
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comsim.io.files import atomic_output
from comsim.lab.cell import LabCell
from comsim.lab.effects import distortion_coeffs
from comsim.sim.camera import as_K, as_rigid

INTRINSICS_FILE = "camera_intrinsics.json"
TRUTH_FILE = "lab_truth.json"
TRUTH_DIR = "lab_truth"
TRUTH_FORMAT = "comsim.lab_truth/1"


# ---------------------------------------------------------------- public: intrinsics


def camera_intrinsics(cell: LabCell) -> dict:
    """The lab camera's factory calibration (what a real user would know)."""
    cam = cell.scene.camera(cell.camera)
    fx, fy, cx, cy = (float(v) for v in as_K(cam.K))
    return {"camera": cam.name, "width": cam.width, "height": cam.height,
            "fx": fx, "fy": fy, "cx": cx, "cy": cy, "K": [[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]],
            "distortion_model": "opencv", "dist_coeffs": distortion_coeffs(cell.look.sensor).tolist()}


def load_camera_intrinsics(root: str | Path) -> dict:
    path = Path(root) / INTRINSICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no camera intrinsics (written by `comsim lab record`)")
    return json.loads(path.read_text())


# ---------------------------------------------------------------- hidden: truth


def truth_header(cell: LabCell, task, seed: int, fps: int) -> dict:
    cam = cell.scene.camera(cell.camera)
    return {
        "format": TRUTH_FORMAT,
        "note": "Hidden ground truth of the lab. The twin must never read this file.",
        "task": task.describe(), "seed": int(seed), "fps": int(fps), "cell_hash": cell.hash(),
        "camera": {**camera_intrinsics(cell), "T_cam_from_base": as_rigid(cam.T_cam_from_base).tolist()},
        "objects": {o.name: {"rgba": list(o.rgba), "shape": o.shape, "size": list(o.size), "mass": o.mass}
                    for o in cell.scene.objects},
        "cell": cell.to_dict(),
        "complete": False, "episodes": [],
    }


def episode_truth_path(root: str | Path, index: int) -> Path:
    return Path(root) / TRUTH_DIR / f"episode_{index:06d}.npz"


def write_episode_truth(root: str | Path, index: int, arrays: dict[str, np.ndarray]) -> Path:
    path = episode_truth_path(root, index)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    with atomic_output(path) as tmp:
        tmp.write_bytes(buf.getvalue())
    return path


def read_episode_truth(root: str | Path, index: int) -> dict[str, np.ndarray]:
    path = episode_truth_path(root, index)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no truth for episode {index}")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def episode_summary(index: int, t: dict[str, np.ndarray]) -> dict:
    names = [str(n) for n in t["object_names"]]

    def poses(pos, quat):
        return {n: {"pos": pos[i].tolist(), "quat": quat[i].tolist()} for i, n in enumerate(names)}

    return {"episode_index": index, "seed": int(t["seed"]), "success": bool(t["success"]),
            "length": int(len(t["object_pos"])),
            "initial_object_poses": poses(t["object_pos"][0], t["object_quat"][0]),
            "final_object_poses": poses(t["final_object_pos"], t["final_object_quat"]),
            "operator_speed": float(t["operator_speed"]),
            "operator_events": [str(e) for e in t["operator_events"]],
            "trajectory": str(episode_truth_path(".", index))}


@dataclass
class LabTruth:
    """Hidden truth of a lab recording (for evaluators, never for the twin)."""
    root: Path
    info: dict

    @property
    def T_cam_from_base(self) -> np.ndarray:
        return np.asarray(self.info["camera"]["T_cam_from_base"])

    @property
    def object_colors(self) -> dict[str, list[float]]:
        return {n: o["rgba"] for n, o in self.info["objects"].items()}

    @property
    def episodes(self) -> list[dict]:
        return self.info["episodes"]

    def trajectory(self, index: int) -> dict[str, np.ndarray]:
        """Per-frame arrays of one episode: object_pos (T, n, 3), object_quat (T, n, 4), ..."""
        return read_episode_truth(self.root, index)


def load_lab_truth(root: str | Path) -> LabTruth:
    path = Path(root) / TRUTH_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no lab truth (written by `comsim lab record`)")
    info = json.loads(path.read_text())
    if info.get("format") != TRUTH_FORMAT:
        raise ValueError(f"{path}: field 'format' is {info.get('format')!r}, expected {TRUTH_FORMAT!r}")
    return LabTruth(Path(root), info)
