"""Trial records and the table pooled from them (comsim.pipeline.records, comsim.pipeline.table).

Two parts: records written by a real micro experiment (one recorded lab episode, tiny policies trained for two
steps and scored in the lab, two training seeds), exported as each arm finishes and again from the finished
run folder; and records whose outcomes are chosen here, so that the page's intervals, p-values and verdicts can
be checked against values computed by hand. ~1 min on 2 cores.
"""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import dataclasses  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

from comsim.config import ConfigError  # noqa: E402
from comsim.episode import Provenance  # noqa: E402
from comsim.errors import InputError  # noqa: E402
from comsim.io.lerobot import LeRobotDataset, dataset_fingerprint, write_dataset  # noqa: E402
from comsim.lab import record_dataset  # noqa: E402
from comsim.pipeline import records  # noqa: E402
from comsim.pipeline.experiment import (COMMIT_FILE, export_records, export_run, load_experiment,  # noqa: E402
                                        run_experiment)
from comsim.pipeline.table import pool_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(log=lambda *_: None, progress=False)


# ----------------------------------------------------------------------------- a real micro experiment


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished micro experiment that wrote its records as each arm finished: arms `real` and `real_pseudo`
    (the pseudo-real episodes carry a translator hash) at training seeds 0 and 1, `pseudo` at seed 0."""
    root = tmp_path_factory.mktemp("table_run")
    real = record_dataset("push", episodes=1, out=root / "lab", seed=3)
    ep = LeRobotDataset(real).read_episode(0)
    pseudo = write_dataset(root / "pseudo", [dataclasses.replace(
        ep, provenance=Provenance(source="pseudo_real", task="push", seed=11, translator_hash="t" * 16))], fps=ep.fps)
    cfg = {"name": "micro table", "output_dir": str(root / "exp"), "task": "push",
           "datasets": {"real": {"path": str(real)}, "pseudo": {"path": str(pseudo)}},
           "arms": [{"name": "real", "label": "1 real", "sources": [{"dataset": "real"}], "synthetic_fraction": 0.0},
                    {"name": "real_pseudo", "sources": [{"dataset": "real"}, {"dataset": "pseudo"}],
                     "synthetic_fraction": 0.5},
                    {"name": "pseudo", "sources": [{"dataset": "pseudo"}], "synthetic_fraction": 1.0}],
           "seeds": [0, 1], "seeded_arms": ["real", "real_pseudo"],
           "policy": {"preset": "tiny", "num_inference_steps": 2},
           "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1, "log_every": 1},
           "eval": {"n_trials": 2, "max_seconds": 0.2, "panels": {"id": {"kind": "id"}, "ood": {"kind": "ood", "n_trials": 3}}},
           "claim": {"arm": "real_pseudo", "beats": ["real"], "panels": ["ood"]},
           "look_test": {"arm": "pseudo", "beats": ["real"], "panels": ["id", "ood"]},
           "gap": {"baseline": "real", "oracle": "real_pseudo"},
           "comparisons": [{"title": "Pseudo-real alone against with real", "pairs": [["pseudo", "real_pseudo"]]}],
           "records_dir": str(root / "records")}
    path = root / "micro.yaml"
    path.write_text(yaml.safe_dump(cfg))
    doc = run_experiment(path, **QUIET)
    return {"root": root, "yaml": path, "doc": doc, "records": root / "records", "real": real, "pseudo": pseudo}


def test_each_finished_arm_writes_its_trials_and_manifest(run):
    rec, doc = run["records"], run["doc"]
    units = sorted(str(p.parent.relative_to(rec)) for p in rec.glob("*/seed*/manifest.json"))
    assert units == ["pseudo/seed0", "real/seed0", "real/seed1", "real_pseudo/seed0", "real_pseudo/seed1"]
    by = {a["name"]: a for a in doc["arms"]}
    for arm in ("real", "real_pseudo", "pseudo"):
        for s, seed_doc in by[arm]["seeds"].items():
            d = Path(seed_doc["dir"])
            rows = records.read_trials(rec / arm / f"seed{s}" / "trials.csv")
            evals = {p: json.loads(f.read_text()) for p in ("id", "ood")
                     for f in d.glob(f"eval-{p}-*.json")}
            assert [(r["panel"], r["trial"], r["seed"], r["success"], r["box"], r["steps"]) for r in rows] == [
                (p, t["trial"], t["seed"], t["success"], t["box"], t["steps"]) for p in ("id", "ood")
                for t in evals[p]["trials"]]
            assert len(rows) == 2 + 3  # id 2 trials, ood 3 (its own count)
            m = json.loads((rec / arm / f"seed{s}" / "manifest.json").read_text())
            assert (m["arm"], m["seed"], m["training_seed"], m["arm_folder"]) == (arm, int(s), int(s), d.name)
            assert m["translator"] == (None if arm == "real" else "t" * 16)
            assert m["datasets"]["real" if arm != "pseudo" else "pseudo"] == dataset_fingerprint(
                run["real"] if arm != "pseudo" else run["pseudo"])
            assert m["commit"] == {**json.loads((d / COMMIT_FILE).read_text()), "recorded": "when the arm was trained"}
            assert m["commit"]["commit"] != "" and m["panels"]["ood"]["n_trials"] == 3
            assert m["panels"]["ood"]["identity"]["seed"] == 100_000 + int(s)  # each seed its own panel
            assert str(run["root"]) not in json.dumps(m)  # no path of this machine in a record
    defs = json.loads((rec / "table.json").read_text())
    assert defs["claim"]["identity"] == doc["claim"]["identity"] and defs["seeds"] == [0, 1]


def test_the_page_pools_the_records_as_the_run_did_and_again_byte_for_byte(run, tmp_path):
    rec, doc = run["records"], run["doc"]
    pooled = pool_table(rec)
    for a in doc["arms"]:
        for p, v in a["panels"].items():
            assert pooled["success"][a["name"]][p]["pooled"] == (v["successes"], v["n_trials"])
            assert pooled["success"][a["name"]][p]["ci95"] == pytest.approx(v["ci95"])
            for s, sd in a["seeds"].items():
                k, n = pooled["success"][a["name"]][p]["seeds"][int(s)]
                assert (k, n) == (sd["panels"][p]["successes"], sd["panels"][p]["n_trials"])
    for key in ("claim", "look_test"):
        for mine, theirs in zip(pooled[key]["checks"], doc[key]["checks"]):
            assert mine["result"]["p_value"] == theirs["p_value"] and mine["result"]["effect"] == theirs["effect"]
    assert pooled["gap"] == {k: v for k, v in doc["gap_closed"].items()}
    page = (rec / "README.md").read_text()
    for text in ("## The claim (pre-registered)", "## The look test (pre-registered)",
                 "## Pseudo-real alone against with real (not pre-registered: no verdict)", "`tttttttttttt`",
                 "| `real` | 1 real | 0, 1 |", "## Gap closed"):
        assert text in page, text
    assert str(run["root"]) not in page
    # the same records elsewhere (a fresh clone) give the same files, byte for byte
    copy = tmp_path / "clone" / "records"
    shutil.copytree(rec, copy, ignore=shutil.ignore_patterns("README.md", "table.png"))
    out = subprocess.run([sys.executable, "-m", "comsim.cli", "table", str(copy)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])["claim"] in ("HOLDS", "DOES NOT HOLD")
    for name in ("README.md", "table.png"):
        assert (copy / name).read_bytes() == (rec / name).read_bytes(), name
    assert (copy / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_from_the_run_folder_gives_the_records_the_run_wrote_and_skips_unfinished_arms(run, tmp_path):
    out = tmp_path / "again"
    report = export_run(run["root"] / "exp", out, log=lambda *_: None)
    assert report == {"written": ["real/seed0", "real/seed1", "real_pseudo/seed0", "real_pseudo/seed1",
                                  "pseudo/seed0"], "skipped": []}
    for f in sorted(run["records"].rglob("*")):
        if f.is_file() and f.name not in ("README.md", "table.png"):
            assert (out / f.relative_to(run["records"])).read_bytes() == f.read_bytes(), f
    # a run whose paths are relative to the folder it ran from (as `comsim demo` makes them) exports from anywhere
    moved = tmp_path / "elsewhere" / "runs" / "x" / "policy"
    shutil.copytree(run["root"] / "exp", moved, ignore=shutil.ignore_patterns("cache"))
    results = json.loads((moved / "results.json").read_text())
    results["config"]["output_dir"] = "runs/x/policy"
    (moved / "results.json").write_text(json.dumps(results))
    assert export_run(moved, tmp_path / "moved", log=lambda *_: None)["written"] == report["written"]
    for f in sorted((out).rglob("*")):
        if f.is_file():
            assert (tmp_path / "moved" / f.relative_to(out)).read_bytes() == f.read_bytes(), f
    assert Path.cwd() != tmp_path / "elsewhere"  # the working directory is given back
    # an arm with a panel not scored yet is not finished: skipped, nothing written for it
    cfg = load_experiment(run["yaml"])
    d = Path(run["doc"]["arms"][0]["seeds"]["1"]["dir"])
    evals = sorted(d.glob("eval-ood-*.json"))
    hidden = [e.rename(e.with_suffix(".hidden")) for e in evals]
    try:
        report = export_records(cfg, tmp_path / "partial", log=lambda *_: None)
    finally:
        for h in hidden:
            h.rename(h.with_suffix(".json"))
    assert report["skipped"] == ["real/seed1"] and "real/seed1" not in report["written"]
    assert not (tmp_path / "partial" / "real" / "seed1").exists()
    # the claim is undecided while a seed it plans is missing, and the page says which
    doc = pool_table(tmp_path / "partial")
    assert doc["claim"]["holds"] is None
    assert "- The claim: **UNDECIDED** (not recorded: real seed 1)" in (tmp_path / "partial" / "README.md").read_text()


def test_an_arm_without_its_own_commit_keeps_the_commit_its_first_export_recorded(run, tmp_path):
    """An arm trained before arms recorded their commit is recorded with the checkout's commit at export; a later
    export, from a checkout that has moved on, leaves the records already written as they are."""
    exp = tmp_path / "exp"
    shutil.copytree(run["root"] / "exp", exp, ignore=shutil.ignore_patterns("cache"))
    results = json.loads((exp / "results.json").read_text())
    results["config"]["output_dir"] = str(exp)
    (exp / "results.json").write_text(json.dumps(results))
    (exp / "arms" / Path(run["doc"]["arms"][0]["seeds"]["0"]["dir"]).name / COMMIT_FILE).unlink()
    export_run(exp, tmp_path / "rec", log=lambda *_: None)
    manifest = tmp_path / "rec" / "real" / "seed0" / "manifest.json"
    first = json.loads(manifest.read_text())["commit"]
    assert first["recorded"].startswith("at export") and first["commit"]
    earlier = {**first, "commit": "0" * 40}  # what the first export saw, before the checkout moved on
    manifest.write_text(manifest.read_text().replace(first["commit"], earlier["commit"]))
    before = manifest.read_bytes()
    export_run(exp, tmp_path / "rec", log=lambda *_: None)
    assert manifest.read_bytes() == before
    trained = json.loads((tmp_path / "rec" / "real" / "seed1" / "manifest.json").read_text())["commit"]
    assert trained["recorded"] == "when the arm was trained"


def test_a_new_machine_trains_only_the_units_its_records_lack(run, tmp_path):
    """The run folder is gone (another machine), the committed records are there, one unit's records are missing:
    rerunning the experiment trains that unit alone, to the same trials (same seed), and leaves every other record
    byte for byte; a unit recorded for other inputs (another dataset under the same name) is not taken as recorded."""
    recs = tmp_path / "records"
    shutil.copytree(run["records"], recs)
    shutil.rmtree(recs / "real" / "seed1")
    kept = {f: f.read_bytes() for f in recs.rglob("*") if f.is_file() and f.name != records.TABLE_FILE}
    cfg = yaml.safe_load(run["yaml"].read_text())
    cfg.update(output_dir=str(tmp_path / "exp"), records_dir=str(recs))
    (tmp_path / "again.yaml").write_text(yaml.safe_dump(cfg))
    run_experiment(tmp_path / "again.yaml", **QUIET)
    trained = sorted(p.parent.name for p in (tmp_path / "exp").rglob("train_log.json"))
    assert trained == [json.loads((run["records"] / "real" / "seed1" / "manifest.json").read_text())["arm_folder"]]
    assert {f: f.read_bytes() for f in kept} == kept
    assert (recs / "real" / "seed1" / "trials.csv").read_bytes() == \
        (run["records"] / "real" / "seed1" / "trials.csv").read_bytes()
    # another pseudo-real dataset under the same name: the units that train on it are no longer the recorded ones
    ep = LeRobotDataset(run["real"]).read_episode(0)
    other = write_dataset(tmp_path / "pseudo2", [dataclasses.replace(
        ep, provenance=Provenance(source="pseudo_real", task="push", seed=12, translator_hash="t" * 16))], fps=ep.fps)
    assert dataset_fingerprint(other) != dataset_fingerprint(run["pseudo"])
    exp = load_experiment(tmp_path / "again.yaml", [f"datasets.pseudo.path={other}"])
    from comsim.pipeline.experiment import recorded_unit
    by_name = {a.name: a for a in exp.all_arms()}
    assert recorded_unit(exp, by_name["real"], 0) and recorded_unit(exp, by_name["real"], 1)
    assert not recorded_unit(exp, by_name["pseudo"], 0) and not recorded_unit(exp, by_name["real_pseudo"], 1)


def test_records_of_another_table_are_refused_before_anything_is_written(run, tmp_path):
    shutil.copytree(run["records"], tmp_path / "rec")
    before = {f: f.read_bytes() for f in (tmp_path / "rec").rglob("*") if f.is_file()}
    with pytest.raises(InputError, match=r"table.json: claim.identity, claim.min_effect: .*records of another table"):
        export_run(run["yaml"], tmp_path / "rec", overrides=["claim.min_effect=0.2"], log=lambda *_: None)
    with pytest.raises(InputError, match=r"table.json: claim.identity, claim.min_effect"):  # refused up front
        run_experiment(run["yaml"], overrides=["claim.min_effect=0.2", f"records_dir={tmp_path / 'rec'}"], **QUIET)
    assert {f: f.read_bytes() for f in (tmp_path / "rec").rglob("*") if f.is_file()} == before
    other = yaml.safe_load(run["yaml"].read_text())
    other["claim"]["alpha"] = 0.1
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(ConfigError, match=r"other.yaml: claim: expected the run's own"):
        export_run(run["root"] / "exp", tmp_path / "rec", experiment=tmp_path / "other.yaml", log=lambda *_: None)


def test_records_and_comparisons_leave_the_lab_tables_keys_as_they_were():
    """The arms and panels of lab_table keep the folders and files they had before records existed (the keys
    below were computed with the code of 9c92a48): a running table's finished arms stay finished."""
    from comsim.pipeline.experiment import arm_run, eval_key, seed_config, trials_key
    for extra in ([], ["records_dir=docs/results/tables/default", "comparisons=[]"]):
        cfg = load_experiment(ROOT / "configs" / "experiments" / "lab_table.yaml", ["seeds=[0,1,2]", *extra])
        arms = {a.name: a for a in cfg.all_arms()}
        # (arm, seed, its folder, the id panel's eval and trials keys, the ood panel's)
        for arm, seed, folder, id_keys, ood_keys in (
                ("real10", 0, "real10-b02bb79e", "cbe4c4b666ba903f", "a8e015a20d6f2cf5"),
                ("real10_pseudo200", 1, "real10_pseudo200-3fc574e6", "4592cc2c704d4040", "db2a9e56e287ac18")):
            c = seed_config(cfg, seed)
            assert Path(arm_run(c, arms[arm]).output_dir).name == folder
            assert [eval_key(c, p) + trials_key(c, p) for p in ("id", "ood")] == [id_keys, ood_keys]


# ----------------------------------------------------------------------------- records chosen by hand

CLAIM = {"arm": "A", "beats": ["B"], "panels": ["ood"], "test": "mcnemar_exact", "alpha": 0.05,
         "min_effect": 0.1, "statement": "A beats B out of distribution.", "identity": "claim0000001"}


def _defs(**kw):
    return {"experiment": "by hand", "task": "push", "code": 2, "cell": {"file": "cell.yaml", "hash": "cellhash"},
            "panels": {"ood": {"kind": "ood", "n_trials": 25}}, "eval_seed": 100, "training_seed": 0,
            "seeds": [0, 1], "seeded_arms": ["A", "B"],
            "arms": [{"name": "A", "label": "arm A"}, {"name": "B", "label": "arm B"}, {"name": "O", "label": "oracle"}],
            "claim": CLAIM, "look_test": None, "gap": {"baseline": "B", "oracle": "O"}, "comparisons": [],
            "ood_note": "", **kw}


def _manifest(arm, seed, **kw):
    return {"arm": arm, "label": "", "seed": seed, "training_seed": seed, "arm_folder": f"{arm}-0000", "code": 2,
            "cell": {"file": "cell.yaml", "hash": "cellhash"}, "datasets": {"lab": "a" * 64},
            "translator": "tr" * 8 if arm == "A" else None,
            "panels": {"ood": {"identity": {"seed": 100 + seed, "kind": "ood"}, "n_trials": 25, "eval_key": "e",
                               "trials_key": "t"}},
            "claim": "claim0000001", "look_test": None, "train_steps": 2,
            "commit": {"commit": "c" * 40, "dirty": False, "recorded": "when the arm was trained"}, **kw}


def _write(root, outcomes: dict, defs=None, manifests=None):
    """outcomes: (arm, seed) -> list of successes, trial i on lab seed 1000 * seed + i."""
    records.write_definitions(root, defs or _defs())
    for (arm, seed), wins in outcomes.items():
        rows = [{"panel": "ood", "trial": i, "seed": 1000 * seed + i, "success": w, "box": i % 4, "steps": 30}
                for i, w in enumerate(wins)]
        records.write_unit(root, arm, seed, rows, (manifests or {}).get((arm, seed)) or _manifest(arm, seed))


def _hand_table():
    # seed 0, 25 trials: A wins 10 where B fails (trials 0-9), B wins 1 where A fails (24); both win 10-14
    a0 = [i < 15 for i in range(25)]
    b0 = [10 <= i < 15 or i == 24 for i in range(25)]
    # seed 1: A wins 6 alone (0-5), B 2 alone (6, 7), both 8-17
    a1 = [i < 6 or 8 <= i < 18 for i in range(25)]
    b1 = [6 <= i < 18 for i in range(25)]
    return {("A", 0): a0, ("B", 0): b0, ("A", 1): a1, ("B", 1): b1, ("O", 0): [i < 20 for i in range(25)]}


def test_the_page_numbers_are_the_hand_computed_ones(tmp_path):
    _write(tmp_path, _hand_table())
    doc = pool_table(tmp_path)
    page = (tmp_path / "README.md").read_text()
    # Wilson 95% for 15/25: p = 0.6, z^2 = 3.8415: centre (0.6 + z^2/50) / (1 + z^2/25) = 0.67683 / 1.15366
    # = 0.5867, half-width z sqrt(0.6 * 0.4 / 25 + z^2 / 2500) / 1.15366 = 1.96 * 0.10553 / 1.15366 = 0.1793
    assert "s0 60.0% [40.7, 76.6] (15/25)" in page
    # A pooled: 15 + 16 = 31 of 50; B: 6 + 12 = 18 of 50
    assert doc["success"]["A"]["ood"]["pooled"] == (31, 50) and doc["success"]["B"]["ood"]["pooled"] == (18, 50)
    # paired, pooled: A only 10 + 6 = 16, B only 1 + 2 = 3 -> exact McNemar p = 2 P(X <= 3 | Bin(19, 1/2))
    # = 2 (1 + 19 + 171 + 969) / 2^19 = 2320 / 524288 = 0.004425; effect (16 - 3) / 50 = +26 points
    c = doc["claim"]["checks"][0]["result"]
    assert (c["arm_only"], c["other_only"], c["trials"]) == (16, 3, 50)
    assert c["p_value"] == pytest.approx(2320 / 524288) and c["effect"] == pytest.approx(0.26)
    # per seed: 10 vs 1 -> p = 2 (1 + 11) / 2^11 = 0.01172; 6 vs 2 -> p = 2 (1 + 8 + 28) / 2^8 = 0.2891
    assert c["per_seed"][0]["p_value"] == pytest.approx(24 / 2048)
    assert c["per_seed"][1]["p_value"] == pytest.approx(74 / 256)
    assert ("| `A` vs `B` | ood | 0, 1 | 50 | 16 / 3 | +26.0 [" in page
            and "| 0.00443 | s0 +36.0 (0.0117); s1 +16.0 (0.289) | + + | beats |" in page)
    assert doc["claim"]["holds"] is True and "- The claim: **HOLDS**" in page
    # gap closed on pooled rates: (0.62 - 0.36) / (0.80 - 0.36)
    assert doc["gap"]["A"]["ood"] == pytest.approx(0.26 / 0.44) and "| `A` | +0.59 |" in page
    assert "Translator: `trtrtrtrtrtrtrtr`" in page


def test_a_verdict_is_undecided_until_every_planned_seed_is_recorded_and_a_miss_does_not_hold(tmp_path):
    t = _hand_table()
    _write(tmp_path / "partial", {k: v for k, v in t.items() if k != ("B", 1)})
    doc = pool_table(tmp_path / "partial")
    assert doc["claim"]["holds"] is None and doc["claim"]["checks"][0]["missing"] == ["B seed 1"]
    assert "**UNDECIDED** (not recorded: B seed 1)" in (tmp_path / "partial" / "README.md").read_text()
    t[("A", 1)] = list(t[("B", 1)])  # seed 1: the same outcomes
    t[("A", 0)] = [w or i in (0, 1) for i, w in enumerate(t[("B", 0)])]  # seed 0: A wins 2 alone: p = 0.5
    _write(tmp_path / "miss", t)
    doc = pool_table(tmp_path / "miss")
    assert doc["claim"]["holds"] is False and doc["claim"]["checks"][0]["verdict"] == "does not beat"


def test_records_that_disagree_are_refused_by_name(tmp_path):
    t = _hand_table()
    cases = {  # what differs in B seed 1's manifest -> the field the refusal names
        "translator": (_manifest("B", 1, translator="ab" * 8), "translator"),
        "cell": (_manifest("B", 1, cell={"file": "cell.yaml", "hash": "other"}), "cell"),
        "claim": (_manifest("B", 1, claim="claim0000002"), "claim"),
        "data": (_manifest("B", 1, datasets={"lab": "b" * 64}), "datasets.lab"),
        "panel": (_manifest("B", 1, panels={"ood": {"identity": {"seed": 999, "kind": "ood"}, "n_trials": 25,
                                                    "eval_key": "e", "trials_key": "t"}}), "panels.ood.identity.seed"),
    }
    for name, (m, field) in cases.items():
        root = tmp_path / name
        _write(root, t, manifests={("B", 1): m})
        with pytest.raises(InputError) as e:
            pool_table(root)
        msg = str(e.value)
        assert f"{root / 'B' / 'seed1' / 'manifest.json'}: {field}:" in msg, msg
        assert not (root / "README.md").exists()  # refused before anything is written
    # other trial seeds on the same panel: the trials file is named
    root = tmp_path / "trials"
    _write(root, t)
    csv = root / "B" / "seed0" / "trials.csv"
    csv.write_text(csv.read_text().replace("ood,3,3,", "ood,3,77,"))
    with pytest.raises(InputError, match=r"B/seed0/trials.csv: panel ood: seed: expected the trial seeds of"):
        pool_table(root)
    # through the command: one line, exit 2, the arm's file and the field
    out = subprocess.run([sys.executable, "-m", "comsim.cli", "table", str(tmp_path / "cell")], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "B/seed1/manifest.json: cell: expected" in out.stderr, out.stderr


def test_the_figure_is_the_same_bytes_every_time(tmp_path):
    _write(tmp_path / "a", _hand_table())
    _write(tmp_path / "b", _hand_table())
    pool_table(tmp_path / "a")
    pool_table(tmp_path / "b")
    first = (tmp_path / "a" / "table.png").read_bytes()
    pool_table(tmp_path / "a")
    assert first == (tmp_path / "a" / "table.png").read_bytes() == (tmp_path / "b" / "table.png").read_bytes()
    from PIL import Image
    img = Image.open(tmp_path / "a" / "table.png")
    assert img.size[0] > 300 and img.size[1] > 100 and not img.info  # no text chunks (software, time)


def test_table_time_reads_where_each_seeds_time_went(run):
    """bench/table_time.py: per training seed, the arms' training CPU seconds and scoring seconds as recorded."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("table_time", ROOT / "bench" / "table_time.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main([str(run["root"] / "exp")])
    by_seed = defaultdict(list)
    for a in run["doc"]["arms"]:
        for s, sd in a["seeds"].items():
            by_seed[str(s)].append(Path(sd["dir"]))
    assert sorted(out["per_seed"]) == sorted(by_seed) == ["0", "1"]
    for s, dirs in by_seed.items():
        logs = [json.loads((d / "train_log.json").read_text()) for d in dirs]
        scored = [json.loads(f.read_text())["wall_s"] for d in dirs for f in d.glob("eval-*.json")]
        assert out["per_seed"][s]["arms"] == len(dirs)
        assert out["per_seed"][s]["train_cpu_s"] == pytest.approx(sum(round(g["cpu_s"], 1) for g in logs), abs=0.2)
        assert out["per_seed"][s]["score_wall_s"] == pytest.approx(sum(round(w, 1) for w in scored), abs=0.2)
        assert out["per_seed"][s]["complete"]
    with pytest.raises(SystemExit, match="expected a lab table run folder"):
        bench.main([str(run["root"])])
