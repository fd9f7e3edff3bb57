"""Action consistency: does the generated robot go where the commanded actions put it?

The twin renders where the robot must be in every frame (its segmentation of the robot,
label 1 of CONTRACTS.md, at the joint positions of the episode). The robot in a generated
frame is found with a deliberately simple, documented estimator, and the score is the mean
intersection-over-union (IoU) of the two masks over the frames.

Estimator (``RobotColourModel``): a per-pixel colour classifier. Fit: quantize RGB to
``bins`` levels per channel and histogram the colours of robot and background pixels of
*reference* frames (real or lab frames whose robot mask the twin gives: the twin replays
the measured joint states, so its mask is where the real robot was). The histograms are
smoothed in colour space (Gaussian, ``smooth`` bins) so that nearby colours share
evidence. Predict: P(robot | colour) from the two smoothed histograms and the class
priors; a pixel is robot when that exceeds 0.5. It knows nothing about shape or position,
so its IoU on the reference frames themselves (``reference_iou``) is its ceiling: report
both. It fails where robot and background share colours; then the score says little.

A generated robot in the commanded pose scores close to that ceiling; a robot in another
pose, a smeared or missing robot scores low, because the estimated mask lands elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from comsim.io.labels import ROBOT_LABEL
from comsim.metrics.robot_region import robot_masks_from_labels  # noqa: F401 (its users import it here)


@dataclass
class RobotColourModel:
    """P(robot | colour) from colour histograms of robot and background pixels."""

    bins: int = 32
    smooth: float = 1.0  # Gaussian sigma in histogram bins
    robot_hist: np.ndarray | None = None  # (bins, bins, bins) smoothed counts
    background_hist: np.ndarray | None = None
    _counts: np.ndarray | None = None  # raw (2, bins^3) counts: background, robot

    def _index(self, frames: np.ndarray) -> np.ndarray:
        q = (np.asarray(frames, np.uint16) * self.bins) >> 8  # 0..bins-1 per channel
        return (q[..., 0] * self.bins + q[..., 1]) * self.bins + q[..., 2]

    def update(self, frames: np.ndarray, masks: np.ndarray) -> "RobotColourModel":
        """Add the pixels of uint8 ``frames`` (T, H, W, 3) labelled by bool ``masks`` (T, H, W)
        (True = robot) to the colour histograms; datasets are fit one episode at a time."""
        frames, masks = _check(frames, masks, "RobotColourModel.update")
        idx, n = self._index(frames), self.bins**3
        if self._counts is None:
            self._counts = np.zeros((2, n), np.int64)
        self._counts[0] += np.bincount(idx[~masks], minlength=n)
        self._counts[1] += np.bincount(idx[masks], minlength=n)
        self.robot_hist = self.background_hist = None  # smoothed again on the next use
        return self

    def fit(self, frames: np.ndarray, masks: np.ndarray) -> "RobotColourModel":
        self._counts = None
        return self.update(frames, masks)

    def _smoothed(self) -> tuple[np.ndarray, np.ndarray]:
        if self._counts is None:
            raise ValueError("RobotColourModel: fit() it on frames with robot masks first")
        if self._counts[0].sum() == 0 or self._counts[1].sum() == 0:
            raise ValueError("RobotColourModel: the fit masks must contain both robot and background pixels")
        if self.robot_hist is None:
            shape = (self.bins,) * 3
            hists = [self._counts[k].reshape(shape).astype(np.float64) for k in (1, 0)]
            if self.smooth > 0:
                hists = [ndimage.gaussian_filter(h, self.smooth, mode="constant") for h in hists]
            self.robot_hist, self.background_hist = hists
        return self.robot_hist, self.background_hist

    def probability(self, frames: np.ndarray) -> np.ndarray:
        """P(robot | colour), float (T, H, W); colours never seen get the robot prior."""
        r, b = (h.ravel() for h in self._smoothed())
        prior = r.sum() / (r.sum() + b.sum())
        eps = 1e-3  # pseudo-count (in pixels) that pulls rare colours to the prior
        table = (r + eps * prior) / (r + b + eps)
        return table[self._index(frames)]

    def predict(self, frames: np.ndarray) -> np.ndarray:
        return self.probability(frames) > 0.5


def mask_iou(pred: np.ndarray, ref: np.ndarray, ignore: np.ndarray | None = None) -> np.ndarray:
    """Per-frame IoU of bool (T, H, W) masks; 1 where both are empty. ``ignore`` (bool (H, W)):
    pixels left out of both, e.g. the robot's base, which is robot in every frame whatever the
    actions (the IoU of the parts the actions move)."""
    pred, ref = np.asarray(pred, bool), np.asarray(ref, bool)
    if pred.shape != ref.shape:
        raise ValueError(f"mask_iou: masks differ in shape {pred.shape} vs {ref.shape}")
    if ignore is not None:
        pred, ref = pred & ~np.asarray(ignore, bool), ref & ~np.asarray(ignore, bool)
    inter = (pred & ref).reshape(len(pred), -1).sum(1)
    union = (pred | ref).reshape(len(pred), -1).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def action_consistency(pred_frames: np.ndarray, sim_masks: np.ndarray, model: RobotColourModel | None = None,
                       fit_frames: np.ndarray | None = None, fit_masks: np.ndarray | None = None) -> float:
    """Mean IoU between the robot estimated in ``pred_frames`` (uint8 (T, H, W, 3)) and the
    twin's robot masks of the commanded motion ``sim_masks`` (bool (T, H, W)).

    The estimator is ``model``, or a ``RobotColourModel`` fit on ``fit_frames``/``fit_masks``
    (reference frames with their twin masks; never the generated frames themselves)."""
    pred_frames, sim_masks = _check(pred_frames, sim_masks, "action_consistency")
    if model is None:
        if fit_frames is None or fit_masks is None:
            raise ValueError("action_consistency: give a fitted RobotColourModel or fit_frames and fit_masks "
                             "(reference frames and their twin robot masks)")
        model = RobotColourModel().fit(fit_frames, fit_masks)
    return float(mask_iou(model.predict(pred_frames), sim_masks).mean())


def render_robot_masks(scene, joints: np.ndarray, camera: str, width: int, height: int,
                       gripper: str = "width") -> np.ndarray:
    """The twin's robot masks, bool (T, H, W), for joint vectors ``joints`` (T, 8):
    7 arm joints + the gripper as an opening width in metres (``gripper="width"``,
    ``observation.state``) or as a command in [0, 1] (``gripper="command"``, ``action``).
    Objects stay at the scene's initial poses (they only matter where they hide the robot)."""
    from comsim.sim.render import SceneRenderer  # MuJoCo only when masks are rendered
    from comsim.sim.scene import FINGER_TRAVEL

    joints = np.asarray(joints, np.float64)
    if joints.ndim != 2 or joints.shape[1] < 8:
        raise ValueError(f"render_robot_masks: joints must be (T, 8) (7 arm joints + gripper), got {joints.shape}")
    if gripper not in ("width", "command"):
        raise ValueError(f"render_robot_masks: gripper must be 'width' or 'command', got {gripper!r}")
    scene.reset()
    out = np.zeros((len(joints), height, width), bool)
    with SceneRenderer(scene, camera, width, height) as r:
        for t, q in enumerate(joints):
            g = q[7] if gripper == "width" else float(np.clip(q[7], 0, 1)) * 2 * FINGER_TRAVEL
            scene.set_robot_qpos(q[:7], g)
            out[t] = r.segmentation() == ROBOT_LABEL
    return out


def _check(frames, masks, where):
    frames, masks = np.asarray(frames), np.asarray(masks)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"{where}: frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if masks.shape != frames.shape[:3]:
        raise ValueError(f"{where}: masks must be (T, H, W) = {frames.shape[:3]}, got {masks.shape}")
    return frames, masks.astype(bool)
