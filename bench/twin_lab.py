"""The twin against the lab's hidden truth: a full replay of the built-in lab, its object placements and their
position uncertainty on several cells, the object fits alone with the lab's camera, or printed cubes' colours.

    # record N scripted episodes of the built-in lab, replay them (camera from the episodes' own frames)
    MUJOCO_GL=egl nice python bench/twin_lab.py [--task push] [--episodes 10] [--out runs/bench_twin]

    # every object placement of the cells' recordings (recorded with calibration stills when absent) against
    # the twin's 95% bound: alignment only (calibration, camera motion, localization, self-check), no replay
    MUJOCO_GL=egl nice python bench/twin_lab.py placements --cells default cool_studio workshop \\
        --seeds 0 --episodes 15 --out runs/bench_placements [--recording workshop:0=runs/ws_lab ...]

    # the localizer alone, with the lab's TRUE camera: each object fit (evidence, painted) on the recordings given,
    # its placements' error and their mean offset in the image (px; v < 0: placed farther from the camera)
    MUJOCO_GL=egl nice python bench/twin_lab.py fits --recording workshop=runs/ws_lab cool_studio=runs/cool_lab \
        default=runs/lab_table/lab --out runs/bench_fits

    # printed cubes: the workshop cell with plain cubes, its own prints (a lettered label, a logo), a fine checker
    # and coarse prints, with the lab's true camera and poses: per episode the print coverage the twin finds and
    # how far each printed cube's fitted colour lies from the plain cube's (fitted on all its pixels / on its body)
    MUJOCO_GL=egl nice python bench/twin_lab.py prints --episodes 4 --out runs/bench_prints

    # the calibration plot of a placements run (needs matplotlib): predicted 95% bound against actual error
    python bench/twin_lab.py plot runs/bench_placements/placements.json docs/results/FIGURE.png

Each prints ONE JSON object on its last line.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

CELLS = {"default": None, "cool_studio": "configs/lab/cool_studio.yaml", "workshop": "configs/lab/workshop.yaml"}


def replay_main(argv=None) -> dict:
    from comsim.config import PANDA_CELL
    from comsim.lab.record import record_dataset
    from comsim.lab.twin_truth import replay_and_score

    ap = argparse.ArgumentParser(description="twin alignment + physics replay of the built-in lab, scored")
    ap.add_argument("--task", default="push")
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mode", default="physics", choices=["physics", "kinematic"])
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--no-refine", action="store_true", help="objects' initial poses from the first frame only")
    a = ap.parse_args(argv)
    out = a.out or Path(tempfile.mkdtemp(prefix="bench_twin_"))
    t0 = time.perf_counter()
    real = record_dataset(a.task, episodes=a.episodes, out=out / "lab", seed=a.seed)
    t1 = time.perf_counter()
    paired = replay_and_score(real, PANDA_CELL, out / "paired", mode=a.mode, refine=not a.no_refine,
                              on_unreliable="mark", log=lambda s: print(s, flush=True))
    t2 = time.perf_counter()
    rep = json.loads((paired / "alignment_report.json").read_text())
    al = json.loads((paired / "twin_alignment.json").read_text())
    eps = rep["episodes"]
    summary = {**rep["summary"], "task": a.task, "episodes": a.episodes, "mode": a.mode,
               "calibration_mean_iou_vs_derived_masks": al["calibration"]["mean_iou"],
               "calibration_seconds": al["calibration"].get("seconds"),
               "per_episode_object_trajectory_error_m_max": [max(e["object_trajectory_error_m_max"].values())
                                                              for e in eps],
               "refine": not a.no_refine,
               "record_seconds": round(t1 - t0, 1), "align_replay_report_seconds": round(t2 - t1, 1),
               "paired": str(paired)}
    print(json.dumps(summary))
    return summary


def placements_main(argv=None) -> dict:
    import numpy as np

    from comsim.config import PANDA_PUSH_CELL
    from comsim.io.files import write_json
    from comsim.lab.record import record_dataset
    from comsim.lab.truth import load_lab_truth
    from comsim.lab.twin_truth import camera_motion_vs_truth, placement_errors, uncertainty_vs_truth
    from comsim.sim.spec import load_scene_spec
    from comsim.twin.pose_fit import pose_error
    from comsim.twin.replay import align

    ap = argparse.ArgumentParser(description="object placements and their 95% bounds against the lab's truth")
    ap.add_argument("placements")
    ap.add_argument("--cells", nargs="+", default=list(CELLS), help=f"of {list(CELLS)}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--episodes", type=int, default=15)
    ap.add_argument("--stills", type=int, default=12, help="calibration stills recorded with the episodes")
    ap.add_argument("--recording", nargs="*", default=[],
                    help="CELL:SEED=DIR: use the lab recording DIR for that cell and seed (no recording made)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_placements"))
    a = ap.parse_args(argv)
    unknown = [c for c in a.cells if c not in CELLS]
    if unknown:
        raise SystemExit(f"--cells: unknown {unknown}; expected some of {list(CELLS)}")
    given = {k: Path(v) for k, v in (r.split("=", 1) for r in a.recording)}
    spec = load_scene_spec(PANDA_PUSH_CELL)
    runs, rows = [], []
    for cell in a.cells:
        for seed in a.seeds:
            name = f"{cell}:{seed}"
            real = given.get(name) or a.out / f"{cell}_seed{seed}" / "lab"
            t0 = time.perf_counter()
            if name not in given:
                record_dataset("push", episodes=a.episodes, out=real, seed=seed, cell=CELLS[cell],
                               calibration_stills=a.stills)
            al_path = a.out / f"{cell}_seed{seed}" / "twin_alignment.json"
            if not al_path.is_file():
                write_json(align(real, spec, log=lambda s: print(s, flush=True)), al_path)
            al = json.loads(al_path.read_text())
            truth = load_lab_truth(real)
            d_m, d_deg = pose_error(np.asarray(al["T_cam_from_base"]), truth.T_cam_from_base)
            these = [{"cell": cell, "seed": seed, **r} for r in placement_errors(real, al)]
            rows += these
            motion = camera_motion_vs_truth(real, al)
            runs.append({"cell": cell, "seed": seed, "recording": str(real), "episodes": len(al["objects"]),
                         "camera_error_mm": round(1000 * d_m, 2), "camera_error_deg": round(d_deg, 3),
                         "calibration_sharpened": al["calibration"].get("sharpened"),
                         "contour_residual_px": al["calibration"].get("contour_residual_px"),
                         "camera_motion_error_px_rms": None if motion is None else round(motion["error_px_rms"], 4),
                         "objects": uncertainty_vs_truth(these), "seconds": round(time.perf_counter() - t0, 1)})
            print(json.dumps(runs[-1]), flush=True)
    hard = [r for r in rows if r["cell"] != "default"]
    result = {"bench": "twin_placements", "runs": runs, "all": uncertainty_vs_truth(rows),
              "cool_studio_and_workshop": uncertainty_vs_truth(hard) if hard else None,
              "placements": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}
    write_json(result, a.out / "placements.json", indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "placements"}))
    return result


def fits_main(argv=None) -> dict:
    import numpy as np

    from comsim.config import PANDA_PUSH_CELL
    from comsim.io.files import write_json
    from comsim.io.lerobot import LeRobotDataset
    from comsim.lab.twin_truth import true_first_frames
    from comsim.sim.camera import project_points
    from comsim.sim.spec import load_scene_spec
    from comsim.twin.localize import FITS, localize_objects

    ap = argparse.ArgumentParser(description="the object fits with the lab's true camera, against the truth")
    ap.add_argument("fits")
    ap.add_argument("--recording", nargs="+", required=True, help="NAME=DIR: a lab recording with calibration stills")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_fits"))
    a = ap.parse_args(argv)
    spec = load_scene_spec(PANDA_PUSH_CELL)
    out = {"bench": "twin_fits", "camera": "the lab's true camera of each episode", "recordings": {}}
    for name, real in (r.split("=", 1) for r in a.recording):
        rows = []
        for e in range(len(LeRobotDataset(real))):
            f = true_first_frames(real, e, spec)
            for fit in FITS:
                found = localize_objects(f["image"], spec.objects, f["K"], f["T"], robot_mask=f["arm"],
                                         background=f["still"], table=spec.table, fit=fit)
                for o in spec.objects:
                    g, (x, y, _) = found[o.name], f["poses"][o.name]
                    if not g["found"]:
                        rows.append({"fit": fit, "object": o.name, "error_m": None})
                        continue
                    uv = project_points(f["K"], f["T"], np.array([[x, y, o.half_height],
                                                                  [g["pos"][0], g["pos"][1], o.half_height]]))
                    rows.append({"fit": fit, "object": o.name, "error_m": float(np.hypot(g["pos"][0] - x, g["pos"][1] - y)),
                                 "offset_px": (uv[1] - uv[0]).tolist()})
        per = out["recordings"][name] = {"recording": str(real)}
        for fit in FITS:
            for o in [*spec.objects, None]:
                sel = [r for r in rows if r["fit"] == fit and (o is None or r["object"] == o.name)]
                ok = [r for r in sel if r["error_m"] is not None]
                err = np.array([r["error_m"] for r in ok])
                per[f"{fit}/{'all' if o is None else o.name}"] = {
                    "placements": len(sel), "not_found": len(sel) - len(ok),
                    "error_cm_mean": round(100 * float(err.mean()), 2), "error_cm_max": round(100 * float(err.max()), 2),
                    "over_2cm": int((err > 0.02).sum()),
                    "offset_px_mean": np.mean([r["offset_px"] for r in ok], 0).round(3).tolist()}
        print(json.dumps({name: per}), flush=True)
    write_json(out, a.out / "fits.json", indent=1)
    print(json.dumps(out))
    return out


PRINTS = {  # the workshop cell's prints (look.prints), by variant
    "plain": "{}",
    "workshop": None,  # as configs/lab/workshop.yaml has them: a lettered label on red, a logo on blue
    "fine_checker": "{red_cube: {pattern: label, rgb: [0.93, 0.92, 0.86], text: ACME, coverage: 0.25}, "
                    "blue_cube: {pattern: checker, rgb: [0.95, 0.95, 0.92], count: 3}}",
    "coarse": "{red_cube: {pattern: two_tone, rgb: [0.93, 0.92, 0.86], coverage: 0.4}, "
              "blue_cube: {pattern: checker, rgb: [0.95, 0.95, 0.92], count: 2}}",
}


def prints_main(argv=None) -> dict:
    import numpy as np

    from comsim.config import PANDA_PUSH_CELL
    from comsim.io.files import write_json
    from comsim.lab.cell import load_lab_cell
    from comsim.lab.record import record_dataset
    from comsim.lab.twin_truth import true_first_frames
    from comsim.sim.scene import yaw_quat
    from comsim.sim.spec import load_scene_spec
    from comsim.twin.align import aligned_spec
    from comsim.twin.colors import estimate_colors
    from comsim.twin.localize import EvidenceMaps
    from comsim.twin.prints import body_pixels

    ap = argparse.ArgumentParser(description="printed cubes' colours and print coverage against plain ones")
    ap.add_argument("prints")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_prints"))
    a = ap.parse_args(argv)
    spec = load_scene_spec(PANDA_PUSH_CELL)
    rows = {}
    for variant, prints in PRINTS.items():
        real = a.out / variant / "lab"
        if not real.is_dir():
            cell = load_lab_cell(CELLS["workshop"], [] if prints is None else [f"look.prints={prints}"])
            record_dataset("push", episodes=a.episodes, out=real, seed=a.seed, cell=cell, calibration_stills=1)
        for e in range(a.episodes):
            f = true_first_frames(real, e, spec)
            maps = EvidenceMaps(f["image"], {o.name: o.rgba for o in spec.objects}, 8.0, f["still"], f["arm"])
            found = {o.name: body_pixels(maps, o, f["poses"][o.name], f["K"], f["T"], o.rgba) for o in spec.objects}
            poses = {n: (np.array([x, y, 0.025]), yaw_quat(w)) for n, (x, y, w) in f["poses"].items()}
            seen = aligned_spec(spec, "front", f["T"], f["K"], f["image"].shape[1], f["image"].shape[0])
            for mode, body in (("all", None), ("body", {n: b["body"] for n, b in found.items() if b and b["print_pixels"]})):
                c = estimate_colors(seen, "front", f["image"], f["state"][:7].astype(np.float64), float(f["state"][7]),
                                    poses, body=body)
                for o in spec.objects:
                    row = rows.setdefault((variant, e, o.name), {"print_coverage": (found[o.name] or {}).get(
                        "print_coverage")})
                    row[f"rgb_{mode}"] = [round(float(v), 3) for v in c["objects"][o.name][:3]]
    out = {"bench": "twin_prints", "episodes": a.episodes, "seed": a.seed, "variants": {}}
    for variant in PRINTS:
        per = out["variants"][variant] = {}
        for o in spec.objects:
            r = [rows[(variant, e, o.name)] for e in range(a.episodes)]
            plain = [rows[("plain", e, o.name)] for e in range(a.episodes)]
            per[o.name] = {"print_coverage": [x["print_coverage"] for x in r],
                           "rgb_body": [x["rgb_body"] for x in r],
                           **{f"off_plain_{m}": round(float(np.mean([np.linalg.norm(np.subtract(x[f"rgb_{m}"], p[f"rgb_{m}"]))
                                                                     for x, p in zip(r, plain)])), 3)
                              for m in ("all", "body")}}
    write_json(out, a.out / "prints.json", indent=1)
    print(json.dumps(out))
    return out


def plot_main(argv=None) -> dict:
    """Predicted 95% bound against actual error, one marker per placement: a bound holds below the diagonal."""
    ap = argparse.ArgumentParser(description="calibration plot of a placements run")
    ap.add_argument("plot")
    ap.add_argument("placements", type=Path)
    ap.add_argument("png", type=Path)
    a = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench/twin_lab.py plot: needs matplotlib (pip install matplotlib)") from None
    rows = [r for r in json.loads(a.placements.read_text())["placements"] if r["bound_95_m"] is not None]
    fig, ax = plt.subplots(figsize=(5.2, 5.0), dpi=120)
    lim = max(100 * max(max(r["bound_95_m"] for r in rows), max(r["error_m"] for r in rows)) * 1.05, 2.2)  # 2 cm in view
    colours = {"default": "#4c72b0", "cool_studio": "#55a868", "workshop": "#c44e52"}
    for cell in colours:
        for flagged, marker in ((False, "o"), (True, "x")):
            sel = [r for r in rows if r["cell"] == cell and r["flagged"] == flagged]
            if sel:
                ax.scatter([100 * r["bound_95_m"] for r in sel], [100 * r["error_m"] for r in sel], s=22,
                           marker=marker, color=colours[cell], alpha=0.8,
                           label=f"{cell}, {'flagged' if flagged else 'trusted'} ({len(sel)})")
    ax.plot([0, lim], [0, lim], "k--", lw=1, label="error = bound")
    ax.axvline(2.0, color="grey", lw=0.8, ls=":")
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.set_xlim(0, lim)
    ax.set_ylim(0, lim)
    ax.set_xlabel("predicted 95% bound (cm)")
    ax.set_ylabel("actual first-frame position error (cm)")
    held = sum(r["error_m"] <= r["bound_95_m"] for r in rows)
    ax.set_title(f"bound holds for {held} of {len(rows)} placements", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    a.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.png)
    out = {"bench": "twin_placements_plot", "png": str(a.png), "placements": len(rows), "bound_holds": held}
    print(json.dumps(out))
    return out


def main(argv=None) -> dict:
    import sys
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "placements":
        return placements_main(args)
    if args and args[0] == "plot":
        return plot_main(args)
    if args and args[0] == "prints":
        return prints_main(args)
    if args and args[0] == "fits":
        return fits_main(args)
    return replay_main(args)


if __name__ == "__main__":
    main()
