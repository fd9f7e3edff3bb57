"""What limits the twin's camera calibration on a lab cell: the cell's sensor and scene effects switched off one at
a time, each on its own recording of calibration stills, calibrated as ``comsim twin calibrate`` does, against the
lab's truth.

    MUJOCO_GL=egl python bench/calibration_sources.py --cell configs/lab/workshop.yaml --seeds 0 1 2 3 \
        --out runs/bench_calibration_sources

For each (variant, seed): one scripted episode and ``--stills`` calibration stills recorded in the cell with the
variant's dotted overrides (``comsim.lab.record_dataset``), the calibration from the stills starting at the twin
spec's nominal camera (``comsim.twin.align.calibrate_stills``), and its error against the truth: camera position
(mm) and rotation (deg), the camera centre's error in the true camera's axes (x right, y down, z forward), the mean
image displacement of points over the workspace (px at 128), the trusted stills' mean IoU, and where the twin
spec's markers are located in the robot-free still against where the true camera puts their face (px at the stills'
width). ``--markers truth`` is the oracle locator: the calibration is given each marker it finds at exactly that
true place, which says how much of the error the located markers carry. ``--robot-as-lab`` is the oracle robot:
the twin draws its robot's meshes at the lab cell's own mesh tolerance (``robot.light_tolerance``; the built-in
and workshop labs draw theirs coarser than the twin, for speed), which says how much of the error the twin's
robot shape carries. Each result is a JSON file in ``--out`` (a rerun skips it). The last line printed is one JSON
object: the rows and each variant's means over the seeds.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from comsim.config import PANDA_PUSH_CELL  # noqa: E402
from comsim.lab import load_lab_cell, record_dataset  # noqa: E402
from comsim.lab.truth import load_lab_truth  # noqa: E402
from comsim.sim.camera import as_K, project_points  # noqa: E402
from comsim.sim.spec import load_scene_spec  # noqa: E402
from comsim.twin import calibrate as twin_calibrate  # noqa: E402
from comsim.twin.align import calibrate_stills  # noqa: E402
from comsim.twin.frames import load_calibration_folder  # noqa: E402
from comsim.twin.pose_fit import pose_error  # noqa: E402

SHARP = ["look.sensor.blur_sigma_px=0.0"]
CLEAN = ["look.sensor.noise_std=0.0", "look.sensor.shot_noise=0.0", "look.sensor.jpeg_quality=100"]
VARIANTS = {  # name -> the dotted overrides of the cell that switch one thing off
    "base": [],
    "no_blur": SHARP,
    "no_noise": CLEAN,  # read and shot noise, and the compression
    "sharp_clean": SHARP + CLEAN,
    "no_distortion": ["look.sensor.radial_k1=0.0", "look.sensor.radial_k2=0.0"],
    "no_vignetting": ["look.sensor.vignetting=0.0"],
    "no_key_shadow": ["look.lights.0.castshadow=false"],
    "no_clutter": ["look.clutter=[]"],
}


def image_error_px(K, T, T_true, size: int, n: int = 500) -> float:
    """Mean displacement (px at 128 wide) between ``T`` and ``T_true`` of ``n`` fixed points over the workspace."""
    rng = np.random.default_rng(0)
    X = np.stack([rng.uniform(0.2, 0.8, n), rng.uniform(-0.35, 0.35, n), rng.uniform(0.0, 0.4, n)], 1)
    return float(np.linalg.norm(project_points(K, T, X) - project_points(K, T_true, X), axis=1).mean() * 128 / size)


def marker_offsets_px(calibration: Path, T_true: np.ndarray, markers) -> dict[str, list[float]]:
    """Per marker found in the robot-free still: located minus where the true camera puts its face (px)."""
    fr = load_calibration_folder(calibration)
    found = twin_calibrate.locate_markers(fr.background, fr.K, T_true, markers)
    by_name = {mk.name: mk for mk in markers}
    return {n: [round(float(d), 3) for d in uv - project_points(fr.K, T_true, twin_calibrate.marker_face(
        *by_name[n].pos[:2]))[0]] for n, uv in sorted(found.items())}


def run_one(cell_path: str, name: str, seed: int, stills: int, out: Path, markers: str = "located",
            robot_as_lab: bool = False) -> dict:
    tag = ("" if markers == "located" else f"_markers_{markers}") + ("_robot_as_lab" if robot_as_lab else "")
    result = out / f"{name}_s{seed}{tag}.json"
    if result.is_file():
        return json.loads(result.read_text())
    t0 = time.time()
    real = out / f"{name}_s{seed}" / "lab"
    cell = load_lab_cell(cell_path, VARIANTS[name])
    if not (real / "lab_truth.json").is_file():
        record_dataset("push", episodes=1, out=real, seed=seed, cell=cell, calibration_stills=stills)
    T_true = np.asarray(load_lab_truth(real).T_cam_from_base)
    spec = load_scene_spec(PANDA_PUSH_CELL)
    if robot_as_lab:
        lab_robot = cell.scene.robot
        spec = dataclasses.replace(spec, robot=dataclasses.replace(spec.robot, visual=lab_robot.visual,
                                                                   light_tolerance=lab_robot.light_tolerance))
    locate = twin_calibrate.locate_markers
    if markers == "truth":
        def at_truth(still, K, T, mks, min_share=0.3):
            return {mk.name: project_points(K, T_true, twin_calibrate.marker_face(*mk.pos[:2]))[0]
                    for mk in mks if mk.name in locate(still, K, T, mks, min_share)}
        twin_calibrate.locate_markers = at_truth
    try:
        res = calibrate_stills(real / "calibration", spec, "front", log=lambda s: None)
    finally:
        twin_calibrate.locate_markers = locate
    intr = json.loads((real / "calibration" / "camera_intrinsics.json").read_text())
    T = np.asarray(res["T_cam_from_base"])
    d_m, d_deg = pose_error(T, T_true)
    centre = (lambda T: -T[:3, :3].T @ T[:3, 3])
    d_cam = T_true[:3, :3] @ (centre(T) - centre(T_true))
    row = {"variant": name, "seed": seed, "markers": markers, "robot_as_lab": robot_as_lab,
           "mm": round(1000 * d_m, 2), "deg": round(d_deg, 3),
           "image_px_at_128": round(image_error_px(as_K(intr["K"]), T, T_true, intr["width"]), 3),
           "centre_error_in_camera_axes_mm": [round(float(x), 2) for x in 1000 * d_cam],
           "mean_iou_trusted": round(res["mean_iou_trusted"], 4), "sharpened": "sharpened" in res,
           "marker_located_minus_true_px": marker_offsets_px(real / "calibration", T_true, spec.markers),
           "seconds": round(time.time() - t0)}
    result.write_text(json.dumps(row) + "\n")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", default="configs/lab/workshop.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--stills", type=int, default=12)
    ap.add_argument("--markers", choices=["located", "truth"], default="located",
                    help="truth: the calibration is given the markers at their true place (the oracle locator)")
    ap.add_argument("--robot-as-lab", action="store_true",
                    help="the twin's robot meshes at the lab cell's mesh tolerance (the oracle robot shape)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_calibration_sources"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.variants:
        for seed in a.seeds:
            rows.append(run_one(a.cell, name, seed, a.stills, a.out, a.markers, a.robot_as_lab))
            print(json.dumps(rows[-1]), flush=True)
    means = {name: {k: round(float(np.mean([r[k] for r in rows if r["variant"] == name])), 3)
                    for k in ("mm", "deg", "image_px_at_128", "mean_iou_trusted")} for name in a.variants}
    print(json.dumps({"cell": a.cell, "seeds": a.seeds, "markers": a.markers, "robot_as_lab": a.robot_as_lab,
                      "rows": rows, "means": means}))


if __name__ == "__main__":
    main()
