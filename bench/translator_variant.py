"""A translator variant scored the way `make lab-table`'s demo stages score the run's own translator.

Trains the run's translator config again with dotted overrides on the run's own lab pairs, converts the run's
factory episodes (id and ood; made in OUT with `make demo`'s counts and seeds when the run has none), and scores
held-out pairs and object fidelity like the demo's video-metrics stage, into OUT (resumable: each part is skipped
when its output is there). The last line is one JSON object.

    MUJOCO_GL=egl OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/translator_variant.py runs/lab_table \\
        runs/plate model.background_plate=true
"""
import argparse
import json
import os
import time

from comsim.config import config_file
from comsim.pipeline import stages
from comsim.pipeline.demo import PROFILES
from comsim.run_layout import RunLayout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a `comsim demo --profile lab_table` run folder (its pairs and factory episodes)")
    p.add_argument("out", help="the variant's folder")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the translator config")
    a = p.parse_args()
    base, out = RunLayout(a.run), RunLayout(a.out)
    out.root.mkdir(parents=True, exist_ok=True)
    for part in ("paired", "sim", "sim_ood"):  # the run's inputs, linked, never copied or changed
        link = getattr(out, part)
        if not link.exists() and getattr(base, part).exists():
            os.symlink(getattr(base, part).resolve(), link)
    # a lab_table run makes no demo-scale factory episodes: made here as `make demo` makes them (same seeds)
    loop = PROFILES["small"].loop
    scene = out.paired / "twin_aligned.yaml"
    stages.generate_sim(loop.sim_task, loop.sim_episodes, out.sim, scene, seed=1000)
    stages.generate_sim(loop.sim_task, loop.ood_sim_episodes, out.sim_ood, scene, seed=2000, split="ood")
    t = time.time()
    model_dir = stages.train_translator(out.paired, out.translator, config_file(loop.translator_config),
                                        overrides=tuple(a.overrides))
    t_train = time.time() - t
    t = time.time()
    for sim, pseudo in ((out.sim, out.pseudo_real), (out.sim_ood, out.pseudo_real_ood)):
        stages.convert_sim(model_dir, sim, pseudo)
    t_convert = time.time() - t
    m = stages.video_metrics(model_dir, out, {"id": out.pseudo_real, "ood": out.pseudo_real_ood})
    fid = m["object_fidelity"]
    print(json.dumps({"overrides": a.overrides, "train_s": round(t_train), "convert_s": round(t_convert),
                      "psnr": m["pseudo_real_vs_real"]["metrics"]["psnr"], "psnr_raw_twin": m["raw_sim_vs_real"]["metrics"]["psnr"],
                      "fid": m["pseudo_real_vs_real"]["metrics"]["fid"], "fid_raw_twin": m["raw_sim_vs_real"]["metrics"]["fid"],
                      "cube_within_2px": {k: v["object_within"] for k, v in fid.items()},
                      "robot_iou": {k: v["robot_iou"] for k, v in fid.items()}}))


if __name__ == "__main__":
    main()
