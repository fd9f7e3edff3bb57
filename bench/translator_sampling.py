"""A run's translator sampled with other settings, scored as `make lab-table`'s video-metrics stage scores it.

For each STEPS:OVERLAP[:W_ACTION:W_SIM], copies the run's translator (RUN/translator/final) into OUT with those
sampling settings (the guidance weights too, when given),
translates the run's held-out lab pairs and scores them against the lab frames (PSNR per frame then mean, SSIM,
FID with covariance / (N - 1)) and for object fidelity, exactly as the demo's video-metrics stage does. The run is
only read. The last line is one JSON object.

    MUJOCO_GL=egl OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/translator_sampling.py runs/lab_table \\
        runs/sampling 4:2 4:1 3:1 2:2 4:1:0.5:1
"""
import argparse
import json
import os
import shutil
import time
from pathlib import Path

from comsim.pipeline.stages import video_metrics
from comsim.run_layout import RunLayout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a `comsim demo` run folder (its translator and paired lab episodes)")
    p.add_argument("out", help="a folder for the variants (one sub-folder per setting)")
    p.add_argument("settings", nargs="+", help="STEPS:OVERLAP[:W_ACTION:W_SIM], e.g. 4:1 or 4:1:0.5:1")
    a = p.parse_args()
    base, rows = RunLayout(a.run), []
    for setting in a.settings:
        parts = setting.split(":")
        if len(parts) not in (2, 4):
            raise SystemExit(f"{setting!r}: expected STEPS:OVERLAP or STEPS:OVERLAP:W_ACTION:W_SIM")
        steps, overlap = int(parts[0]), int(parts[1])
        weights = {"w_action": float(parts[2]), "w_sim": float(parts[3])} if len(parts) == 4 else {}
        name = f"steps{steps}_overlap{overlap}" + (f"_wa{parts[2]}_ws{parts[3]}" if weights else "")
        run = RunLayout(Path(a.out) / name)
        run.root.mkdir(parents=True, exist_ok=True)
        if not run.paired.exists():  # the run's pairs, linked, never copied or changed
            os.symlink(base.paired.resolve(), run.paired)
        model = run.root / "translator"
        if not model.exists():
            shutil.copytree(base.translator_final, model)
            cfg = json.loads((model / "translator.json").read_text())
            cfg["sampling"].update(num_steps=steps, overlap=overlap, **weights)  # what the pipeline samples with
            (model / "translator.json").write_text(json.dumps(cfg, indent=1))
        t = time.time()
        m = video_metrics(model, run, {})
        look, fid = m["pseudo_real_vs_real"]["metrics"], m["object_fidelity"]["heldout_pseudo_real"]
        rows.append({"steps": steps, "overlap": overlap, **weights, "psnr": round(look["psnr"], 2), "ssim": round(look["ssim"], 3),
                     "fid": round(look["fid"], 1), "object_within_2px": round(fid["object_within"], 3),
                     "robot_iou": round(fid["robot_iou"], 3), "raw_twin_psnr": round(m["raw_sim_vs_real"]["metrics"]["psnr"], 2),
                     "seconds": round(time.time() - t)})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"bench": "translator_sampling", "run": a.run, "rows": rows}))


if __name__ == "__main__":
    main()
