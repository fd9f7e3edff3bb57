"""A policy table pooled from its trial records alone: the cell's page and its figure.

    comsim table docs/results/tables/workshop       # -> README.md and table.png in that folder

The records folder (``comsim.pipeline.records``, written by ``comsim table export``) holds every trial and
the definitions the table is judged by, so a fresh clone rebuilds the same page, byte for byte, from it:

- success per arm and panel, per training seed and pooled over the seeds recorded, with 95% Wilson intervals;
- paired comparisons (the claim's, the look test's, and the table's other ``comparisons``): trials paired by
  (training seed, panel, trial seed) over the seeds both arms ran, the effect with its interval and the exact
  McNemar p, pooled and per seed with the sign of each seed's effect;
- gap closed = (arm - baseline) / (oracle - baseline) on the pooled success rates;
- the verdict of each pre-registered block: HOLDS, DOES NOT HOLD, or UNDECIDED while a planned (arm, seed) of
  one of its comparisons is not recorded (the page names them);
- table.png: per panel, each arm's per-seed success rates (points) and its pooled interval.

Records that disagree -- another cell, another translator, another dataset under the same name, another panel
for the same seed, another claim -- are refused, naming the file and the field, never pooled.
"""
from __future__ import annotations

import io
from pathlib import Path

from comsim.errors import InputError
from comsim.lab.rollout import wilson_interval
from comsim.pipeline import records
from comsim.pipeline.records import MANIFEST_FILE, TABLE_FILE, TRIALS_FILE, differing_fields, field_at, unit_dir
from comsim.pipeline.stats import compare, meets, rule_text

PAGE_FILE = "README.md"
FIGURE_FILE = "table.png"
VERDICTS = {True: "HOLDS", False: "DOES NOT HOLD", None: "UNDECIDED"}


def planned_seeds(defs: dict, arm: str) -> list[int]:
    """The training seeds the table plans for ``arm`` (the seeded arms every seed, the others seed 0)."""
    return sorted(defs["seeds"]) if arm in defs["seeded_arms"] else [0]


# ----------------------------------------------------------------------------- checking


def check_records(root: Path, defs: dict, units: dict) -> None:
    """Refuse records that cannot be pooled with the others: an InputError names the (arm, seed)'s file and
    the field that disagrees."""
    arms = [a["name"] for a in defs["arms"]]
    ref_panel: dict[tuple[int, str], tuple[dict, Path]] = {}  # (seed, panel) -> the first identity seen, where
    ref_trials: dict[tuple[int, str], tuple[list[int], Path]] = {}
    ref_data: dict[str, tuple[str, Path]] = {}  # dataset name -> fingerprint, where
    translator: tuple[str, Path] | None = None
    for (arm, seed), (m, trials) in units.items():
        d = unit_dir(root, arm, seed)
        path = d / MANIFEST_FILE
        if arm not in arms:
            raise InputError(d, "arm", f"one of the arms of {TABLE_FILE} ({', '.join(arms)})", arm)
        if (m.get("arm"), m.get("seed")) != (arm, seed):
            raise InputError(path, "arm, seed", f"{arm!r} and {seed} (the folder's)", (m.get("arm"), m.get("seed")))
        if seed not in planned_seeds(defs, arm):
            raise InputError(path, "seed", f"a training seed {TABLE_FILE} plans for {arm!r} "
                             f"({planned_seeds(defs, arm)})", seed)
        for field, want in (("cell", defs["cell"]), ("code", defs["code"]),
                            ("claim", (defs["claim"] or {}).get("identity")),
                            ("look_test", (defs["look_test"] or {}).get("identity"))):
            if m.get(field) != want:
                raise InputError(path, field, f"{want!r} (as {TABLE_FILE} says: records of another {field} are not "
                                 "pooled)", m.get(field))
        if sorted(m["panels"]) != sorted(defs["panels"]):
            raise InputError(path, "panels", f"the panels of {TABLE_FILE} ({sorted(defs['panels'])})",
                             sorted(m["panels"]))
        for name, fp in sorted(m["datasets"].items()):
            first = ref_data.setdefault(name, (fp, path))
            if first[0] != fp:
                raise InputError(path, f"datasets.{name}", f"content {first[0][:16]}... as in {first[1]} (another "
                                 "dataset under the same name is not pooled)", f"{fp[:16]}...")
        if m.get("translator"):
            translator = translator or (m["translator"], path)
            if m["translator"] != translator[0]:
                raise InputError(path, "translator", f"{translator[0]} as in {translator[1]} (records of another "
                                 "translator are not pooled)", m["translator"])
        for p, panel in sorted(m["panels"].items()):
            first = ref_panel.setdefault((seed, p), (panel["identity"], path))
            if first[0] != panel["identity"]:
                bad = differing_fields(first[0], panel["identity"])
                raise InputError(path, f"panels.{p}.identity.{bad[0]}", f"{field_at(first[0], bad[0])!r}, the panel "
                                 f"of seed {seed} in {first[1]} (differing: {', '.join(bad)})",
                                 field_at(panel["identity"], bad[0]))
            if panel["n_trials"] != defs["panels"][p]["n_trials"]:
                raise InputError(path, f"panels.{p}.n_trials", f"{defs['panels'][p]['n_trials']} (as {TABLE_FILE} "
                                 "says)", panel["n_trials"])
            rows = sorted((t for t in trials if t["panel"] == p), key=lambda t: t["trial"])
            if [t["trial"] for t in rows] != list(range(panel["n_trials"])):
                raise InputError(d / TRIALS_FILE, f"panel {p}", f"trials 0..{panel['n_trials'] - 1}, one row each",
                                 f"{len(rows)} rows")
            seeds = [t["seed"] for t in rows]
            first_t = ref_trials.setdefault((seed, p), (seeds, d / TRIALS_FILE))
            if first_t[0] != seeds:
                raise InputError(d / TRIALS_FILE, f"panel {p}: seed", f"the trial seeds of {first_t[1]} (the same "
                                 "panel, trial for trial)", "other trial seeds")
        extra = sorted({t["panel"] for t in trials} - set(defs["panels"]))
        if extra:
            raise InputError(d / TRIALS_FILE, "panel", f"one of {sorted(defs['panels'])}", extra[0])


# ----------------------------------------------------------------------------- pooling


def pool(defs: dict, units: dict) -> dict:
    """Every number of the page, from checked records."""
    panels = list(defs["panels"])
    outcomes: dict = {}  # arm -> panel -> seed -> {trial seed: success}
    for (arm, seed), (_, trials) in units.items():
        for t in trials:
            outcomes.setdefault(arm, {}).setdefault(t["panel"], {}).setdefault(seed, {})[t["seed"]] = t["success"]
    success = {}
    for arm, by_panel in outcomes.items():
        success[arm] = {}
        for p in panels:
            per_seed = {s: (sum(o.values()), len(o)) for s, o in sorted(by_panel.get(p, {}).items())}
            k, n = sum(x[0] for x in per_seed.values()), sum(x[1] for x in per_seed.values())
            success[arm][p] = {"seeds": per_seed, "pooled": (k, n), "rate": k / n, "ci95": wilson_interval(k, n)}
    doc = {"panels": panels, "success": success, "gap": _gap(defs, success)}
    for key in ("claim", "look_test"):
        doc[key] = judge(defs, outcomes, units, defs[key]) if defs.get(key) else None
    doc["comparisons"] = [{"title": c["title"], "rows": [
        _row(outcomes, units, defs, arm, other, p) for arm, other in c["pairs"] for p in (c.get("panels") or panels)]}
        for c in defs.get("comparisons") or []]
    return doc


def paired(outcomes: dict, arm: str, other: str, panel: str) -> dict | None:
    """The paired comparison of two arms on one panel, pooled over the seeds both ran and per seed; None when no
    seed has both."""
    a, b = outcomes.get(arm, {}).get(panel, {}), outcomes.get(other, {}).get(panel, {})
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    pooled = compare({(s, t): a[s][t] for s in seeds for t in a[s]}, {(s, t): b[s][t] for s in seeds for t in b[s]})
    return {**pooled, "seeds": seeds, "per_seed": {s: compare(a[s], b[s]) for s in seeds}}


def _missing(defs: dict, units: dict, arm: str, other: str) -> list[str]:
    """The planned (arm, seed)s of a comparison that are not recorded (the seeds both arms plan)."""
    both = sorted(set(planned_seeds(defs, arm)) & set(planned_seeds(defs, other)))
    return [f"{x} seed {s}" for x in (arm, other) for s in both if (x, s) not in units]


def _row(outcomes, units, defs, arm, other, panel) -> dict:
    return {"arm": arm, "other": other, "panel": panel, "missing": _missing(defs, units, arm, other),
            "result": paired(outcomes, arm, other, panel)}


def judge(defs: dict, outcomes: dict, units: dict, block: dict) -> dict:
    """A pre-registered block's verdict: each comparison is decided once every seed both arms plan is recorded
    (then pooled over them); the block holds when every comparison meets the rule, does not hold when a decided
    one misses it, and is undecided otherwise."""
    checks, holds = [], True
    for other in block["beats"]:
        for p in block["panels"]:
            row = _row(outcomes, units, defs, block["arm"], other, p)
            if row["missing"]:
                row["verdict"] = "undecided"
                holds = None if holds is not False else False
            elif meets(row["result"], block["min_effect"], block["alpha"]):
                row["verdict"] = "beats"
            else:
                row["verdict"] = "does not beat"
                holds = False
            checks.append(row)
    return {**block, "holds": holds, "checks": checks, "rule": rule_text(block["min_effect"], block["alpha"])}


def _gap(defs: dict, success: dict) -> dict:
    """arm -> panel -> (arm - baseline) / (oracle - baseline) on pooled rates; None when the baseline or the
    oracle is not recorded or the oracle is no better."""
    g = defs.get("gap")
    out = {}
    for arm in success:
        out[arm] = {}
        for p in defs["panels"]:
            base, oracle = (success.get(x, {}).get(p) for x in ((g or {}).get("baseline"), (g or {}).get("oracle")))
            ok = g and base and oracle and oracle["rate"] > base["rate"]
            out[arm][p] = (success[arm][p]["rate"] - base["rate"]) / (oracle["rate"] - base["rate"]) if ok else None
    return out


# ----------------------------------------------------------------------------- the page


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _rate(k: int, n: int) -> str:
    lo, hi = wilson_interval(k, n)
    return f"{_pct(k / n)}% [{_pct(lo)}, {_pct(hi)}] ({k}/{n})"


def _sign(effect: float) -> str:
    return "+" if effect > 0 else "-" if effect < 0 else "0"


def _comparison_rows(rows: list[dict], verdicts: bool) -> list[str]:
    head = ["Comparison", "Panel", "Seeds", "Paired trials", "Arm only / other only", "Effect [95% CI], points",
            "p (exact McNemar)", "Per seed: effect (p)", "Seed signs"] + (["Result"] if verdicts else [])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = f"`{r['arm']}` vs `{r['other']}`"
        res = r["result"]
        tail = [r["verdict"] + (f" (missing: {', '.join(r['missing'])})" if r["missing"] else "")] if verdicts else []
        if res is None:
            out.append("| " + " | ".join([name, r["panel"], "-", "-", "-", "-", "-", "-", "-"] + tail) + " |")
            continue
        lo, hi = res["ci95"]
        per = "; ".join(f"s{s} {100 * c['effect']:+.1f} ({c['p_value']:.3g})" for s, c in res["per_seed"].items())
        signs = " ".join(_sign(c["effect"]) for c in res["per_seed"].values())
        out.append("| " + " | ".join([
            name, r["panel"], ", ".join(map(str, res["seeds"])), str(res["trials"]),
            f"{res['arm_only']} / {res['other_only']}", f"{100 * res['effect']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]",
            f"{res['p_value']:.3g}", per, signs] + tail) + " |")
    return out


def _block_lines(title: str, block: dict | None) -> list[str]:
    if block is None:
        return []
    verdict = VERDICTS[block["holds"]]
    missing = sorted({m for c in block["checks"] for m in c["missing"]})
    lines = [f"## {title} (pre-registered): {verdict}", ""]
    if block.get("statement"):
        lines += [block["statement"].strip(), ""]
    lines += [f"`{block['arm']}` beats {', '.join(f'`{b}`' for b in block['beats'])} on "
              f"{', '.join(block['panels'])}: {block['rule']}. A comparison is decided once every training seed both "
              "arms plan is recorded.", ""]
    if missing:
        lines += [f"Not recorded yet: {', '.join(missing)}.", ""]
    return lines + _comparison_rows(block["checks"], verdicts=True) + [""]


def render_page(defs: dict, units: dict, doc: dict) -> str:
    panels = doc["panels"]
    labels = {a["name"]: a["label"] for a in defs["arms"]}
    for (arm, _), (m, _) in units.items():
        labels[arm] = labels[arm] or m.get("label") or arm
    cell = defs["cell"]
    translators = sorted({m["translator"] for m, _ in units.values() if m.get("translator")})
    commits = sorted({m["commit"]["commit"] for m, _ in units.values()})
    lines = [f"# {defs['experiment']}: {cell['file'] or 'the built-in lab'}", "",
             "Pooled from the trial records in this folder alone by `comsim table` on this folder (one folder per "
             f"arm and training seed: {TRIALS_FILE}, {MANIFEST_FILE}; the table's definitions in {TABLE_FILE}); the "
             "same records give this page and its figure byte for byte.", "",
             f"- Task `{defs['task']}` in the cell `{cell['file'] or 'built-in lab'}` (content hash `{cell['hash']}`); "
             f"experiment code version {defs['code']}.",
             "- Panels: " + ", ".join(f"{p} ({v['kind']}, {v['n_trials']} trials per training seed)"
                                      for p, v in defs["panels"].items())
             + f"; training seed s trains with seed {defs['training_seed']} + s and is scored on its own panel "
               f"(eval seed {defs['eval_seed']} + s). Seeds {', '.join(map(str, defs['seeds']))} for "
               f"{', '.join(defs['seeded_arms']) or 'no arm'}; the other arms seed 0.",
             f"- Translator: {', '.join(f'`{t}`' for t in translators) or 'none (no recorded arm trains on translated frames)'}.",
             f"- Code: {', '.join(f'`{c[:12]}`' for c in commits) or '-'} (per record below).", ""]
    if defs.get("ood_note"):
        lines += [f"OOD: {defs['ood_note'].strip()}", ""]
    lines += ["## Verdicts", ""]
    for title, key in (("The claim", "claim"), ("The look test", "look_test")):
        b = doc[key]
        if b:
            missing = sorted({m for c in b["checks"] for m in c["missing"]})
            lines.append(f"- {title}: **{VERDICTS[b['holds']]}**" + (f" (not recorded: {', '.join(missing)})"
                                                                     if missing and b["holds"] is None else ""))
    lines += ["", f"![per-seed success and pooled 95% intervals]({FIGURE_FILE})", "",
              "## Success per arm", "",
              "Success rate with its 95% Wilson interval (successes/trials), per training seed and pooled over the "
              "seeds recorded.", ""]
    head = ["Arm", "Label", "Seeds", *[f"{p}: per seed" for p in panels], *[f"{p}: pooled" for p in panels]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in defs["arms"]:
        name = a["name"]
        s = doc["success"].get(name)
        if s is None:
            lines.append("| " + " | ".join([f"`{name}`", labels[name] or "-", "not recorded"] + ["-"] * 2 * len(panels))
                         + " |")
            continue
        seeds = sorted(s[panels[0]]["seeds"])
        per = ["<br>".join(f"s{x} {_rate(*s[p]['seeds'][x])}" for x in seeds) for p in panels]
        lines.append("| " + " | ".join([f"`{name}`", labels[name], ", ".join(map(str, seeds)), *per,
                                        *[_rate(*s[p]["pooled"]) for p in panels]]) + " |")
    lines.append("")
    g = defs.get("gap")
    if g:
        lines += ["## Gap closed", "",
                  f"(arm - `{g['baseline']}`) / (`{g['oracle']}` - `{g['baseline']}`) on the pooled success rates "
                  "(each arm over the seeds it has); '-' where either is not recorded or the oracle is no better.", "",
                  "| Arm | " + " | ".join(panels) + " |", "|---|" + "---|" * len(panels)]
        for a in defs["arms"]:
            if a["name"] in doc["gap"]:
                lines.append(f"| `{a['name']}` | " + " | ".join(
                    "-" if v is None else f"{v:+.2f}" for v in (doc["gap"][a["name"]][p] for p in panels)) + " |")
        lines.append("")
    lines += _block_lines("The claim", doc["claim"]) + _block_lines("The look test", doc["look_test"])
    for c in doc["comparisons"]:
        lines += [f"## {c['title']} (not pre-registered: no verdict)", "",
                  "Paired on the same trials over the training seeds both arms recorded.", ""]
        lines += _comparison_rows(c["rows"], verdicts=False) + [""]
    lines += ["## Records", "", "| Arm | Seed | Training seed | Trials | Commit | Translator | Datasets (content) |",
              "|---|---|---|---|---|---|---|"]
    order = {a["name"]: i for i, a in enumerate(defs["arms"])}
    for (arm, seed), (m, trials) in sorted(units.items(), key=lambda u: (order[u[0][0]], u[0][1])):
        c = m["commit"]
        commit = f"`{c['commit'][:12]}`" + (" (dirty)" if c.get("dirty") else "") + \
            ("" if c.get("recorded") == "when the arm was trained" else " (at export)")
        lines.append(f"| `{arm}` | {seed} | {m['training_seed']} | "
                     + ", ".join(f"{p} {sum(t['panel'] == p for t in trials)}" for p in panels)
                     + f" | {commit} | {'`' + m['translator'][:12] + '`' if m.get('translator') else '-'} | "
                     + ", ".join(f"{k} `{v[:12]}`" for k, v in sorted(m["datasets"].items())) + " |")
    lines.append("")
    if any(m["commit"].get("recorded") != "when the arm was trained" for m, _ in units.values()):
        lines += ["'(at export)': the arm recorded no commit when it was trained; the commit is that of the "
                  "checkout holding its run folder when the records were exported.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the figure

SEED_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]


def draw_figure(defs: dict, doc: dict) -> bytes:
    """PNG bytes: one plot per panel, one row per recorded arm; per-seed success rates as points, the pooled
    rate as a bar inside its 95% interval. Drawn with PIL, which writes no time into the file."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=13)
    arms = [a["name"] for a in defs["arms"] if a["name"] in doc["success"]]
    panels, seeds = doc["panels"], sorted(defs["seeds"])
    label_w = max([int(font.getlength(a)) for a in arms] + [60]) + 16
    plot_w, row_h, top, bottom, gap = 300, 26, 56, 40, 48
    width = label_w + len(panels) * (plot_w + gap)
    height = top + max(1, len(arms)) * row_h + bottom
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    x = 8
    for i, s in enumerate(seeds):  # legend
        c = SEED_COLOURS[i % len(SEED_COLOURS)]
        d.ellipse([x, 10, x + 8, 18], fill=c)
        d.text((x + 12, 7), f"seed {s}", fill="black", font=font)
        x += 20 + int(font.getlength(f"seed {s}"))
    d.line([x + 4, 14, x + 28, 14], fill="black", width=3)
    d.text((x + 34, 7), "pooled, 95% Wilson interval", fill="black", font=font)
    for j, p in enumerate(panels):
        x0 = label_w + j * (plot_w + gap)

        def px(v: float) -> float:
            return x0 + v * plot_w
        d.text((x0, 32), f"{p} success", fill="black", font=font)
        y_end = top + len(arms) * row_h
        for t in (0, 0.25, 0.5, 0.75, 1.0):
            d.line([px(t), top, px(t), y_end], fill=(220, 220, 220), width=1)
            d.text((px(t) - font.getlength(f"{t:.0%}") / 2, y_end + 6), f"{t:.0%}", fill="black", font=font)
        for i, arm in enumerate(arms):
            y = top + i * row_h + row_h / 2
            if j == 0:
                d.text((8, y - 8), arm, fill="black", font=font)
            s = doc["success"][arm][p]
            lo, hi = s["ci95"]
            d.line([px(lo), y, px(hi), y], fill="black", width=3)
            d.line([px(s["rate"]), y - 7, px(s["rate"]), y + 7], fill="black", width=3)
            for k, seed in enumerate(seeds):
                if seed in s["seeds"]:
                    kk, n = s["seeds"][seed]
                    dy = (k - (len(seeds) - 1) / 2) * 4
                    c = SEED_COLOURS[k % len(SEED_COLOURS)]
                    d.ellipse([px(kk / n) - 4, y + dy - 4, px(kk / n) + 4, y + dy + 4], fill=c, outline="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# ----------------------------------------------------------------------------- the command


def pool_table(root: str | Path) -> dict:
    """Check the records in ``root``, pool them and write ``root``/README.md and ``root``/table.png; returns the
    pooled numbers. Reads nothing outside ``root``."""
    root = Path(root)
    defs, units = records.read_records(root)
    check_records(root, defs, units)
    doc = pool(defs, units)
    page = render_page(defs, units, doc)
    records.write_text(root / PAGE_FILE, page)
    records.write_bytes(root / FIGURE_FILE, draw_figure(defs, doc))
    return doc
