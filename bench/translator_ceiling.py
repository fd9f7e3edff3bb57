"""Where the raw twin render's error against the real frames lies, and what a look-only fix could reach.

On a lab run's paired episodes (real, twin render, twin labels), held-out episodes as the demo's metrics stage
holds them out, fit on the others; PSNR per frame (data range 255), then the mean over the held-out frames:
- raw twin render; an affine colour map per twin label (fit on the training episodes);
- the background plate pasted where the twin's render shows its own backdrop (the gate of
  ``model.background_plate``), the twin render elsewhere, no network;
- the squared error split between background and foreground (twin labels), raw and after the plate;
- the camera's noise floor: consecutive real frames on background pixels 8 px away from any object;
- a real frame against itself shifted by 1 px (how much a 1-px misplacement costs on this texture).

    .venv/bin/python bench/translator_ceiling.py runs/lab_table/paired

The last line is one JSON object.
"""
import argparse
import json

import numpy as np
from scipy import ndimage

from comsim.pipeline.stages import heldout_indices
from comsim.io.keys import seg_key, sim_key
from comsim.io.lerobot import LeRobotDataset
from comsim.io.labels import labels_from_palette

TOLERANCE = 48  # grey levels summed over RGB: model.plate_tolerance 0.38 in the pixel codec's units


def psnr(pred, ref):
    mse = ((np.clip(pred, 0, 255) - ref) ** 2).mean(axis=(1, 2, 3))
    return 10 * np.log10(255 ** 2 / np.maximum(mse, 1e-10))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paired", help="a paired LeRobot dataset (camera, camera_sim, camera_sim_seg)")
    p.add_argument("--camera", default="front")
    a = p.parse_args()
    ds, cam = LeRobotDataset(a.paired), a.camera
    held = heldout_indices(a.paired)
    eps = {}
    for i in range(len(ds)):
        ep = ds.read_episode(i, cameras=[cam, sim_key(cam), seg_key(cam)])
        eps[i] = (ep.frames[cam].astype(np.float32), ep.frames[sim_key(cam)].astype(np.float32),
                  labels_from_palette(ep.frames[seg_key(cam)]))
    train = [eps[i] for i in eps if i not in held]
    test = [eps[i] for i in held]
    R, S, L = (np.concatenate([e[k] for e in train]) for k in range(3))
    raw = np.concatenate([psnr(s, r) for r, s, _ in test])

    # an affine colour map per twin label, least squares on the training frames
    X = np.concatenate([S.reshape(-1, 3) / 255, np.ones((S.size // 3, 1), np.float32)], 1)
    Y, Lf = R.reshape(-1, 3), L.reshape(-1)
    maps = {lab: np.linalg.lstsq(X[Lf == lab], Y[Lf == lab], rcond=None)[0] for lab in np.unique(Lf)
            if (Lf == lab).sum() > 100}
    affine = []
    for r, s, lab in test:
        Xs = np.concatenate([s.reshape(-1, 3) / 255, np.ones((s.size // 3, 1), np.float32)], 1)
        out, lf = s.reshape(-1, 3).copy(), lab.reshape(-1)
        for k, M in maps.items():
            out[lf == k] = Xs[lf == k] @ M
        affine.append(psnr(out.reshape(s.shape), r))

    # the background plate, gated by the twin render alone
    plate_sim = np.median(S, axis=0)
    backdrop = np.abs(S - plate_sim).sum(-1) < TOLERANCE
    with np.errstate(all="ignore"):
        plate_real = np.nanmedian(np.where(backdrop[..., None], R, np.nan), axis=0)
    plate_real = np.where(np.isnan(plate_real), plate_sim, plate_real)
    plate, se = [], {"raw_bg": 0.0, "raw_fg": 0.0, "plate_bg": 0.0, "plate_fg": 0.0}
    n = {"bg": 0, "fg": 0, "gate_on": 0, "gate_off": 0}
    for r, s, lab in test:
        gate = np.abs(s - plate_sim).sum(-1) < TOLERANCE
        comp = np.where(gate[..., None], plate_real, s)
        plate.append(psnr(comp, r))
        d_raw, d_plate = ((s - r) ** 2).sum(-1), ((comp - r) ** 2).sum(-1)
        se["raw_bg"] += d_raw[lab == 0].sum(); se["raw_fg"] += d_raw[lab != 0].sum()
        se["plate_bg"] += d_plate[gate].sum(); se["plate_fg"] += d_plate[~gate].sum()
        n["gate_on"] += gate.sum() * 3; n["gate_off"] += (~gate).sum() * 3

    # noise floor: consecutive real frames, background far from any object
    noise_se, noise_n = 0.0, 0
    for r, _, lab in eps.values():
        near = ndimage.binary_dilation(lab != 0, iterations=8, structure=np.ones((1, 3, 3), bool))
        keep = ~(near[1:] | near[:-1])
        noise_se += ((r[1:] - r[:-1]) ** 2)[keep].sum(); noise_n += keep.sum() * 3
    noise_var = noise_se / noise_n / 2
    real_test = np.concatenate([r for r, _, _ in test])
    print(json.dumps({k: (float(v) if isinstance(v, np.floating) else v) for k, v in {
        "paired": a.paired, "heldout_episodes": held, "heldout_frames": int(len(raw)),
        "psnr_raw_twin": round(float(raw.mean()), 2),
        "psnr_affine_colour_per_label": round(float(np.concatenate(affine).mean()), 2),
        "psnr_plate_over_twin_backdrop": round(float(np.concatenate(plate).mean()), 2),
        "raw_error_share_on_background": round(float(se["raw_bg"] / (se["raw_bg"] + se["raw_fg"])), 3),
        "plate_error_share_on_backdrop": round(float(se["plate_bg"] / (se["plate_bg"] + se["plate_fg"])), 3),
        "plate_mse_backdrop_per_value": round(float(se["plate_bg"] / n["gate_on"]), 1),
        "plate_mse_rest_per_value": round(float(se["plate_fg"] / n["gate_off"]), 1),
        "rest_pixel_fraction": round(float(n["gate_off"] / (n["gate_on"] + n["gate_off"])), 3),
        "noise_var_per_value": round(float(noise_var), 1),
        "psnr_ceiling_noise_free": round(float(10 * np.log10(255 ** 2 / noise_var)), 2),
        "psnr_real_vs_itself_shifted_1px": round(float(psnr(np.roll(real_test, 1, axis=2), real_test).mean()), 2),
    }.items()}))


if __name__ == "__main__":
    main()
