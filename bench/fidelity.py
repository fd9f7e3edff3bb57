"""Object fidelity of everything a run folder holds, with the object locator its metrics stage uses.

    .venv/bin/python bench/fidelity.py runs/lab_table

The locator is fit as `comsim demo`'s video-metrics stage fits it: on the real frames of the
paired episodes the translator trained on (the held-out ones left out), at the translator's resolution.
Then every dataset of the run with the twin's labels (``<camera>_sim_seg``) is scored
(``comsim.metrics.fidelity.object_fidelity``), its camera's frames, or the sim render where it has none:
- the held-out pairs: ``real`` (the locator's ceiling: the lab's frames against the twin's replay),
  ``sim_only`` (the raw twin render: what a translator that moved nothing would score), ``pseudo``;
- the demo's factory episodes and their conversion (in- and out-of-distribution layouts);
- the policy experiment's datasets under ``policy/data`` (the sim episodes' renders, their conversion).
Per part: the fraction of (object, frame) pairs within 2 px, the same per object label (2 + i: object i
of the twin), the median error and the robot's IoU. The last line is one JSON object.

A negative control shows that the locator needs the object drawn, not just a scene around it:
``*:objects_erased`` scores the held-out real frames and the converted factory frames with every object's
pixels (grown by 1 px, the robot's left alone) painted over with that frame's median table colour; those
objects should be found (within 2 px) in few frames.

``--decode-stats N`` adds, for the label videos of the first N paired episodes, how far each decoded pixel
is from its nearest palette colour, per nearest label (percentiles 50/90/99): what
``comsim.io.labels.SEG_DECODE_TOLERANCE`` is chosen from.
"""
import argparse
import json
from pathlib import Path

import numpy as np
from scipy import ndimage

from comsim.pipeline.stages import heldout_indices
from comsim.io.keys import seg_key, sim_key
from comsim.io.lerobot import LeRobotDataset
from comsim.io.labels import labels_from_palette
from comsim.metrics.fidelity import fit_fidelity_model, object_fidelity, pool
from comsim.run_layout import RunLayout


def erase_objects(frames: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``frames`` with every object's pixels (labels >= 2, grown by 1 px, never onto the robot) painted over
    with the frame's median background colour."""
    grown = ndimage.binary_dilation(labels >= 2, np.ones((1, 3, 3), bool)) & (labels != 1)
    out = frames.copy()
    for t in range(len(frames)):
        out[t][grown[t]] = np.median(frames[t][labels[t] == 0], axis=0).astype(np.uint8)
    return out


def score(path: Path, image_key: str, camera: str, model, erased: bool = False) -> dict:
    ds = LeRobotDataset(path)
    results = []
    for e in range(len(ds)):
        ep = ds.read_episode(e, cameras=[image_key, seg_key(camera)])
        frames = ep.frames[image_key]
        labels = labels_from_palette(ep.frames[seg_key(camera)], frames.shape[1:3])
        results.append(object_fidelity(erase_objects(frames, labels) if erased else frames, labels, model))
    return pool(results)


def decode_stats(paired, camera: str, episodes: int) -> dict:
    """Per nearest palette label: pixels, and the percentiles of their RGB distance to that colour."""
    from comsim.io.labels import SEG_PALETTE

    raw = np.concatenate([paired.read_episode(e, cameras=[seg_key(camera)]).frames[seg_key(camera)]
                          for e in range(min(episodes, len(paired)))])
    d = np.sqrt(((raw[..., None, :].astype(np.int32) - SEG_PALETTE.astype(np.int32)) ** 2).sum(-1))
    nearest, dist = d.argmin(-1), d.min(-1)
    return {int(k): {"pixels": int((nearest == k).sum()),
                     "distance_p50_p90_p99": np.percentile(dist[nearest == k], [50, 90, 99]).round(1).tolist()}
            for k in np.unique(nearest)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--camera", default="front")
    p.add_argument("--decode-stats", type=int, default=0, metavar="N")
    a = p.parse_args()
    run, cam = RunLayout(a.run_dir), a.camera
    paired = LeRobotDataset(run.paired)
    held = heldout_indices(run.paired)
    size = paired.read_episode(0, cameras=[cam]).frames[cam].shape[1:3]
    model = fit_fidelity_model(paired, cam, [e for e in range(len(paired)) if e not in held], size, progress=True)
    print("locator:", model.describe(), flush=True)
    parts = {f"heldout_{k}": run.heldout_part(k) for k in ("real", "sim_only", "pseudo")}
    parts.update(factory_sim_id=run.sim, factory_sim_ood=run.sim_ood, factory_pseudo_real_id=run.pseudo_real,
                 factory_pseudo_real_ood=run.pseudo_real_ood)
    data = run.policy / "data"
    if data.is_dir():
        parts.update({f"policy_{d.name}": d for d in sorted(data.iterdir()) if (d / "meta").is_dir()})
    out = {"run": str(a.run_dir), "camera": cam, "fit_episodes": len(paired) - len(held), "resolution": list(size)}
    if a.decode_stats:
        out["decode_distance"] = decode_stats(paired, cam, a.decode_stats)
        print("decode_distance", json.dumps(out["decode_distance"]), flush=True)
    for name, path in parts.items():
        if not (Path(path) / "meta").is_dir():
            continue
        keys = LeRobotDataset(path).camera_keys
        if seg_key(cam) not in keys:
            continue
        key = cam if cam in keys else sim_key(cam)  # a converted dataset's sim frames are its source's
        if key in keys:
            out[f"{name}:{key}"] = score(Path(path), key, cam, model)
            print(name, key, json.dumps(out[f"{name}:{key}"]), flush=True)
            if name in ("heldout_real", "factory_pseudo_real_id", "factory_pseudo_real_ood"):
                out[f"{name}:objects_erased"] = score(Path(path), key, cam, model, erased=True)
                print(name, "objects_erased", json.dumps(out[f"{name}:objects_erased"]), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
