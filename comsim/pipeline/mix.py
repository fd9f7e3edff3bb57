"""Real + synthetic episodes in one LeRobot dataset, at a chosen synthetic fraction.

    report = mix("data/lab", "runs/me/pseudo_real", "runs/me/mixed", synthetic_fraction=0.5)

LeRobot's own training scripts sample frames uniformly from one dataset, so the fraction is set by
which episodes go in: every real episode, then synthetic ones in order until the synthetic share of
frames is as close to the fraction asked as whole episodes allow (never a real episode left out).
Only the one camera is kept (``observation.images.<camera>``: real frames, or the translator's), at
the real recording's resolution, with the actions and states; the twin's renders and control videos
stay in the synthetic dataset. Every episode keeps its provenance (``source`` real / lab /
pseudo_real, the translator, the source episode), so the two are never silently merged, and
``mixture.json`` records the sources, the fraction asked and the fraction reached.
"""
from __future__ import annotations

from pathlib import Path

from comsim.episode import Episode, resize_frames
from comsim.errors import InputError
from comsim.io.files import write_json
from comsim.io.keys import seen_cameras
from comsim.io.lerobot import DatasetWriter, LeRobotDataset, dataset_complete
from comsim.io.paths import check_output_path, claim_output, is_inside

MANIFEST = "mixture.json"


def synthetic_episodes_for(real_frames: int, synthetic_lengths: list[int], fraction: float) -> int:
    """How many of the synthetic episodes (in order) bring the synthetic share of frames closest to ``fraction``."""
    best, best_gap, synth = 0, abs(fraction), 0
    for k, n in enumerate(synthetic_lengths, start=1):
        synth += n
        gap = abs(synth / (real_frames + synth) - fraction)
        if gap < best_gap - 1e-12:
            best, best_gap = k, gap
    return best


def mix(real, synthetic, out, synthetic_fraction: float, camera: str | None = None) -> dict:
    real, synthetic, out = Path(real), Path(synthetic), Path(out)
    if not 0.0 <= synthetic_fraction < 1.0:
        raise InputError(None, "--synthetic-fraction", "a number in [0, 1) (every real episode stays in)",
                         synthetic_fraction)
    check_output_path(out)
    for src in (real, synthetic):
        if is_inside(out, src) or is_inside(src, out):
            raise InputError(out, "--out", f"a folder outside {src}", "the same folder or one inside the other")
    r, s = LeRobotDataset(real), LeRobotDataset(synthetic)
    cam = camera or seen_cameras(r.camera_keys)[0]
    for ds in (r, s):
        if cam not in ds.camera_keys:
            raise InputError(ds.root / "meta" / "info.json", "features", f"a camera {cam!r}", ds.camera_keys)
    if r.fps != s.fps:
        raise InputError(s.root / "meta" / "info.json", "fps", f"{r.fps} (the real recording's)", s.fps)
    for key in ("action", "observation.state"):
        if r.features.get(key, {}).get("shape") != s.features.get(key, {}).get("shape"):
            raise InputError(s.root / "meta" / "info.json", f"features.{key}.shape",
                             f"{r.features.get(key, {}).get('shape')} (the real recording's)",
                             s.features.get(key, {}).get("shape"))
    real_frames = sum(r.episode_length(i) for i in range(len(r)))
    k = synthetic_episodes_for(real_frames, [s.episode_length(i) for i in range(len(s))], synthetic_fraction)
    synth_frames = sum(s.episode_length(i) for i in range(k))
    header = {"command": "comsim mix", "real": str(real.resolve()), "synthetic": str(synthetic.resolve()),
              "camera": cam, "synthetic_fraction": synthetic_fraction, "real_episodes": len(r),
              "synthetic_episodes": k, "real_frames": real_frames, "synthetic_frames": synth_frames,
              "synthetic_fraction_reached": synth_frames / max(1, real_frames + synth_frames)}
    keys = ("real", "synthetic", "camera", "synthetic_fraction")
    claim_output(out, MANIFEST, header, keys, "comsim mix")
    if dataset_complete(out):
        return header
    write_json(header, out / MANIFEST)
    size = r.read_episode(0, cameras=[cam]).frames[cam].shape[1:3]
    writer = DatasetWriter(out, r.fps, resume=True)
    jobs = [(r, i) for i in range(len(r))] + [(s, i) for i in range(k)]
    for j, (ds, i) in enumerate(jobs):
        if j in writer.finished_episodes:
            continue
        ep = ds.read_episode(i, cameras=[cam])
        writer.add_episode(Episode(frames={cam: resize_frames(ep.frames[cam], size)}, action=ep.action,
                                   state=ep.state, fps=ep.fps, timestamps=ep.timestamps, task=ep.task,
                                   success=ep.success, provenance=ep.provenance), episode_index=j)
    writer.close()
    return header
