"""The report's policy section: success rates, and what the rollouts look like.

Reads the experiment's ``results.json`` (``comsim.pipeline.experiment``) and, for every arm
and panel, the panel's eval file in the arm's folder (``arms/<arm>-<hash>/eval-<panel>-<key>.json``)
with its per-trial list: ``seed``, ``success``, ``start_xy``, ``final_xy`` (the main object's
[x, y]), ``target_xy`` ([x, y] or null) and ``video`` (an mp4 path
relative to the arm folder, or null); without positions the plot says so.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from comsim.report.html import Report, fmt_seconds, missing_figure, read_json
from comsim.report.plots import bar_chart_svg, line_chart_svg, top_view_svg
from comsim.run_layout import ExperimentLayout, RunLayout


def _comparison_row(c: dict) -> dict:
    row = {"comparison": f"{c.get('arm')} vs {c.get('other')}", "panel": c.get("panel")}
    if isinstance(c.get("effect"), (int, float)) and isinstance(c.get("ci95"), list):
        lo, hi = c["ci95"]
        row.update({"paired trials": c.get("trials"), "arm only / other only": f"{c.get('arm_only')} / {c.get('other_only')}",
                    "effect [95% CI]": f"{100 * c['effect']:+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}] points",
                    "p (exact McNemar)": f"{c.get('p_value'):.3g}" if isinstance(c.get("p_value"), float) else "-"})
    row["result"] = c.get("result")
    return row


def policy_section(rep: Report, run: Path) -> None:
    path = next((p for p in (RunLayout(run).policy_results, ExperimentLayout(run).results) if p.is_file()), None)
    doc = read_json(path) if path else None
    if not isinstance(doc, dict) or "arms" not in doc:
        rep.absent("not run: no policy/results.json (written by the policy experiment, "
                   "eval/eval_policy.py or `comsim demo`)")
        return
    arms = doc.get("arms") or []
    panels = list(((doc.get("config") or {}).get("eval") or {}).get("panels") or
                  dict.fromkeys(p for a in arms for p in (a.get("panels") or {})))
    rows = doc.get("rows") or [{"arm": _label(a), "status": a.get("status")} for a in arms]
    cfg = doc.get("config") or {}
    train, ev = cfg.get("train") or {}, cfg.get("eval") or {}
    if train.get("steps") and ev.get("n_trials"):  # how big this run is, said before its numbers
        rep.text(f"Size: {train['steps']} training steps of batch {train.get('batch_size')} per arm, "
                 f"{ev['n_trials']} trials per panel ({doc.get('experiment', '')}).")
    rep.table(rows, caption=f"{doc.get('experiment', '')}: success rate with 95% Wilson interval "
              "(successes/trials), per evaluation panel (id: in distribution, ood: out of distribution)")
    if doc.get("ood_note"):
        rep.text(f"OOD: {doc['ood_note']}")
    claim = doc.get("claim")
    if claim:
        verdict = {True: "holds", False: "does not hold", None: "undecided"}.get(claim.get("holds"), "?")
        rep.text((f"{claim['statement']} " if claim.get("statement") else "")
                 + f"Claim, fixed before the run: {claim.get('arm')} beats {', '.join(claim.get('beats', []))} on "
                 f"{', '.join(claim.get('panels', []))} ({claim.get('rule', '')}): {verdict}.")
        rep.table([_comparison_row(c) for c in claim.get("checks") or [] if isinstance(c, dict)],
                  caption="the claim's paired comparisons (the same trials for both arms)")
    groups, whiskers = {}, {}
    for p in panels:
        for a in arms:
            res = (a.get("panels") or {}).get(p) if a.get("status") == "done" else None
            groups.setdefault(p, {})[_label(a)] = res["success_rate"] if res else None
            if res and res.get("ci95"):
                whiskers.setdefault(p, {})[_label(a)] = tuple(res["ci95"])
    if any(v is not None for g in groups.values() for v in g.values()):
        rep.raw("<div class='row'>" + bar_chart_svg(groups, title="Policy success rate", unit="95% interval",
                                                     intervals=whiskers, vmax=1.0, percent=True) + "</div>")
    _curves(rep, doc, arms, panels)
    done = [a for a in arms if a.get("status") == "done"]
    rep.table([_times(a, panels) for a in done if isinstance(a.get("train"), dict)],
              caption="training and evaluation per arm (wall times)")
    _rollouts(rep, path.parent, done, panels)


def _curves(rep: Report, doc: dict, arms: list[dict], panels: list[str]) -> None:
    """The oracle curve (success against the number of real demonstrations) and the sweep
    (success against the synthetic fraction), one line per panel."""
    svgs = []
    curve = doc.get("curve") or []
    if curve:
        series = {p: [(q["real_episodes"], q[p]["success_rate"]) for q in curve if p in q] for p in panels}
        svgs.append(line_chart_svg(series, title="Oracle curve: success vs real demonstrations",
                                   xlabel="real demonstrations", ylabel="success rate", log_y=False))
    sweep = set(doc.get("sweep_points") or doc.get("sweep") or [])  # results.json before sweep_points: "sweep"
    points = [a for a in arms if a.get("name") in sweep and a.get("status") == "done"]
    if points:
        frac = {a["name"]: a.get("synthetic_fraction", a.get("synthetic_fraction_requested")) for a in points}
        series = {p: sorted((frac[a["name"]], a["panels"][p]["success_rate"]) for a in points
                            if frac[a["name"]] is not None and p in a.get("panels", {})) for p in panels}
        svgs.append(line_chart_svg(series, title="Synthetic-fraction sweep", xlabel="synthetic fraction",
                                   ylabel="success rate", log_y=False))
    if any(svgs):
        rep.raw("<div class='row'>" + "".join(svgs) + "</div>")
    gaps = doc.get("gap_closed") or {}
    gap = (doc.get("config") or {}).get("gap")
    if gaps and gap:
        rep.text(f"Gap closed = (arm - {gap.get('baseline')}) / ({gap.get('oracle')} - {gap.get('baseline')}) per "
                 "panel, from the success rates ('-' where the oracle is no better than the baseline).")


def _label(arm: dict) -> str:
    return str(arm.get("label") or arm.get("name"))


def _times(arm: dict, panels: list[str]) -> dict:
    t = arm["train"]
    row = {"arm": _label(arm), "training steps": t.get("steps"), "final loss": t.get("final_loss"),
           "step time": fmt_seconds(t.get("step_time_s")), "training time": fmt_seconds(t.get("wall_s"))}
    if t.get("cpu_s"):
        row["training CPU time"] = fmt_seconds(t["cpu_s"])
    for p in panels:
        row[f"{p} eval time"] = fmt_seconds(((arm.get("panels") or {}).get(p) or {}).get("wall_s"))
    return row


# -- rollouts ------------------------------------------------------------------------------------
def _rollouts(rep: Report, exp_dir: Path, arms: list[dict], panels: list[str]) -> None:
    rep.heading("Rollouts", 3)
    if not arms:
        rep.absent("no arm finished: nothing was rolled out")
        return
    found = {}  # (arm, panel) -> (arm dir, eval doc or None, why not)
    for a in arms:
        adir = _arm_dir(exp_dir, a)
        for p in panels:
            found[a["name"], p] = (adir, *_eval_doc(adir, a, p))
    plots = {k: _positions(v[1]) for k, v in found.items() if v[1] is not None}
    pts = [xy for trials in plots.values() if trials for t in trials
           for xy in (t["start"], t["final"], t["target"]) if xy is not None]
    bounds = _bounds(pts) if pts else None
    rep.text("Per arm and panel: one successful and one failed rollout (the first of each recorded), and every "
             "trial's main object from its start (ring) to its final position (dot) against the target (cross), "
             "seen from above with the robot below; all plots share one scale.")
    for a in arms:
        rep.heading(_label(a), 4)
        for p in panels:
            adir, ev, why = found[a["name"], p]
            if ev is None:
                rep.row([missing_figure(why, f"{p}: successful rollout"), missing_figure(why, f"{p}: failed rollout")])
                continue
            trials = [t for t in ev.get("trials") or [] if isinstance(t, dict)]
            figs = [_video(rep, adir, p, trials, True), _video(rep, adir, p, trials, False)]
            tv = plots.get((a["name"], p))
            res = (a.get("panels") or {}).get(p) or {}
            title = f"{p}: {res.get('successes', '?')}/{res.get('n_trials', '?')} successes"
            if tv:
                figs.append(top_view_svg(tv, bounds, title))
            else:
                figs.append(missing_figure("no per-trial positions recorded" if trials else
                                           "no per-trial list in this eval file", title))
            rep.row(figs)


def _arm_dir(exp_dir: Path, arm: dict) -> Path | None:
    d = arm.get("dir")
    if not d:
        return None
    for cand in (ExperimentLayout(exp_dir).arms / Path(d).name, Path(d)):  # the run folder may have moved
        if cand.is_dir():
            return cand
    return None


def _eval_doc(adir: Path | None, arm: dict, panel: str):
    """(eval doc, None) or (None, why not). The panel's file is the one whose wall time is the
    one results.json reports (its name's key hashes an eval config the report does not know)."""
    if adir is None:
        return None, f"arm folder {arm.get('dir')} not found"
    files = ExperimentLayout.eval_files(adir, panel)
    if not files:
        return None, f"no eval-{panel}-*.json in {adir.name}"
    want = ((arm.get("panels") or {}).get(panel) or {}).get("wall_s")
    docs = []
    for f in files:
        try:
            docs.append((f, read_json(f)))
        except ValueError as e:  # one broken file: say so in its place, keep the rest of the page
            docs.append((f, str(e)))
    for f, d in docs:
        if isinstance(d, dict) and want is not None and d.get("wall_s") == want:
            return d, None
    f, d = max(docs, key=lambda fd: fd[0].stat().st_mtime)
    return (d, None) if isinstance(d, dict) else (None, d if isinstance(d, str) else f"{f.name}: not a JSON object")


def _video(rep: Report, adir: Path, panel: str, trials: list[dict], success: bool) -> str:
    kind = "successful" if success else "failed"
    mine = [t for t in trials if bool(t.get("success")) == success]
    label = f"{panel}: {kind} rollout"
    if not mine:
        return missing_figure(f"no {kind} trial ({len(trials)} trials)" if trials else "no per-trial list", label)
    for t in mine:
        v = t.get("video")
        if v and (adir / v).is_file():
            return rep.video_figure(adir / v, f"{label}: trial {t.get('trial', '?')}, seed {t.get('seed', '?')}")
    return missing_figure(f"no video of a {kind} trial recorded", label)


def _positions(ev: dict) -> list[dict] | None:
    """Trials as top-view points of the main object (None if the eval file has no positions)."""
    trials = [t for t in ev.get("trials") or [] if isinstance(t, dict) and t.get("start_xy") and t.get("final_xy")]
    if not trials:
        return None

    def xy(v):
        if isinstance(v, (list, tuple)) and len(v) >= 2 and all(isinstance(c, (int, float)) for c in v[:2]):
            return float(v[0]), float(v[1])
        return None

    out = []
    for t in trials:
        s, f = xy(t["start_xy"]), xy(t["final_xy"])
        if s is None or f is None:
            continue
        out.append({"start": s, "final": f, "target": xy(t.get("target_xy")), "success": bool(t.get("success")),
                    "label": f"trial {t.get('trial', '?')} seed {t.get('seed', '?')}: "
                             f"{'success' if t.get('success') else 'failure'}" + _distance(t.get("final_distance"))})
    return out or None


def _distance(d) -> str:
    return f", ends {100 * d:.1f} cm from the target" if isinstance(d, (int, float)) else ""


def _bounds(points: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    p = np.asarray(points, np.float64)
    lo, hi = p.min(0), p.max(0)
    c, half = (lo + hi) / 2, max(float((hi - lo).max()) / 2 * 1.15 + 0.02, 0.05)  # room for the markers
    return c[0] - half, c[0] + half, c[1] - half, c[1] + half
