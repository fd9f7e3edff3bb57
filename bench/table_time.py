"""Where a lab table's time goes, read from the records its stages leave (nothing is rerun).

    python bench/table_time.py runs/lab_table          # a `comsim demo --profile lab_table` folder
    python bench/table_time.py runs/lab_table/policy   # or an experiment's output folder

Per dataset: the generation / conversion reports' elapsed seconds (lab recordings and compositor datasets record
none). Per arm: training (wall and CPU seconds; the policy trains on one thread, so CPU seconds are what an idle
core would take) and each panel's scoring (wall seconds). Then one training seed's arms: their CPU-bound
training plus their scoring, over ``arm_workers`` cores, beside the datasets that one cell builds once for
every seed. Timings recorded while something else shared the cores read long; the CPU seconds do not.
The last line printed is one JSON object.
"""
import argparse
import json
import re
from collections import defaultdict
from pathlib import Path


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def dataset_times(data: Path) -> dict:
    out = {}
    for d in sorted(p for p in data.iterdir() if p.is_dir()):
        rep = read_json(d / "generation_report.json") or read_json(d / "conversion_report.json")
        out[d.name] = ({"seconds": round(rep["elapsed_s"], 1),
                        "frames": rep.get("frames", rep.get("frames_now"))} if rep else {"seconds": None})
    return out


def arm_times(arms: Path) -> list[dict]:
    rows = []
    for a in sorted(p for p in arms.iterdir() if p.is_dir()):
        log = read_json(a / "train_log.json")
        if log is None:
            continue  # still training
        row = {"arm": re.sub(r"-[0-9a-f]{8}$", "", a.name), "folder": a.name, "seed": log["train"]["seed"],
               "train_wall_s": round(log["wall_s"], 1), "train_cpu_s": round(log["cpu_s"], 1), "panels": {}}
        for f in sorted(a.glob("eval-*.json")):
            ev = read_json(f)
            row["panels"][ev["panel"]] = {"trials": ev["n_trials"], "wall_s": round(ev["wall_s"], 1)}
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--arm-workers", type=int, default=2, help="arms trained at once (lab_table.yaml: 2)")
    a = ap.parse_args(argv)
    policy = a.run / "policy" if (a.run / "policy" / "arms").is_dir() else a.run
    if not (policy / "arms").is_dir():
        raise SystemExit(f"{policy}/arms: not found; expected a lab table run folder (comsim demo --profile lab_table)")
    datasets = dataset_times(policy / "data") if (policy / "data").is_dir() else {}
    arms = arm_times(policy / "arms")
    report = a.run / "paired" / "alignment_report.json"
    calib = (read_json(report) or {}).get("calibration", {}).get("seconds")

    print(f"{'dataset':<20} {'seconds':>8} {'frames':>7}")
    for k, v in datasets.items():
        print(f"{k:<20} {v['seconds'] if v['seconds'] is not None else 'n/a':>8} {v.get('frames') or '':>7}")
    print(f"\n{'arm':<22} {'seed':>4} {'train wall':>10} {'train cpu':>9}  panels (wall s)")
    per_seed = defaultdict(lambda: {"arms": 0, "train_cpu_s": 0.0, "score_wall_s": 0.0, "complete": True})
    for r in arms:
        panels = ", ".join(f"{k} {v['trials']}: {v['wall_s']}" for k, v in r["panels"].items())
        print(f"{r['arm']:<22} {r['seed']:>4} {r['train_wall_s']:>10} {r['train_cpu_s']:>9}  {panels}")
        s = per_seed[r["seed"]]
        s["arms"] += 1
        s["train_cpu_s"] += r["train_cpu_s"]
        s["score_wall_s"] += sum(v["wall_s"] for v in r["panels"].values())
        s["complete"] &= len(r["panels"]) >= 2
    summary = {}
    for seed, s in sorted(per_seed.items()):
        minutes = (s["train_cpu_s"] + s["score_wall_s"]) / a.arm_workers / 60
        summary[str(seed)] = {**{k: round(v, 1) if isinstance(v, float) else v for k, v in s.items()},
                              "minutes_on_arm_workers": round(minutes, 1)}
        print(f"seed {seed}: {s['arms']} arms, training {s['train_cpu_s'] / 60:.1f} CPU-min + scoring "
              f"{s['score_wall_s'] / 60:.1f} min over {a.arm_workers} cores = {minutes:.1f} min"
              + ("" if s["complete"] else " (some panels not scored yet)"))
    once = sum(v["seconds"] or 0 for v in datasets.values()) + (calib or 0)
    print(f"datasets with a recorded time, and the calibration: {once / 60:.1f} min, once per cell")
    out = {"bench": "table_time", "run": str(a.run), "datasets": datasets, "calibration_s": calib, "arms": arms,
           "per_seed": summary, "once_per_cell_recorded_s": round(once, 1)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
