"""Object fidelity: are the objects and the robot in a generated frame where the twin put them?

A pseudo-real episode has no real counterpart, but it has the twin's segmentation of every
frame (``<cam>_sim_seg``, labels of CONTRACTS.md: 0 background, 1 robot, 2 + i object i).
So the question "is the cube there?" has an answer without a real video:

- **objects**: each object label is located in the generated frame by a colour model
  P(object | colour) (``comsim.metrics.action.RobotColourModel``, fit object-vs-rest on REAL
  frames with their twin labels, never on generated ones), with equal priors (the search window
  is small, so the object's global rarity is not its prior there). The search is local: in a window of
  +-6 px (at 128 px; ``search_radius``) around the twin's centroid of the object, the connected
  component of ``P > 0.5`` with the most probability mass is the located object, and its centroid
  is compared with the twin's. An object drawn farther away than the window, or not drawn, is a
  miss. Per frame: the error in px, and
  whether it is within ``within_px`` (2 px). Frames where the twin shows fewer than
  ``min_visible_px`` pixels of the object (occluded by the arm, out of view) are not scored;
  a frame where nothing is located counts as a miss (error inf).
- **robot**: the IoU of the robot located the same way (pixels with P(robot | colour) > 0.5)
  with the twin's robot mask.

The estimator knows only colours, so it has a ceiling: the same measure on the REAL frames
of paired episodes against the twin's replay of them (``reference=True`` callers). Report
both; a generated frame cannot be judged more precisely than the estimator locates a real one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from comsim.io.keys import seg_key
from comsim.metrics.action import ROBOT_LABEL, RobotColourModel, mask_iou

WITHIN_PX = 2.0
MIN_VISIBLE_PX = 4
SEARCH_RADIUS_FRACTION = 6 / 128


def labels_from_palette(seg_frames: np.ndarray, size: tuple[int, int] | None = None) -> np.ndarray:
    """Twin label video (palette colours after lossy coding, uint8 (T, H, W, 3)) -> int labels (T, H, W),
    or (T, *size) at another ``size`` (nearest neighbour: a label is never blended with its neighbour's)."""
    from comsim.twin.camera_model import rgb_to_seg  # the palette is the twin's; no MuJoCo at import

    seg = np.asarray(seg_frames)
    if seg.dtype != np.uint8 or seg.ndim != 4 or seg.shape[-1] != 3:
        raise ValueError(f"object fidelity: segmentation frames must be uint8 (T, H, W, 3) palette colours, "
                         f"got {seg.dtype} {seg.shape}")
    labels = rgb_to_seg(seg)
    H, W = labels.shape[1:]
    if size is None or (H, W) == tuple(size):
        return labels
    rows = (np.arange(size[0]) * H // size[0]).astype(int)
    cols = (np.arange(size[1]) * W // size[1]).astype(int)
    return labels[:, rows][:, :, cols]


@dataclass
class FidelityModel:
    """One colour model per label (robot and each object), fit on real frames with twin labels."""

    models: dict[int, RobotColourModel] = field(default_factory=dict)
    fit_frames: int = 0

    def update(self, frames: np.ndarray, labels: np.ndarray) -> "FidelityModel":
        frames, labels = np.asarray(frames), np.asarray(labels)
        if frames.shape[:3] != labels.shape:
            raise ValueError(f"FidelityModel.update: frames {frames.shape} and labels {labels.shape} differ in size")
        for lab in np.unique(labels):
            if lab == 0:
                continue
            self.models.setdefault(int(lab), RobotColourModel()).update(frames, labels == lab)
        for lab, m in self.models.items():  # a label absent from this episode: all its pixels are 'rest'
            if lab not in np.unique(labels):
                m.update(frames, np.zeros(labels.shape, bool))
        self.fit_frames += len(frames)
        return self

    @property
    def object_labels(self) -> list[int]:
        return sorted(k for k in self.models if k != ROBOT_LABEL)

    def equal_prior_probability(self, frames: np.ndarray, label: int) -> np.ndarray:
        """P(label | colour) with the label as likely as the rest a priori: a 5-px cube is a tiny fraction
        of all pixels, but not of the small window searched around where it should be."""
        m = self.models[label]
        r, b = (h.sum() for h in m._smoothed())
        prior = r / (r + b)
        p = np.clip(m.probability(frames), 1e-9, 1 - 1e-9)
        ratio = p / (1 - p) * (1 - prior) / prior  # the colour's likelihood ratio, label vs rest
        return ratio / (1 + ratio)

    def locate(self, frames: np.ndarray, label: int, near: np.ndarray | None = None,
               radius: int | None = None) -> np.ndarray:
        """(T, 2) centroid (x, y) in px of the located object, NaN where nothing is located.

        ``near`` (T, 2): search only the window of +-``radius`` px around it (where the twin put the
        object), so that other things of the object's colour elsewhere in the frame do not count."""
        prob = self.equal_prior_probability(frames, label)
        out = np.full((len(frames), 2), np.nan)
        H, W = prob.shape[1:]
        for t, p in enumerate(prob):
            y0, x0 = 0, 0
            if near is not None:
                cx, cy = int(round(near[t][0])), int(round(near[t][1]))
                y0, x0 = max(0, cy - radius), max(0, cx - radius)
                p = p[y0:cy + radius + 1, x0:cx + radius + 1]
            comp, n = ndimage.label(p > 0.5)
            if n == 0:
                continue
            mass = ndimage.sum(p, comp, index=np.arange(1, n + 1))
            sel = comp == (1 + int(np.argmax(mass)))
            ys, xs = np.nonzero(sel)
            w = p[sel]
            out[t] = (x0 + float((xs * w).sum() / w.sum()), y0 + float((ys * w).sum() / w.sum()))
        return out


def search_radius(width: int) -> int:
    """The local search window's half size: 6 px at 128 px (a cube is ~5 px there), at least 3 px."""
    return max(3, int(round(SEARCH_RADIUS_FRACTION * width)))


def object_fidelity(frames: np.ndarray, labels: np.ndarray, model: FidelityModel, within_px: float = WITHIN_PX,
                    min_visible_px: int = MIN_VISIBLE_PX) -> dict:
    """Score uint8 ``frames`` (T, H, W, 3) against the twin's int ``labels`` (T, H, W).

    Returns {"objects": {label: {"error_px": [...], "within": fraction, "frames": n}}, "robot_iou": mean,
    "object_within": fraction over all scored (object, frame) pairs, "object_error_px_median": ...}."""
    frames, labels = np.asarray(frames), np.asarray(labels)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[:3] != labels.shape:
        raise ValueError(f"object_fidelity: frames must be uint8 (T, H, W, 3) matching labels (T, H, W), got "
                         f"{frames.dtype} {frames.shape} and {labels.shape}")
    objects, all_err = {}, []
    for lab in model.object_labels:
        twin_mask = labels == lab
        visible = twin_mask.reshape(len(labels), -1).sum(1) >= min_visible_px
        if not visible.any():
            continue
        twin_xy = np.array([ndimage.center_of_mass(m)[::-1] for m in twin_mask[visible]])  # (x, y) per frame
        found = model.locate(frames[visible], lab, near=twin_xy, radius=search_radius(frames.shape[2]))
        err = np.linalg.norm(found - twin_xy, axis=1)
        err = np.where(np.isnan(err), np.inf, err)
        objects[int(lab)] = {"frames": int(len(err)), "within": float((err <= within_px).mean()),
                             "error_px_median": float(np.median(err)),
                             "error_px_mean_found": float(err[np.isfinite(err)].mean()) if np.isfinite(err).any()
                             else None, "missed": int((~np.isfinite(err)).sum())}
        all_err.append(err)
    res = {"objects": objects, "within_px": within_px}
    if all_err:
        e = np.concatenate(all_err)
        res.update(object_within=float((e <= within_px).mean()), object_error_px_median=float(np.median(e)),
                   object_frames=int(len(e)))
    if ROBOT_LABEL in model.models:
        res["robot_iou"] = float(mask_iou(model.models[ROBOT_LABEL].predict(frames), labels == ROBOT_LABEL).mean())
    return res


def pool(results: list[dict]) -> dict:
    """Episodes' ``object_fidelity`` results pooled over (object, frame) pairs and frames, and per object label."""
    frames = sum(r.get("object_frames", 0) for r in results)
    out = {"episodes": len(results), "object_frames": frames}
    if frames:
        out["object_within"] = sum(r["object_within"] * r["object_frames"] for r in results if "object_frames" in r) / frames
        out["object_error_px_median_of_episodes"] = float(np.median(
            [r["object_error_px_median"] for r in results if "object_frames" in r]))
    per_object: dict[int, list[float]] = {}  # label -> [frames, frames within]
    for r in results:
        for lab, o in r.get("objects", {}).items():
            acc = per_object.setdefault(int(lab), [0, 0.0])
            acc[0] += o["frames"]
            acc[1] += o["within"] * o["frames"]
    if per_object:
        out["objects"] = {lab: {"frames": n, "within": w / n} for lab, (n, w) in sorted(per_object.items())}
    ious = [r["robot_iou"] for r in results if "robot_iou" in r]
    if ious:
        out["robot_iou"] = float(np.mean(ious))
    return out


def fit_fidelity_model(paired, camera: str = "front", episodes=None, size: tuple[int, int] | None = None) -> FidelityModel:
    """A FidelityModel fit on a paired dataset's REAL frames (``camera``) with the twin's labels
    (``<camera>_sim_seg``), at ``size`` (default: the real frames' own)."""
    from comsim.io.lerobot import LeRobotDataset
    from comsim.episode import resize_frames

    ds = paired if isinstance(paired, LeRobotDataset) else LeRobotDataset(paired)
    _need(ds, [camera, seg_key(camera)], "the paired dataset the colour models are fit on")
    model = FidelityModel()
    for e in (range(len(ds)) if episodes is None else episodes):
        ep = ds.read_episode(e, cameras=[camera, seg_key(camera)])
        real = ep.frames[camera] if size is None else resize_frames(ep.frames[camera], tuple(size))
        model.update(real, labels_from_palette(ep.frames[seg_key(camera)], real.shape[1:3]))
    return model


def evaluate_object_fidelity(pred, model: FidelityModel, camera: str = "front", episodes=None,
                             progress: bool = False) -> dict:
    """Object fidelity of every episode of dataset ``pred`` (its ``camera`` frames against its own
    ``<camera>_sim_seg`` twin labels): a converted factory dataset, or a paired one (the ceiling)."""
    from tqdm.auto import tqdm

    from comsim.io.lerobot import LeRobotDataset

    ds = pred if isinstance(pred, LeRobotDataset) else LeRobotDataset(pred)
    _need(ds, [camera, seg_key(camera)], "the dataset scored for object fidelity")
    results = []
    for e in tqdm(list(range(len(ds)) if episodes is None else episodes), desc="object fidelity", disable=not progress):
        ep = ds.read_episode(e, cameras=[camera, seg_key(camera)])
        frames = ep.frames[camera]
        results.append(object_fidelity(frames, labels_from_palette(ep.frames[seg_key(camera)], frames.shape[1:3]), model))
    out = pool(results)
    out.update(camera=camera, within_px=WITHIN_PX, resolution=list(frames.shape[1:3]) if results else None,
               how="objects: centroid of the largest-mass component of P(object | colour) > 0.5 vs the centroid of "
                   "the twin's mask, searched within +-%d px of it (frames with >= %d visible px), error in px, within = error <= %g px; robot: "
                   "IoU of P(robot | colour) > 0.5 with the twin's robot mask; colour models fit on real frames "
                   "with twin labels (%d frames)" % (search_radius(frames.shape[2]) if results else 0, MIN_VISIBLE_PX, WITHIN_PX,
                                                   model.fit_frames))
    return out


def _need(ds, cameras: list[str], what: str) -> None:
    missing = [c for c in cameras if c not in ds.camera_keys]
    if missing:
        raise ValueError(f"{ds.root}: {what} needs the camera keys {cameras} (observation.images.<key>); "
                         f"it has {sorted(ds.camera_keys)}. Generate with --controls seg to keep the twin's labels")
