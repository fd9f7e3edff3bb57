"""The report's translator section: how far did the training get, and what does it make?

Reads ``translator/train_summary.json``, which the training loop writes into its output
folder::

    {"steps_planned": int, "steps_done": int, "stopped_early": bool, "stop_reason": str | null,
     "loss": [[step, loss], ...], "sampling": {"num_steps", "w_action", "w_sim"},
     "resolution": [H, W],
     "validation": [{"step": int, "psnr": float, "grid": "validation/step-000600.png"}]}

(the grid path is relative to that folder; its rows are sim | pseudo-real | real at the
translator's native resolution), and ``translator/translator_config.json`` only to say why
no validation ran.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from comsim.report.html import Report, fmt_number, read_json
from comsim.report.plots import line_chart_svg
from comsim.run_layout import RunLayout

SUMMARY = "train_summary.json"


def translator_section(rep: Report, run: Path) -> None:
    layout = RunLayout(run)
    out = layout.translator
    doc = read_json(out / SUMMARY)
    final = layout.translator_final / "translator.json"
    if doc is None:
        if not out.is_dir():
            rep.absent("not run: no translator/ in this run folder")
            return
        rep.absent(f"training summary not written: no {out / SUMMARY} (a training from before the summary "
                   "existed, or one still running or killed before its first checkpoint)")
        meta = read_json(final)
        if isinstance(meta, dict) and meta.get("sampling"):
            rep.table([{"from": "final/translator.json", **meta["sampling"]}], caption="sampling settings")
        return
    if not isinstance(doc, dict):
        raise ValueError(f"{out / SUMMARY}: expected a JSON object")
    done, planned = doc.get("steps_done"), doc.get("steps_planned")
    if doc.get("stopped_early"):
        rep.warn(f"Stopped early at step {done} of {planned}: {doc.get('stop_reason') or 'reason not recorded'}. "
                 "This translator is not the one its config asked for.")
    elif isinstance(done, int) and isinstance(planned, int) and done >= planned:
        rep.ok(f"Trained all {planned} planned steps.")
    sampling = doc.get("sampling") or {}
    res = doc.get("resolution")
    rep.table([{"steps done / planned": f"{done} / {planned}",
                "resolution (H x W)": "x".join(str(v) for v in res) if isinstance(res, list) else "-",
                "sampling steps": sampling.get("num_steps", "-"), "w_action": sampling.get("w_action", "-"),
                "w_sim": sampling.get("w_sim", "-"),
                **{k: v for k, v in sampling.items() if k not in ("num_steps", "w_action", "w_sim")},
                "final loss": _last(doc.get("loss")),
                "final model": "final/" if final.is_file() else "not saved"}],
              caption="translator training (sampling: the settings convert and the held-out metrics use unless "
                      "told otherwise)")
    loss = [(s, v) for s, v in (doc.get("loss") or [])]
    charts = []
    if loss:
        series = {"loss": loss}
        if len(loss) > 50:  # the raw curve is noisy: a running mean shows the trend
            k = max(5, len(loss) // 20)
            v = np.convolve([x for _, x in loss], np.ones(k) / k, mode="valid")
            series[f"running mean of {k}"] = list(zip([s for s, _ in loss][k // 2:], v.tolist()))  # centred
        charts.append(line_chart_svg(series, title="Training loss", xlabel="step"))
    val = sorted((v for v in doc.get("validation") or [] if isinstance(v, dict)), key=lambda v: v.get("step", 0))
    if len(val) > 1:
        series = {"pseudo-real vs real": [(v["step"], v["psnr"]) for v in val]}
        if all(isinstance(v.get("psnr_sim"), (int, float)) for v in val):
            series["raw sim vs real (the bar to beat)"] = [(v["step"], v["psnr_sim"]) for v in val]
        charts.append(line_chart_svg(series, title="Validation PSNR on held-out clips", xlabel="step",
                                     ylabel="PSNR (dB)", log_y=False))
    if charts:
        rep.raw("<div class='row'>" + "".join(charts) + "</div>")
    else:
        rep.absent("no loss recorded: the summary's 'loss' list is empty")
    if not val:
        rep.absent("no validation samples: " + _why_no_validation(out, done))
        return
    last = val[-1]
    grid = out / str(last.get("grid") or "")
    psnr, sim = last.get("psnr"), last.get("psnr_sim")
    raw = f" (raw sim {_db(sim)})" if isinstance(sim, (int, float)) else ""
    rep.text(f"Validation at step {last.get('step')}: PSNR {_db(psnr)}{raw} on held-out clips "
             f"({len(val)} validation{'s' if len(val) > 1 else ''} in all).")
    if isinstance(psnr, (int, float)) and isinstance(sim, (int, float)) and psnr <= sim:
        rep.warn(f"The translator's frames are further from the real ones than the raw sim's ({_db(psnr)} vs "
                 f"{_db(sim)}): at step {last.get('step')} it does not yet improve on the twin's render.")
    if last.get("grid") and grid.is_file():
        size = f" at the translator's {'x'.join(str(v) for v in res)} px" if isinstance(res, list) else ""
        rep.row([rep.image_figure(grid, f"step {last.get('step')}: rows sim | pseudo-real | real per clip{size}, "
                                        "frames left to right", min_width=480)])
    else:
        rep.absent(f"validation grid not written: {grid} does not exist")


def _db(v) -> str:
    return f"{v:.1f} dB" if isinstance(v, (int, float)) else "-"


def _last(loss) -> str:
    try:
        return fmt_number(float(loss[-1][1]))
    except (TypeError, IndexError, ValueError):
        return "-"


def _why_no_validation(out: Path, done) -> str:
    cfg = read_json(out / "translator_config.json") or {}
    every = (cfg.get("train") or {}).get("validation_steps")
    if isinstance(every, int) and isinstance(done, int) and every > done:
        return f"train.validation_steps is {every}, more than the {done} steps done"
    return "the summary lists none"
