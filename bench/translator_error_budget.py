"""Where a prediction's whole-frame error lies: the held-out frames of a video-metrics stage, split by the twin's
labels (backdrop, robot, objects), and what an oracle that knew each episode's exposure and white balance would
gain (a per-channel gain and offset fit, per episode, on the real frame's backdrop pixels: what no sim input
carries). Beside them, the real frames against themselves (``episode_backdrop_oracle``): each episode's own still
backdrop (the per-pixel median of its real frames where the twin shows backdrop) scored on that backdrop. What it
leaves is what changes from frame to frame (sensor noise, codec, flicker, a passer-by, and the arm's shadow, the one
part of it a translator could draw), so it bounds what any static background, learned or fit, reaches; and the whole
frame such a backdrop would score with robot and objects exact.

    python bench/translator_error_budget.py RUN   # RUN: a `bench/translator_heldout.py --stage RUN` or demo folder

RUN/heldout_pseudo_real/{real,pseudo,compositor} are the stage's held-out frames (with the twin's label video). PSNR here is one MSE over all pixels of all frames (not a mean of
per-frame PSNRs, which is what metrics.json reports), so the regions' shares of the error add up. The last line
printed is one JSON object.
"""
import argparse
import json
from pathlib import Path

import numpy as np


def psnr(se: float, n: int) -> float:
    if se == 0:
        return float("inf")
    return round(float(10 * np.log10(255.0**2 / (se / max(n, 1)))), 2)


def budget(real: list, pred: list, segs: list) -> dict:
    from comsim.io.labels import labels_from_palette

    regions = ("backdrop", "robot", "objects")
    se, px = dict.fromkeys(regions, 0.0), dict.fromkeys(regions, 0)
    oracle_se = 0.0
    for r, p, s in zip(real, pred, segs):
        r, p, lab = r.astype(np.float64), p.astype(np.float64), labels_from_palette(s)
        masks = {"backdrop": lab == 0, "robot": lab == 1, "objects": lab >= 2}
        err = ((p - r) ** 2).mean(-1)
        for k, m in masks.items():
            se[k] += float(err[m].sum())
            px[k] += int(m.sum())
        b, q = masks["backdrop"], p.copy()
        for c in range(3):
            A = np.stack([p[..., c][b], np.ones(int(b.sum()))], 1)
            gain, offset = np.linalg.lstsq(A, r[..., c][b], rcond=None)[0]
            q[..., c] = p[..., c] * gain + offset
        oracle_se += float(((q - r) ** 2).mean(-1).sum())
    total_se, total_px = sum(se.values()), sum(px.values())
    return {"psnr": psnr(total_se, total_px),
            "regions": {k: {"pixel_share": round(px[k] / total_px, 3), "psnr": psnr(se[k], px[k]),
                            "error_share": round(se[k] / total_se, 3)} for k in regions},
            "psnr_with_episode_colour_oracle": psnr(oracle_se, total_px)}


def episode_backdrop_oracle(real: list, segs: list) -> dict:
    """The backdrop of each episode's real frames (T, H, W, 3) against that episode's per-pixel median backdrop."""
    from comsim.io.labels import labels_from_palette

    se, n, total_px = 0.0, 0, 0
    for r, s in zip(real, segs):
        r, back = r.astype(np.float64), labels_from_palette(s) == 0
        plate = np.nanmedian(np.where(back[..., None], r, np.nan), axis=0)  # (H, W, 3); nan where never backdrop
        err = ((r - plate[None]) ** 2).mean(-1)
        ok = back & ~np.isnan(err)
        se, n, total_px = se + float(err[ok].sum()), n + int(ok.sum()), total_px + back.size
    return {"backdrop_psnr": psnr(se, n), "whole_psnr_if_robot_and_objects_exact": psnr(se, total_px),
            "how": "per episode: median of the real frames over the frames where the twin shows backdrop, per pixel"}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    a = ap.parse_args(argv)
    from comsim.io.lerobot import LeRobotDataset

    root = a.run / "heldout_pseudo_real"
    if not (root / "real").is_dir():
        raise SystemExit(f"{root}/real: not found; expected a video-metrics stage's folder "
                         f"(bench/translator_heldout.py MODEL PAIRED --stage RUN)")
    def load(name):
        ds = LeRobotDataset(root / name)
        return [ds[i] for i in range(len(ds))]

    real = load("real")
    cam = next(k for k in real[0].frames if not k.endswith("_seg"))
    out = {"bench": "translator_error_budget", "run": str(a.run), "episodes": len(real),
           "frames": int(sum(len(e.frames[cam]) for e in real))}
    segs = [e.frames[f"{cam}_sim_seg"] for e in real]  # the twin's labels, the same for every prediction
    for name in ("pseudo", "compositor"):
        out[name] = budget([e.frames[cam] for e in real], [e.frames[cam] for e in load(name)], segs)
    out["episode_backdrop_oracle"] = episode_backdrop_oracle([e.frames[cam] for e in real], segs)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
