"""The report's twin section: is the twin where the real cell is?

Reads what the twin's replay leaves in the paired dataset (``comsim.twin.replay``):

    paired/twin_alignment.json      camera (K, T_cam_from_base), calibration (per-frame IoU,
                                    outlier frames, its source), colours
    paired/alignment_report.json    per-episode robot IoU, the twin's self-check (or, when the
                                    replay refused, the self-check alone) and, for a lab recording (its real
                                    dataset has lab_truth.json), camera / object errors
                                    against the truth (also copied to twin/summary.json)
    paired/report/episode*.png      episode frames with the twin's silhouette edges

Calibration-still overlays (each still with the fitted silhouette) come from ``comsim twin
calibrate --out DIR`` (``DIR/overlays/``); they are looked for next to the calibration the
replay used, under ``paired/report/`` (any PNG not named ``episode*``) and in
``twin/calibration/overlays/``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from comsim.report.html import Report, fmt_number, fmt_seconds, read_json
from comsim.report.plots import frame_values_svg
from comsim.run_layout import RunLayout

MAX_OVERLAYS = 4


def twin_section(rep: Report, run: Path) -> None:
    layout = RunLayout(run)
    paired = layout.paired
    al = read_json(paired / "twin_alignment.json")
    report = read_json(paired / "alignment_report.json") or read_json(layout.twin_summary)
    if al is None and report is None:
        rep.absent("not run: no twin alignment in this run folder (paired/twin_alignment.json, written by "
                   "`comsim twin replay`)")
        return
    calib = dict((al or {}).get("calibration") or (report or {}).get("calibration") or {})
    calib.update(_calibration_file(calib))
    _calibration(rep, run, paired, calib)
    if al is not None:
        _camera(rep, al, report)
    _self_check(rep, al, report)
    _episodes(rep, paired, report)


def _calibration_file(calib: dict) -> dict:
    """The fields of the calibration.json the replay was given (``--calibration``), if any:
    its per-frame IoU and outliers with their reasons."""
    src = calib.get("source")
    if not src or not str(src).endswith(".json"):
        return {}
    doc = read_json(Path(src))
    if not isinstance(doc, dict):
        return {}
    return {k: doc[k] for k in ("per_frame_iou", "outlier_frames", "outliers", "mean_iou_trusted") if k in doc}


# -- camera calibration --------------------------------------------------------------------------
def _calibration(rep: Report, run: Path, paired: Path, calib: dict) -> None:
    rep.heading("Camera calibration", 3)
    if not calib:
        rep.absent("calibration not recorded: twin_alignment.json has no 'calibration'")
        return
    per_frame = calib.get("per_frame_iou") or {}
    outliers = list(calib.get("outlier_frames") or [])
    reasons = calib.get("outliers") or {}
    trusted = [v for n, v in per_frame.items() if n not in outliers]
    rep.table([{"source": calib.get("source", "-"), "converged": calib.get("converged", "-"),
                "mean IoU (all frames)": calib.get("mean_iou"),
                "mean IoU (trusted frames)": calib.get("mean_iou_trusted", float(np.mean(trusted)) if trusted else "-"),
                "frames": len(per_frame) or "-", "outlier frames": len(outliers) if per_frame else "-",
                "masks": calib.get("mask_source", "-"), "time": fmt_seconds(calib.get("seconds"))}],
              caption="robot-silhouette calibration: IoU of the twin's robot silhouette with the robot mask in "
                      "each calibration frame, at the fitted camera pose")
    if per_frame:
        vals = list(per_frame.items())
        marked = {n: _reason(reasons.get(n)) for n in outliers}
        rep.raw("<div class='row'>" + frame_values_svg(
            vals, marked, title=f"Calibration IoU per frame ({len(vals)} frames, {len(outliers)} outliers)",
            reference=float(np.mean(trusted)) if trusted else None) + "</div>")
        rep.text("x: frame index (hover a dot for its name); dashed line: mean of the trusted frames.")
        if outliers:
            names = list(per_frame)
            rep.table([{"frame": n, "index": names.index(n) if n in names else "-", "IoU": per_frame.get(n),
                        "why flagged": marked[n]} for n in outliers], caption="outlier frames (left out of the fit)")
    else:
        rep.absent("per-frame IoU not recorded: the replay used a given calibration "
                   f"({calib.get('source', '?')}) that does not list it")
    overlays = _calibration_overlays(run, paired, calib)
    if overlays:
        pick = _pick_overlays(overlays, set(outliers))
        rep.row([rep.image_figure(p, p.stem + (" (outlier)" if p.stem in outliers else "")) for p in pick],
                caption=f"calibration frames with the fitted silhouette's outline: green twin, magenta the mask "
                        f"it was fitted to ({len(pick)} of {len(overlays)} overlays in {overlays[0].parent})")
    else:
        rep.absent("calibration overlays not written: the replay calibrated from "
                   f"{calib.get('source', '?')} without writing overlays; `comsim twin calibrate STILLS --out "
                   f"{RunLayout(run).twin / 'calibration'}` writes them (and a calibration.json for --calibration)")


def _reason(o) -> str:
    if not isinstance(o, dict):
        return "flagged (reason not recorded)"
    why = str(o.get("reason", "flagged"))
    return why + (f"; best joints {o['best_joint_vector']}" if o.get("best_joint_vector") is not None else "")


def _calibration_overlays(run: Path, paired: Path, calib: dict) -> list[Path]:
    places = []
    src = calib.get("source")
    if src and str(src).endswith(".json"):
        places.append(Path(src).parent / "overlays")
    places += [RunLayout(run).twin / "calibration" / "overlays"]
    for d in places:
        found = sorted(d.glob("*.png")) if d.is_dir() else []
        if found:
            return found
    return sorted(p for p in (paired / "report").rglob("*.png") if not p.name.startswith("episode"))


def _pick_overlays(paths: list[Path], outliers: set[str]) -> list[Path]:
    """Outliers first, then frames spread over the rest."""
    bad = [p for p in paths if p.stem in outliers][:MAX_OVERLAYS]
    rest = [p for p in paths if p.stem not in outliers]
    k = MAX_OVERLAYS - len(bad)
    if k > 0 and rest:
        rest = [rest[i] for i in np.unique(np.linspace(0, len(rest) - 1, min(k, len(rest))).astype(int))]
    return bad + (rest if k > 0 else [])


# -- camera pose ---------------------------------------------------------------------------------
def _camera(rep: Report, al: dict, report: dict | None) -> None:
    rep.heading("Camera pose", 3)
    T = np.asarray(al.get("T_cam_from_base"), np.float64)
    if T.shape != (4, 4):
        rep.absent("camera pose not recorded: twin_alignment.json has no 4x4 T_cam_from_base")
        return
    R, t = T[:3, :3], T[:3, 3]
    pos, look = -R.T @ t, R.T @ np.array([0.0, 0.0, 1.0])
    K = al.get("K") or [None] * 4
    row = {"camera": al.get("camera", "-"), "image": f"{al.get('width')}x{al.get('height')}",
           "position in base frame (m)": ", ".join(f"{v:.3f}" for v in pos),
           "looks along": ", ".join(f"{v:.2f}" for v in look),
           "fx, fy, cx, cy (px)": ", ".join(fmt_number(v) for v in K[:4]),
           "lens distortion": "none" if not al.get("dist") else f"{len(al['dist'])} coefficients"}
    s = (report or {}).get("summary") or {}
    if "camera_position_error_m" in s:
        row["position error vs truth"] = f"{1000 * s['camera_position_error_m']:.1f} mm"
        row["rotation error vs truth"] = f"{s['camera_rotation_error_deg']:.2f} deg"
    rep.table([row], caption="the calibrated camera (OpenCV convention: z forward, y down)")
    if report is None:
        rep.absent("errors against the truth not computed: no alignment report (paired/alignment_report.json; "
                   "the replay ran with --no-report)")
    elif "camera_position_error_m" not in s:
        rep.absent(f"no truth available: {report.get('real', 'the real dataset')} has no lab_truth.json "
                   "(a real cell); camera and object errors can only be scored in the lab")
    colors = (al.get("colors") or {}).get("residual")
    if isinstance(colors, dict) and colors:
        rep.text("colour match residuals (RGB levels, lower is closer): "
                 + ", ".join(f"{k} {fmt_number(v)}" for k, v in colors.items()))


# -- self-check ----------------------------------------------------------------------------------
def _self_check(rep: Report, al: dict | None, report: dict | None) -> None:
    """The residuals the twin computed without truth (``comsim.twin.selfcheck``), per episode, beside the
    errors against the truth where a lab recording has them."""
    rep.heading("Self-check (the twin's own residuals, no truth)", 3)
    check = (al or {}).get("self_check") or (report or {}).get("self_check")
    if not isinstance(check, dict) or "objects" not in check:
        rep.absent("not recorded: this alignment was written without the twin's self-check (comsim.twin.selfcheck)")
        return
    th, cam = check.get("thresholds") or {}, check.get("camera") or {}
    refused = (report or {}).get("refused")
    if refused:
        rep.warn(f"The replay refused, so nothing after it ran: {refused}")
    elif not check.get("reliable", True):
        rep.warn(f"The twin distrusts {len(check.get('unreliable_objects') or [])} object placements"
                 + (f" and the camera in {len(cam.get('episodes_moved') or {})} episodes" if cam.get("episodes_moved")
                    else "") + ": the episodes concerned were replayed and marked twin_unreliable in their provenance "
                 "(--on-unreliable mark)")
    else:
        rep.ok("Passed: every object's silhouette matches what the first frames show there, and the camera's "
               "calibration frames agree with it.")
    under = cam.get("frames_under_threshold") or []
    rep.table([{"calibration frames under IoU " + fmt_number(th.get("camera_frame_iou")):
                ", ".join(under) if under else "none",
                "trusted frames' mean IoU": cam.get("trusted_mean_iou", "-"),
                "camera": {True: "reliable", False: "UNRELIABLE", None: "no per-frame IoU (given calibration)"}
                .get(cam.get("reliable"), "-")}],
              caption="camera: the calibration's IoU per frame (plotted above) against the threshold")
    truth = {e.get("real_episode"): e for e in (report or {}).get("episodes") or []}
    moved = cam.get("episodes_moved") or {}
    motion = cam.get("episode_motion") or {}
    rows = []
    for e, per in (check.get("objects") or {}).items():
        row = {"episode": e}
        if e in motion:
            m = motion[e]
            row["camera shift from the stills"] = (f"{np.hypot(*m['offset_px']):.2f} px, drift {m['drift_px']:.2f}"
                                                   + (" UNRELIABLE" if e in moved else " (followed)" if m["moved"]
                                                      else ""))
        for name, r in per.items():
            iou, bound = r.get("silhouette_iou"), (r.get("uncertainty") or {}).get("bound_95_m")
            row[f"{name} silhouette IoU"] = ("-" if iou is None else f"{iou:.2f}") + (
                "" if r.get("reliable", True) else f" UNRELIABLE: {r.get('why', '')}")
            if bound is not None:
                row[f"{name} 95% bound"] = _cm(bound)
        errs = (truth.get(int(e)) or {}).get("object_initial_error_m_refined") or \
            (truth.get(int(e)) or {}).get("object_initial_error_m")
        if errs:
            row["initial error vs truth"] = _per_object_cm(errs)
        rows.append(row)
    rep.table(rows, caption=f"objects: each one's silhouette at its estimated pose against the region of the first "
                            f"frames that shows an object there (IoU; unreliable under "
                            f"{fmt_number(th.get('object_silhouette_iou'))}, when its own colour evidence inside it is "
                            f"under {fmt_number(th.get('object_colour'))}, when another object's colour shows there "
                            f"more, when the arm hides it, or when the radius holding 95% of its position uncertainty "
                            f"crosses {_cm(th.get('object_bound_95_m'))}); the camera's shift from the calibration "
                            f"stills over the episode (offset, and how far its slow drift strays from it; the replay "
                            f"follows it frame by frame over {fmt_number(th.get('camera_shift_compensated_px'))} px, "
                            f"unreliable over {fmt_number(th.get('camera_shift_px'))} px)")
    _uncertainty_vs_truth(rep, (report or {}).get("summary") or {})


def _uncertainty_vs_truth(rep: Report, s: dict) -> None:
    """The position uncertainty and the camera motion scored against a lab recording's truth, where it has one."""
    u, m = s.get("uncertainty_vs_truth"), s.get("camera_motion_vs_truth")
    if u:
        cov = u.get("bound_coverage")
        rep.table([{"placements": u["placements"],
                    "95% bound holds": f"{u['bound_holds']} of {u['with_bound']}"
                                       + ("" if cov is None else f" ({100 * cov:.0f}%)"),
                    f"within {_cm(u['limit_m'])}, flagged": f"{u['within_limit_flagged']} of {u['within_limit']}",
                    f"over {_cm(u['limit_m'])}, flagged": f"{u['over_limit_flagged']} of {u['over_limit']}"}],
                  caption="the twin's position uncertainty against the lab's truth (first-frame placements): the bound "
                          "should hold for 95% of them, and a placement the twin trusts should be within the limit")
    if m:
        rep.table([{"episodes": len(m["episodes"]), "error mean": f"{m['error_px_mean']:.3f} px",
                    "error rms": f"{m['error_px_rms']:.3f} px", "error max": f"{m['error_px_max']:.3f} px"}],
                  caption="the camera's motion since the stills as the replay followed it, against the lab's own "
                          "(image shift at the image centre, every frame)")


# -- episodes ------------------------------------------------------------------------------------
def _episodes(rep: Report, paired: Path, report: dict | None) -> None:
    rep.heading("Replayed episodes", 3)
    if report is None:
        rep.absent("alignment report not written (paired/alignment_report.json): the replay ran with --no-report "
                   "or without the 'seg' channel; rerun `comsim twin replay` with the same arguments, without "
                   "--no-report, to write it")
    else:
        s = report.get("summary") or {}
        truth = "camera_position_error_m" in s
        if truth:
            yaw = s.get("object_yaw_error_deg_mean_first_frame")
            if yaw is None:  # the summary has it only beside refined numbers; the episodes always do
                yaws = [v for e in report.get("episodes") or [] for v in (e.get("object_yaw_error_deg") or {}).values()]
                yaw = float(np.mean(yaws)) if yaws else None
            rows = [{"": "first-frame localization", "initial position error mean / max":
                     _cm_pair(s, "object_initial_error_m_mean", "object_initial_error_m_max"),
                     "yaw error mean": _deg(yaw)}]
            if "object_initial_error_m_mean_refined" in s:
                rows.append({"": "after whole-video refinement", "initial position error mean / max":
                             _cm_pair(s, "object_initial_error_m_mean_refined", "object_initial_error_m_max_refined"),
                             "yaw error mean": _deg(s.get("object_yaw_error_deg_mean_refined"))})
            rep.table(rows, caption="object localization against the lab's truth"
                      + ("" if len(rows) > 1 else " (no whole-video refinement recorded)"))
            n = len(report.get("episodes") or [])
            rep.table([{"robot IoU vs derived masks": s.get("mean_robot_iou_vs_derived_masks"),
                        "robot IoU vs true masks": s.get("mean_robot_iou_vs_true_masks"),
                        "object trajectory error mean / max": _cm_pair(s, "object_trajectory_error_m_mean",
                                                                       "object_trajectory_error_m_max"),
                        "episodes within 2 cm": f"{s.get('episodes_within_2cm', '-')} of {n}"}],
                      caption="replay against the lab's truth (object trajectory: twin vs true object "
                              "positions over every frame)")
        else:
            rep.table([{"robot IoU vs derived masks": s.get("mean_robot_iou_vs_derived_masks")}],
                      caption="replay: the twin's robot silhouette vs robot masks derived from the real frames")
        rows = []
        for e in report.get("episodes") or []:
            r = {"episode": e.get("episode"), "IoU vs derived": e.get("robot_iou_vs_derived_masks")}
            if truth:
                r["IoU vs truth"] = e.get("robot_iou_vs_true_masks")
                r["initial error"] = _per_object_cm(e.get("object_initial_error_m_refined")
                                                    or e.get("object_initial_error_m"))
                r["trajectory error mean"] = _per_object_cm(e.get("object_trajectory_error_m_mean"))
                r["trajectory error max"] = _per_object_cm(e.get("object_trajectory_error_m_max"))
            rows.append(r)
        rep.table(rows, caption="per episode (object errors per object, refined initial pose where refined)")
    overlays = sorted((paired / "report").glob("episode*.png"))
    if overlays:
        pick = overlays[:MAX_OVERLAYS]
        rep.row([rep.image_figure(p, p.stem.replace("_", " ")) for p in pick],
                caption=f"episode frames with the twin's robot silhouette outline in green"
                        f"{' and the true robot mask in magenta' if report and _has_truth(report) else ''} "
                        f"({len(pick)} of {len(overlays)} in paired/report/)")
    else:
        rep.absent("episode overlays not written: no paired/report/episode*.png (they are written with the "
                   "alignment report; the replay ran with --no-report)")


def _has_truth(report: dict) -> bool:
    return "camera_position_error_m" in (report.get("summary") or {})


def _cm(v) -> str:
    return f"{100 * v:.1f} cm" if isinstance(v, (int, float)) and np.isfinite(v) else "-"


def _cm_pair(s: dict, a: str, b: str) -> str:
    if a not in s and b not in s:
        return "-"
    return f"{_cm(s.get(a))} / {_cm(s.get(b))}"


def _deg(v) -> str:
    return f"{v:.1f} deg" if isinstance(v, (int, float)) and np.isfinite(v) else "-"


def _per_object_cm(d) -> str:
    if not isinstance(d, dict) or not d:
        return "-"
    return ", ".join(f"{k} {_cm(v)}" for k, v in d.items())
