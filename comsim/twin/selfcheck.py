"""The twin checks itself: residuals it computes without any truth, and what it cannot trust.

After calibration and localization, on the recording alone:

- camera, per calibration frame: the calibration's IoU (the twin's robot silhouette at the
  fitted pose against the robot mask of that still, ``calibrate.py``). Frames under
  ``FRAME_IOU_MIN`` are named; the camera is unreliable when the frames the fit trusted
  average under it, or when more than half the frames are under it.
- camera, per episode: how far the static scene moved from the robot-free still, frame by frame
  (``camera_motion.episode_motion``). Past ``camera_motion.MOVED_MIN_PX`` the episode is rendered
  with its camera's motion and its objects are localized with it (a camera bumped after its
  stills); an offset past ``CAMERA_SHIFT_MAX_PX`` makes the episode's camera unreliable (calibrate
  again).
- each object, each episode (``object_residual``): its silhouette rendered at the estimated
  pose against the region of the first frames (``replay.first_image``) that shows an object
  there: the object's evidence (``localize.EvidenceMaps``: its colour, and with a still any
  change from it that is not a shadow) over 0.5, the connected parts of it that touch the
  silhouette. The residual is their IoU over the pixels the arm leaves visible. The object
  is unreliable when it was not found, when that IoU is under ``OBJECT_IOU_MIN``, when its
  own colour is absent inside the silhouette (``COLOUR_MIN``), when another object's colour
  shows there more than its own (``COLOUR_MARGIN``), when the arm hides most of it, or when its position
  uncertainty (``uncertainty.py``: the calibration's residual, the silhouette fit's sensitivity, how much
  of it is seen and how clearly, the camera's motion) gives a 95% bound over ``BOUND_M``.

The object thresholds were set on lab recordings scored against the lab's truth (the
twin never reads it): object placements within 2 cm of the truth gave IoUs of 0.49-0.90 and
own-colour evidence of 0.17 and up; placements 65-73 cm off (a cube on the edge of a table of
its own hue) gave 0.17-0.35, and a twin object that the cell does not have gave colour
evidence under 0.04. At 128 px a cube is 5-9 px wide: the residual catches an object put
where there is none, not one off by a centimetre or two; the position uncertainty is what speaks to
those.

``check_alignment`` gathers these into the ``self_check`` section of twin_alignment.json
(copied into alignment_report.json); ``unreliable_message`` says what is wrong by name.
"""
from __future__ import annotations

import cv2
import numpy as np

from comsim.errors import ComSimError
from comsim.sim.spec import ObjectSpec
from comsim.twin.camera_motion import MOVED_MIN_PX
from comsim.twin.uncertainty import BOUND_M
from comsim.twin.localize import EvidenceMaps, coverage, silhouette_window

ON_UNRELIABLE = ("refuse", "mark")  # what a replay does with a twin that fails its self-check
FRAME_IOU_MIN = 0.8  # calibration: frames under this are named; the trusted frames' mean must reach it
CAMERA_SHIFT_MAX_PX = 2.0  # an episode's camera moved too far since its calibration to trust
OBJECT_IOU_MIN = 0.4  # object: silhouette vs observed region
COLOUR_MIN = 0.1  # object: mean evidence of its own colour inside its silhouette
VISIBLE_MIN = 0.5  # object: share of its silhouette that the arm leaves visible in the first frames
COLOUR_MARGIN = 0.25  # object: another object's colour evidence beats its own by this much inside its silhouette


class UnreliableTwinError(ComSimError, ValueError):
    """The twin failed its self-check and the replay was asked to refuse (``on_unreliable="refuse"``)."""


def object_residual(maps: EvidenceMaps, obj: ObjectSpec, pose, K, T) -> dict:
    """Residual of one object at ``pose`` (x, y, yaw) against the evidence ``maps`` of the first frames
    (every object's colour; the arm's pixels excluded; nothing claimed).

    Returns silhouette_iou (the silhouette against the observed region: the object's evidence over
    0.5, the connected parts of it that touch the silhouette), visible (share of the silhouette the
    arm leaves visible), own_colour / other_colour (mean colour evidence inside the silhouette: this
    object's, and the best other object's, named other_object).
    """
    H, W = maps.img.shape[:2]
    win = silhouette_window(obj, pose, K, T, W, H)
    if win is None:
        return {"silhouette_iou": 0.0, "visible": 0.0, "own_colour": 0.0, "other_colour": 0.0,
                "other_object": None, "outside_image": True}
    x0, y0, x1, y1 = win
    top, side = coverage(obj, pose, K, T, win)
    sil = (top + side) > 0.5
    seen = maps.free[y0:y1, x0:x1]
    found = _observed(maps, obj.name, win)
    n, lab = cv2.connectedComponents(found.astype(np.uint8), connectivity=8)
    near = np.unique(lab[cv2.dilate(sil.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0])
    region = np.isin(lab, near[near > 0])
    inter, union = (sil & region & seen).sum(), ((sil | region) & seen).sum()
    inside = sil & seen
    colour = {n: float(m[y0:y1, x0:x1][inside].mean()) if inside.any() else 0.0 for n, m in maps.like.items()}
    others = {n: v for n, v in colour.items() if n != obj.name}
    other = max(others, key=others.get) if others else None
    return {"silhouette_iou": float(inter / union) if union else 0.0,
            "visible": float(inside.sum() / max(sil.sum(), 1)),
            "own_colour": colour[obj.name], "other_colour": others.get(other, 0.0), "other_object": other}


def _observed(maps: EvidenceMaps, name: str, win) -> np.ndarray:
    """Inside ``win``: the pixels that show an object there, as the localizer's candidates see them: with a
    still, the object's evidence (colour or change) over 0.5; without one, its colour evidence over 0.3 with
    one-pixel gaps closed (colour alone is patchy on a textured table)."""
    x0, y0, x1, y1 = win
    ev = maps.evidence(name)[y0:y1, x0:x1]
    if maps.change is not None:
        return ev > 0.5
    return cv2.morphologyEx((ev > 0.3).astype(np.uint8), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8)) > 0


def object_verdict(res: dict) -> str | None:
    """Why an object's residual makes it unreliable, or None when it passes."""
    if res.get("not_found"):
        return "not found in the first frames (no blob of its colour, or of change from the robot-free still, fits it)"
    if res.get("outside_image"):
        return "its silhouette at the estimated pose is outside the image"
    if res["visible"] < VISIBLE_MIN:
        return f"the arm hides {100 * (1 - res['visible']):.0f}% of it in the first frames"
    if res["silhouette_iou"] < OBJECT_IOU_MIN:
        return (f"silhouette IoU {res['silhouette_iou']:.2f} with the region that shows an object there "
                f"(threshold {OBJECT_IOU_MIN})")
    if res["own_colour"] < COLOUR_MIN:
        return (f"no sign of its colour inside its silhouette (mean colour evidence {res['own_colour']:.2f}, "
                f"threshold {COLOUR_MIN})")
    if res["other_object"] is not None and res["other_colour"] > res["own_colour"] + COLOUR_MARGIN:
        return (f"its silhouette shows {res['other_object']}'s colour ({res['other_colour']:.2f}) more than its own "
                f"({res['own_colour']:.2f}; margin {COLOUR_MARGIN})")
    bound = (res.get("uncertainty") or {}).get("bound_95_m")
    if bound is not None and bound > BOUND_M:
        parts = res["uncertainty"]["parts_px"]
        return (f"its position is only known to {100 * bound:.1f} cm (95% bound; threshold {100 * BOUND_M:.0f} cm): "
                f"{100 * res['uncertainty']['m_per_px']:.1f} cm per pixel there, 1 sd of "
                + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()) + " px")
    return None


def camera_check(calibration: dict) -> dict:
    """The calibration's per-frame IoU against ``FRAME_IOU_MIN``: the frames under it by name,
    and whether the frames the fit trusted reach it on average (None when the calibration
    was given without per-frame IoUs)."""
    per_frame = calibration.get("per_frame_iou") or {}
    if not per_frame:
        return {"per_frame_iou": {}, "frames_under_threshold": [], "threshold": FRAME_IOU_MIN, "reliable": None}
    outliers = set(calibration.get("outlier_frames") or [])
    trusted = [v for k, v in per_frame.items() if k not in outliers] or list(per_frame.values())
    mean = float(np.mean(trusted))
    under = [k for k, v in per_frame.items() if v < FRAME_IOU_MIN]
    return {"per_frame_iou": {k: round(float(v), 4) for k, v in per_frame.items()}, "frames_under_threshold": under,
            "trusted_mean_iou": round(mean, 4), "threshold": FRAME_IOU_MIN,
            "reliable": bool(mean >= FRAME_IOU_MIN and len(under) <= len(per_frame) / 2)}


def camera_shift_verdict(motion) -> str | None:
    """Why an episode's camera motion since the calibration stills (``camera_motion.summary``) makes it
    unreliable."""
    if motion is None:
        return None
    d = float(np.hypot(*motion["offset_px"]))
    if d <= CAMERA_SHIFT_MAX_PX:
        return None
    return (f"the camera moved by {d:.1f} px since the calibration stills (threshold {CAMERA_SHIFT_MAX_PX} px): "
            "calibrate again")


def check_alignment(calibration: dict, objects: dict[int, dict[str, dict]], motions: dict | None = None) -> dict:
    """The self-check section: ``objects`` {episode: {name: object_residual(...)}} with each
    object's verdict, the camera's (``calibration``'s per-frame IoU; ``motions`` {episode:
    ``camera_motion.summary``}, how far each episode's static scene moved from the robot-free still),
    and the unreliable ones listed by name."""
    cam = camera_check(calibration)
    motions = motions or {}
    cam["episode_shift_px"] = {str(e): v["offset_px"] for e, v in sorted(motions.items()) if v is not None}
    cam["episode_motion"] = {str(e): {k: v[k] for k in ("moved", "offset_px", "drift_px", "residual_px",
                                                         "offset_sd_px")}
                             for e, v in sorted(motions.items()) if v is not None}
    cam["episodes_moved"] = {str(e): why for e, v in sorted(motions.items()) if (why := camera_shift_verdict(v))}
    episodes, unreliable = {}, []
    for e, per_obj in sorted(objects.items()):
        rows = {}
        for name, res in per_obj.items():
            why = object_verdict(res)
            rows[name] = {**{k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()},
                          "reliable": why is None, **({"why": why} if why else {})}
            if why:
                unreliable.append({"episode": int(e), "object": name, "why": why,
                                   "silhouette_iou": rows[name].get("silhouette_iou"),
                                   "bound_95_m": (res.get("uncertainty") or {}).get("bound_95_m")})
        episodes[str(e)] = rows
    out = {"thresholds": {"object_silhouette_iou": OBJECT_IOU_MIN, "object_colour": COLOUR_MIN,
                          "object_visible": VISIBLE_MIN,
                          "object_colour_margin": COLOUR_MARGIN, "camera_frame_iou": FRAME_IOU_MIN,
                          "camera_shift_compensated_px": MOVED_MIN_PX, "camera_shift_px": CAMERA_SHIFT_MAX_PX,
                          "object_bound_95_m": BOUND_M},
           "camera": cam, "objects": episodes, "unreliable_objects": unreliable,
           "reliable": bool(not unreliable and cam["reliable"] is not False and not cam["episodes_moved"])}
    return out


MAX_NAMED = 6  # object placements a refusal names one by one


def unreliable_message(check: dict, where: str) -> str | None:
    """One message naming what the twin cannot trust (None when everything passes)."""
    parts = []
    cam = check["camera"]
    if cam["reliable"] is False:
        parts.append(f"the camera: calibration IoU under {cam['threshold']} in {len(cam['frames_under_threshold'])} of "
                     f"{len(cam['per_frame_iou'])} frames, trusted frames' mean {cam['trusted_mean_iou']:.3f}")
    for e, why in cam.get("episodes_moved", {}).items():
        parts.append(f"the camera in episode {e}: {why}")
    objs = check["unreliable_objects"]
    for u in objs[:MAX_NAMED]:
        parts.append(f"{u['object']} in episode {u['episode']}: {u['why']}")
    if len(objs) > MAX_NAMED:
        parts.append(f"{len(objs) - MAX_NAMED} more object placements (listed in the self-check)")
    if not parts:
        return None
    return f"{where}: the twin cannot trust " + "; ".join(parts)


def log_self_check(check: dict, log=print) -> None:
    """Print the self-check: every frame and object past its threshold by name, or that all passed."""
    cam = check["camera"]
    if cam["frames_under_threshold"]:
        log(f"[self-check] calibration frames under IoU {cam['threshold']}: "
            + ", ".join(f"{n} {cam['per_frame_iou'][n]:.3f}" for n in cam["frames_under_threshold"]))
    if cam["reliable"] is False:
        log(f"[self-check] UNRELIABLE camera: trusted frames' mean IoU {cam['trusted_mean_iou']:.3f} "
            f"< {cam['threshold']}")
    for e, why in cam.get("episodes_moved", {}).items():
        log(f"[self-check] UNRELIABLE camera in episode {e}: {why}")
    moved = {e: v for e, v in cam.get("episode_motion", {}).items() if v["moved"]}
    if moved:
        log("[self-check] camera moved since the calibration stills (rendered and localized with its motion): "
            + ", ".join(f"episode {e} {np.hypot(*v['offset_px']):.2f} px (drift {v['drift_px']:.2f})"
                        for e, v in moved.items()))
    for u in check["unreliable_objects"]:
        log(f"[self-check] UNRELIABLE {u['object']} in episode {u['episode']}: {u['why']}")
    if check["reliable"]:
        ious = [r["silhouette_iou"] for per in check["objects"].values() for r in per.values()]
        log(f"[self-check] passed: {len(ious)} object placements, silhouette IoU >= "
            f"{min(ious, default=float('nan')):.2f} (threshold {OBJECT_IOU_MIN})"
            + ("" if cam["reliable"] is None else f"; camera: trusted frames' mean IoU {cam['trusted_mean_iou']:.3f}"))


def episode_verdict(check: dict, episode: int) -> dict | None:
    """What the self-check distrusts in one episode ({"objects": {name: why}, "camera": why}), or None."""
    out = {}
    objs = {u["object"]: u["why"] for u in check["unreliable_objects"] if u["episode"] == episode}
    if objs:
        out["objects"] = objs
    if check["camera"]["reliable"] is False:
        out["camera"] = f"trusted calibration frames' mean IoU {check['camera']['trusted_mean_iou']:.3f}"
    elif str(episode) in check["camera"].get("episodes_moved", {}):
        out["camera"] = check["camera"]["episodes_moved"][str(episode)]
    return out or None
