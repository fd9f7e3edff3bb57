"""Where the real robot is, for the robot-region scores (comsim.metrics.robot_region).

The metrics never see the lab; this orchestrator may. For the episodes of a twin replay (a paired dataset,
or the held-out parts of a run, which keep the replay's provenance: ``real_dataset``, ``real_episode``):

- the recording is a lab recording (it carries the lab's hidden truth): the lab's TRUE robot masks, its own
  segmentation at the recorded state (comsim.lab.twin_truth.TrueMasks), resized to the frames' size;
- otherwise (a real cell): the twin's robot label (1) of ``<cam>_sim_seg``, grown by 2 px at 128 px
  (comsim.metrics.robot_region.label_robot_masks).

``masks.source`` says which, for metrics.json.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from comsim.io.keys import seg_key
from comsim.io.lerobot import LeRobotDataset
from comsim.metrics.robot_region import LABEL_DILATE_PX, label_robot_masks, resize_masks


def recording_of(dataset: Path, named: str | None) -> Path | None:
    """The recording a twin replay names (its provenance's ``real_dataset``): as written when absolute; a relative
    name first relative to a folder above ``dataset`` (the run's own working directory: a run folder's ``paired``
    finds its own ``lab``), then to the working directory."""
    if not named:
        return None
    p = Path(named)
    for base in (*Path(dataset).resolve().parents, Path.cwd()):
        q = p if p.is_absolute() else base / p
        if q.is_dir():
            return q
    return None


class RobotMasks:
    """``masks(i, size, n)`` -> (scoring masks, silhouettes), bool (n, h, w), for episode ``i`` (its first ``n``
    frames) of the dataset ``dataset``, at ``size`` (h, w). ``real``: the recording (default: the one the
    episodes' provenance names); its truth is used when it is a lab recording (``has_truth``). ``truth_only``: do
    not refuse a dataset without labels (the caller asks ``has_truth`` first)."""

    def __init__(self, dataset, camera: str, real=None, truth_only: bool = False):
        from comsim.lab.twin_truth import has_truth

        self.ds, self.camera = LeRobotDataset(dataset), camera
        if real is None and len(self.ds):
            named = self.ds.read_episode(0, cameras=[]).provenance.extra.get("real_dataset")
            real = recording_of(Path(dataset), named)
        self.real = Path(real) if real is not None else None
        self._true = None
        self.has_truth = has_truth(self.real)
        if self.has_truth:
            from comsim.lab.truth import load_lab_truth
            from comsim.lab.twin_truth import TrueMasks

            self._true = TrueMasks(load_lab_truth(self.real))
            self.source = f"lab truth ({self.real})"
        else:
            self.source = f"twin label 1 dilated {LABEL_DILATE_PX} px at 128 px width"
            if seg_key(camera) not in self.ds.camera_keys and not truth_only:
                raise ValueError(f"{dataset}: robot-region scores need the lab's truth or the twin's labels "
                                 f"({seg_key(camera)!r}); neither is there")

    def __call__(self, i: int, size: tuple[int, int], n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if self._true is None:
            ep = self.ds.read_episode(i, cameras=[seg_key(self.camera)])
            return label_robot_masks(ep.frames[seg_key(self.camera)][:n], size)
        ep = self.ds.read_episode(i, cameras=[])
        real_episode = int(ep.provenance.extra.get("real_episode", i))
        n_truth = len(self._true.truth.trajectory(real_episode)["object_pos"])
        if n_truth != len(ep.state):
            raise ValueError(f"{self.ds.root}: episode {i} has {len(ep.state)} frames but the lab truth of "
                             f"{self.real} episode {real_episode} has {n_truth}: not the recording it replays")
        masks = resize_masks(np.stack([self._true.mask(real_episode, k, s) for k, s in enumerate(ep.state[:n])]),
                             size)
        return masks, masks

    def close(self):
        if self._true is not None:
            self._true.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
