"""The twin against the lab's hidden truth: a full replay of the built-in lab, or its object placements
and their position uncertainty on several cells.

    # record N scripted episodes of the built-in lab, replay them (camera from the episodes' own frames)
    MUJOCO_GL=egl nice python bench/twin_lab.py [--task push] [--episodes 10] [--out runs/bench_twin]

    # every object placement of the cells' recordings (recorded with calibration stills when absent) against
    # the twin's 95% bound: alignment only (calibration, camera motion, localization, self-check), no replay
    MUJOCO_GL=egl nice python bench/twin_lab.py placements --cells default cool_studio workshop \\
        --seeds 0 --episodes 15 --out runs/bench_placements [--recording workshop:0=runs/ws_lab ...]

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
    lim = 100 * max(max(r["bound_95_m"] for r in rows), max(r["error_m"] for r in rows)) * 1.05
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
    return replay_main(args)


if __name__ == "__main__":
    main()
