"""Inline SVG plots for the report (no plotting library): bars, a line chart, per-frame
values with outliers marked, and a top view of object positions.

Every plot sizes itself to its text: widths come from an estimate of each label's
rendered width (``text_width``), so a long title widens the plot instead of being cut
off. The page's own check (``html.py``) measures the real boxes in the browser.
"""
from __future__ import annotations

import html
import math

COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
GOOD, BAD, MUTED = "#2a9d4b", "#c44e52", "#888"


def text_width(text: str, size: float, bold: bool = False) -> float:
    """A generous estimate of ``text``'s width in px in a sans-serif font of ``size`` px."""
    wide = sum(1 for c in text if c.isupper() or c in "mwMW%@")
    narrow = sum(1 for c in text if c in "ilj.,:;|!' ()[]1")
    per = 0.62 if bold else 0.58
    return size * (per * (len(text) - wide - narrow) + 0.82 * wide + 0.34 * narrow) + 2


def _esc(v) -> str:
    return html.escape(str(v))


def _open(w: float, h: float, title: str) -> str:
    return (f"<svg class='plot' xmlns='http://www.w3.org/2000/svg' width='{math.ceil(w)}' height='{math.ceil(h)}' "
            f"viewBox='0 0 {math.ceil(w)} {math.ceil(h)}' role='img' aria-label='{_esc(title)}'>")


def _title(x: float, title: str) -> str:
    return f"<text x='{x}' y='14' font-size='12' font-weight='bold'>{_esc(title)}</text>"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """Round tick values covering [lo, hi] (about ``n`` of them)."""
    if not (_finite(lo) and _finite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _tick(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2g}"


# -- bars ----------------------------------------------------------------------------------------
def bar_chart_svg(groups: dict[str, dict[str, float | None]], title: str = "", unit: str = "",
                  intervals: dict[str, dict[str, tuple[float, float]]] | None = None,
                  vmax: float | None = None, percent: bool = False) -> str:
    """A grouped bar chart. ``groups``: {group: {series: value}} (e.g. {"id": {"10 real": 0.1}});
    ``intervals`` the same shape with (low, high) whiskers; None/NaN values are drawn as "n/a"."""
    series = list(dict.fromkeys(s for g in groups.values() for s in g))
    if not groups or not series:
        return ""
    vals = [v for g in groups.values() for v in g.values() if _finite(v)]
    for g in (intervals or {}).values():
        vals += [hi for (_, hi) in g.values() if _finite(hi)]
    top = vmax if vmax is not None else (max(vals) * 1.1 if vals and max(vals) > 0 else 1.0)
    fmt = (lambda v: f"{100 * v:.0f}%") if percent else (lambda v: f"{v:.3g}")
    full_title = title + (f" ({unit})" if unit else "")
    bw, gap, ph, topm = 30, 24, 140, 24
    left = 8 + max(text_width(fmt(top * f), 10) for f in (0.0, 0.5, 1.0))
    gw = max(bw * len(series) + gap, max(text_width(str(g), 11) for g in groups) + 8)
    legend_h = 16 * len(series) + 6
    w = max(left + gw * len(groups) + 10, left + text_width(full_title, 12, bold=True) + 6,
            left + 14 + max(text_width(str(s), 11) for s in series) + 6)
    h = topm + ph + 22 + legend_h

    def y(v):
        return topm + ph - ph * max(0.0, min(v, top)) / top

    out = [_open(w, h, full_title), _title(left, full_title),
           f"<line x1='{left}' y1='{topm}' x2='{left}' y2='{topm + ph}' stroke='#888'/>",
           f"<line x1='{left}' y1='{topm + ph}' x2='{w - 6}' y2='{topm + ph}' stroke='#888'/>"]
    for frac in (0.0, 0.5, 1.0):
        out.append(f"<text x='{left - 4}' y='{y(top * frac) + 4:.1f}' font-size='10' text-anchor='end'>"
                   f"{fmt(top * frac)}</text>")
    for gi, (gname, g) in enumerate(groups.items()):
        x0 = left + gi * gw + (gw - bw * len(series)) / 2
        for si, s in enumerate(series):
            v, x = g.get(s), x0 + si * bw
            if not _finite(v):
                out.append(f"<text x='{x + bw / 2:.1f}' y='{topm + ph - 4}' font-size='9' text-anchor='middle' "
                           f"fill='{MUTED}'>n/a</text>")
                continue
            out.append(f"<rect x='{x + 2:.1f}' y='{y(v):.1f}' width='{bw - 4}' height='{topm + ph - y(v):.1f}' "
                       f"fill='{COLORS[si % len(COLORS)]}'><title>{_esc(f'{s} / {gname}: {fmt(v)}')}</title></rect>")
            lohi = (intervals or {}).get(gname, {}).get(s)
            if lohi and all(_finite(t) for t in lohi):
                xc = x + bw / 2
                out.append(f"<path d='M{xc:.1f} {y(lohi[0]):.1f}V{y(lohi[1]):.1f}M{xc - 4:.1f} {y(lohi[0]):.1f}"
                           f"h8M{xc - 4:.1f} {y(lohi[1]):.1f}h8' stroke='#222' fill='none'/>")
        out.append(f"<text x='{left + gi * gw + gw / 2:.1f}' y='{topm + ph + 14}' font-size='11' "
                   f"text-anchor='middle'>{_esc(gname)}</text>")
    for si, s in enumerate(series):
        ly = topm + ph + 24 + 16 * si
        out.append(f"<rect x='{left}' y='{ly}' width='10' height='10' fill='{COLORS[si % len(COLORS)]}'/>"
                   f"<text x='{left + 14}' y='{ly + 9}' font-size='11'>{_esc(s)}</text>")
    out.append("</svg>")
    return "".join(out)


# -- a line chart --------------------------------------------------------------------------------
def line_chart_svg(series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str = "",
                   log_y: bool | None = None, width: int = 420, height: int = 180) -> str:
    """Lines of (x, y) points, e.g. {"loss": [(step, loss), ...]}. ``log_y=None``: a log axis
    when every value is positive and they span more than 20x."""
    pts = {k: [(float(x), float(y)) for x, y in v if _finite(x) and _finite(y)] for k, v in series.items()}
    pts = {k: v for k, v in pts.items() if v}
    if not pts:
        return ""
    xs = [x for v in pts.values() for x, _ in v]
    ys = [y for v in pts.values() for _, y in v]
    if log_y is None:
        log_y = min(ys) > 0 and max(ys) / min(ys) > 20
    f = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    ylo, yhi = f(min(ys)), f(max(ys))
    if yhi - ylo < 1e-12:
        ylo, yhi = ylo - 0.5, yhi + 0.5
    if log_y:
        yt = [10.0 ** e for e in range(math.floor(ylo), math.ceil(yhi) + 1)]
        ylo, yhi = math.floor(ylo), math.ceil(yhi)
    else:
        pad = 0.05 * (yhi - ylo)
        ylo, yhi = ylo - pad, yhi + pad
        yt = [t for t in nice_ticks(ylo, yhi) if ylo <= t <= yhi]
    xlo, xhi = min(xs), max(xs)
    if xhi - xlo < 1e-12:
        xlo, xhi = xlo - 1, xhi + 1
    xt = [t for t in nice_ticks(xlo, xhi) if xlo <= t <= xhi]
    left = 10 + max(text_width(_tick(t), 10) for t in yt)
    topm, bottom = 34 if ylabel else 24, 36
    legend = len(pts) > 1
    pw = width - left - 14
    w = max(width, left + text_width(title, 12, bold=True) + 6, left + text_width(ylabel, 10) + 6)
    h = height + (14 * len(pts) + 4 if legend else 0)
    ph = height - topm - bottom

    def X(x):
        return left + pw * (x - xlo) / (xhi - xlo)

    def Y(y):
        return topm + ph - ph * (f(y) - ylo) / (yhi - ylo)

    out = [_open(w, h, title), _title(left, title)]
    if ylabel:
        out.append(f"<text x='{left}' y='28' font-size='10' fill='#555'>{_esc(ylabel)}</text>")
    out.append(f"<rect x='{left}' y='{topm}' width='{pw}' height='{ph}' fill='none' stroke='#888'/>")
    for t in yt:
        out.append(f"<line x1='{left}' x2='{left + pw}' y1='{Y(t):.1f}' y2='{Y(t):.1f}' stroke='#eee'/>"
                   f"<text x='{left - 4}' y='{Y(t) + 3.5:.1f}' font-size='10' text-anchor='end'>{_tick(t)}</text>")
    for t in xt:
        out.append(f"<text x='{X(t):.1f}' y='{topm + ph + 13}' font-size='10' text-anchor='middle'>{_tick(t)}</text>")
    out.append(f"<text x='{left + pw / 2:.1f}' y='{topm + ph + 28}' font-size='10' text-anchor='middle' "
               f"fill='#555'>{_esc(xlabel)}</text>")
    for i, (name, v) in enumerate(pts.items()):
        c = COLORS[i % len(COLORS)]
        d = "M" + "L".join(f"{X(x):.1f} {Y(y):.1f}" for x, y in v)
        out.append(f"<path d='{d}' fill='none' stroke='{c}' stroke-width='1.5'><title>{_esc(name)}</title></path>")
        if len(v) <= 30:
            out += [f"<circle cx='{X(x):.1f}' cy='{Y(y):.1f}' r='2.5' fill='{c}'><title>"
                    f"{_esc(f'{name}: {y:.4g} at {xlabel} {x:g}')}</title></circle>" for x, y in v]
        if legend:
            ly = height + 14 * i
            out.append(f"<rect x='{left}' y='{ly}' width='10' height='3' fill='{c}'/>"
                       f"<text x='{left + 14}' y='{ly + 5}' font-size='11'>{_esc(name)}</text>")
    out.append("</svg>")
    return "".join(out)


# -- per-frame values ----------------------------------------------------------------------------
def frame_values_svg(values: list[tuple[str, float]], marked: dict[str, str], title: str,
                     vmax: float = 1.0, reference: float | None = None) -> str:
    """One dot per frame (x: its index), marked frames red with an index label; ``reference``
    (e.g. the trusted frames' mean) as a dashed line. The axis starts below the lowest value."""
    vals = [(n, v) for n, v in values if _finite(v)]
    if not vals:
        return ""
    lo = min(0.8, math.floor(min(v for _, v in vals) * 10) / 10)
    step = max(8, min(22, 480 // max(1, len(vals))))
    yt = nice_ticks(lo, vmax, 4)
    left, topm, ph = 10 + max(text_width(_tick(t), 10) for t in yt), 24, 120
    legend = "red: outlier frames (see the table)" if marked else "no outlier frames"
    w = max(left + step * len(vals) + 16, left + text_width(title, 12, bold=True) + 6,
            left + text_width(legend, 10) + 6)
    h = topm + ph + 44

    def Y(v):
        return topm + ph - ph * (max(lo, min(v, vmax)) - lo) / (vmax - lo)

    out = [_open(w, h, title), _title(left, title),
           f"<rect x='{left}' y='{topm}' width='{step * len(vals) + 8}' height='{ph}' fill='none' stroke='#888'/>"]
    for t in yt:
        out.append(f"<line x1='{left}' x2='{left + step * len(vals) + 8}' y1='{Y(t):.1f}' y2='{Y(t):.1f}' "
                   f"stroke='#eee'/><text x='{left - 4}' y='{Y(t) + 3.5:.1f}' font-size='10' "
                   f"text-anchor='end'>{_tick(t)}</text>")
    if _finite(reference):
        out.append(f"<line x1='{left}' x2='{left + step * len(vals) + 8}' y1='{Y(reference):.1f}' "
                   f"y2='{Y(reference):.1f}' stroke='#4C72B0' stroke-dasharray='4 3'/>")
    label_every = 1 if step >= 14 else 5
    for i, (name, v) in enumerate(vals):
        x = left + 4 + step * (i + 0.5)
        bad = name in marked
        tip = f"{name}: {v:.3f}" + (f" ({marked[name]})" if bad else "")
        out.append(f"<circle cx='{x:.1f}' cy='{Y(v):.1f}' r='{4 if bad else 3}' fill='{BAD if bad else '#4C72B0'}'>"
                   f"<title>{_esc(tip)}</title></circle>")
        if bad or i % label_every == 0:
            out.append(f"<text x='{x:.1f}' y='{topm + ph + 12}' font-size='9' text-anchor='middle' "
                       f"fill='{BAD if bad else '#555'}'>{i}</text>")
    out.append(f"<text x='{left}' y='{topm + ph + 36}' font-size='10' fill='#555'>{_esc(legend)}</text>")
    out.append("</svg>")
    return "".join(out)


# -- top view ------------------------------------------------------------------------------------
def top_view_svg(trials: list[dict], bounds: tuple[float, float, float, float], title: str,
                 size: int = 200) -> str:
    """Start -> final object position of each trial, seen from above with the robot below:
    up is the base frame's +x (away from the robot), left is +y. ``trials``: [{"start": (x, y),
    "final": (x, y), "target": (x, y) | None, "success": bool, "label": str}]; ``bounds``:
    (x_min, x_max, y_min, y_max) in metres, shared by the plots that are to be compared."""
    x0, x1, y0, y1 = bounds
    span = max(x1 - x0, y1 - y0, 1e-3)
    s = (size - 40) / span  # px per metre, equal on both axes
    left, topm = 36, 24
    pw, ph = (y1 - y0) * s, (x1 - x0) * s
    legend = ["o start   \u25cf final", "green: success   red: failure", "\u2715 target"]
    w = max(left + pw + 12, left + text_width(title, 12, bold=True) + 6,
            left + max(text_width(t, 10) for t in legend) + 6)
    h = topm + ph + 30 + 13 * len(legend)

    def P(xy):  # base frame (x, y) -> screen (u, v)
        return left + (y1 - xy[1]) * s, topm + (x1 - xy[0]) * s

    out = [_open(w, h, title), _title(left, title),
           f"<rect x='{left}' y='{topm}' width='{pw:.1f}' height='{ph:.1f}' fill='#fafafa' stroke='#888'/>"]
    for t in nice_ticks(x0, x1, 5):
        if x0 <= t <= x1:
            v = P((t, y1))[1]
            out.append(f"<text x='{left - 3}' y='{v + 3.5:.1f}' font-size='9' text-anchor='end'>{t:.2f}</text>")
    for t in nice_ticks(y0, y1, 5):
        if y0 <= t <= y1:
            u = P((x1, t))[0]
            out.append(f"<text x='{u:.1f}' y='{topm + ph + 11}' font-size='9' text-anchor='middle'>{t:.2f}</text>")
    out.append(f"<text x='{left + pw / 2:.1f}' y='{topm + ph + 22}' font-size='9' text-anchor='middle' "
               f"fill='#555'>y (m), +y left; x (m) up</text>")
    for t in trials:
        c = GOOD if t["success"] else BAD
        (u0, v0), (u1, v1) = P(t["start"]), P(t["final"])
        tip = _esc(t.get("label", ""))
        out.append(f"<g><title>{tip}</title><line x1='{u0:.1f}' y1='{v0:.1f}' x2='{u1:.1f}' y2='{v1:.1f}' "
                   f"stroke='{c}' stroke-width='1.2' opacity='0.8'/>"
                   f"<circle cx='{u1:.1f}' cy='{v1:.1f}' r='3' fill='{c}'/>"
                   f"<circle cx='{u0:.1f}' cy='{v0:.1f}' r='5' fill='none' stroke='{c}'/></g>")  # ring stays visible
        if t.get("target") is not None:
            u, v = P(t["target"])
            out.append(f"<path d='M{u - 4:.1f} {v - 4:.1f}l8 8M{u - 4:.1f} {v + 4:.1f}l8 -8' stroke='#222' "
                       f"stroke-width='1.5'/>")
    for i, t in enumerate(legend):
        out.append(f"<text x='{left}' y='{topm + ph + 36 + 13 * i}' font-size='10' fill='#555'>{_esc(t)}</text>")
    out.append("</svg>")
    return "".join(out)
