"""One static HTML page that opens from disk: side-by-side videos, tables, inline SVG plots.

Videos are per-episode H.264 (yuv420p) mp4 files in a folder next to the page, linked by
relative paths, so any browser plays them from ``file://`` without a server. The page is
written atomically, after all its media exist; media files of an earlier build that the
new page does not use are removed.

A small inline script records, on ``<body>``, how many videos loaded or failed
(``data-videos``, ``data-videos-loaded``, ``data-videos-failed``, ``data-video-errors``),
so a headless browser's DOM dump tells whether the videos really decoded.
"""
from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from comsim.io.video import atomic_output, write_video

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
.row{display:flex;gap:12px;flex-wrap:wrap;align-items:flex-start;margin:.6em 0}
figure{margin:0;text-align:center} figcaption{font-size:.85em;color:#555}
video,img.media{width:192px;image-rendering:pixelated;border:1px solid #bbb;background:#000}
.missing{width:192px;height:144px;display:flex;align-items:center;justify-content:center;
 border:1px dashed #bbb;color:#888;font-size:.85em;background:#fafafa}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
caption{caption-side:top;text-align:left;color:#555;font-size:.9em;padding:.2em 0}
td.bad{color:#a11} td.skip{color:#a60} td.none{color:#888}
p.note{color:#555;font-size:.9em} svg.plot{margin:.4em 12px .4em 0;font-family:system-ui,sans-serif}
"""

# Records each video's fate on <body> (see the module docstring); checks readyState too,
# in case a video loaded before the listeners were attached.
_VIDEO_STATUS_JS = """
(function(){
 var vs=document.querySelectorAll('video'),b=document.body,ok=0,bad=0,errs=[];
 function upd(){b.dataset.videos=vs.length;b.dataset.videosLoaded=ok;b.dataset.videosFailed=bad;
  b.dataset.videoErrors=errs.join(' | ');}
 Array.prototype.forEach.call(vs,function(v){var done=false;
  function good(){if(done)return;done=true;ok++;v.dataset.state='loaded '+v.videoWidth+'x'+v.videoHeight;upd();}
  function fail(){if(done)return;done=true;bad++;var e=v.error;v.dataset.state='error';
   errs.push(v.getAttribute('src')+': '+(e?e.code+' '+e.message:'unknown'));upd();}
  v.addEventListener('loadeddata',good);v.addEventListener('error',fail);
  if(v.readyState>=2)good();else if(v.error)fail();});
 upd();})();
"""


@dataclass
class Report:
    """Collects sections, then ``write()`` renders ``out_dir/page`` with media under ``out_dir/media``."""

    out_dir: Path
    title: str = "ComSim report"
    page: str = "index.html"
    media: str = "media"
    _body: list[str] = field(default_factory=list)
    _n_media: int = 0
    _written: set = field(default_factory=set)

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)
        (self.out_dir / self.media).mkdir(parents=True, exist_ok=True)

    def heading(self, text: str) -> None:
        self._body.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str) -> None:
        self._body.append(f"<p class='note'>{html.escape(text)}</p>")

    def raw(self, markup: str) -> None:
        """Append trusted markup (e.g. an SVG from ``bar_chart_svg``)."""
        self._body.append(markup)

    def video_row(self, clips: list[tuple[str, np.ndarray | None]], fps: float, caption: str = "") -> None:
        """One row of videos side by side, e.g. [("sim", a), ("pseudo-real", b), ("real", None)].

        A clip of ``None`` is drawn as an empty box labelled "not available"."""
        figs = []
        for label, frames in clips:
            if frames is None:
                figs.append(f"<figure><div class='missing'>not available</div>"
                            f"<figcaption>{html.escape(label)}</figcaption></figure>")
                continue
            self._n_media += 1
            name = f"{self.media}/clip_{self._n_media:04d}.mp4"
            write_video(self.out_dir / name, _even(np.asarray(frames)), fps)
            self._written.add(Path(name).name)
            figs.append(f"<figure><video src='{html.escape(name)}' autoplay loop muted playsinline preload='auto'>"
                        f"</video><figcaption>{html.escape(label)}</figcaption></figure>")
        cap = f"<p class='note'>{html.escape(caption)}</p>" if caption else ""
        self._body.append(f"<div class='row'>{''.join(figs)}</div>{cap}")

    def image(self, path: str | Path, caption: str = "") -> None:
        """Embed an image that already lies under out_dir (plots, overlays)."""
        rel = os.path.relpath(Path(path), self.out_dir)
        self._body.append(f"<figure><img class='media' style='width:auto;max-width:100%' src='{html.escape(rel)}'>"
                          f"<figcaption>{html.escape(caption)}</figcaption></figure>")

    def table(self, rows: list[dict], caption: str = "", cls: str = "") -> None:
        if not rows:
            return
        cols = list(dict.fromkeys(k for r in rows for k in r))
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
        body = "".join("<tr>" + "".join(_td(r.get(c, "")) for c in cols) + "</tr>" for r in rows)
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        klass = f" class='{html.escape(cls)}'" if cls else ""
        self._body.append(f"<table{klass}>{cap}<tr>{head}</tr>{body}</table>")

    def write(self) -> Path:
        page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
                f"<style>{_CSS}</style></head><body><h1>{html.escape(self.title)}</h1>\n"
                + "\n".join(self._body) + f"\n<script>{_VIDEO_STATUS_JS}</script></body></html>\n")
        path = self.out_dir / self.page
        with atomic_output(path) as tmp:
            tmp.write_text(page)
        for old in (self.out_dir / self.media).glob("clip_*.mp4"):  # clips of an earlier build
            if old.name not in self._written:
                old.unlink()
        return path


def bar_chart_svg(groups: dict[str, dict[str, float | None]], title: str = "", unit: str = "",
                  intervals: dict[str, dict[str, tuple[float, float]]] | None = None,
                  vmax: float | None = None, percent: bool = False) -> str:
    """A grouped bar chart as inline SVG (no plotting library needed).

    ``groups``: {group: {series: value}} (e.g. {"id": {"10 real": 0.1, ...}}); ``intervals``
    the same shape with (low, high) whiskers; ``None``/NaN values are drawn as "n/a"."""
    series = list(dict.fromkeys(s for g in groups.values() for s in g))
    if not groups or not series:
        return ""
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    vals = [v for g in groups.values() for v in g.values() if _finite(v)]
    for g in (intervals or {}).values():
        vals += [hi for (_, hi) in g.values() if _finite(hi)]
    top = vmax if vmax is not None else (max(vals) * 1.1 if vals and max(vals) > 0 else 1.0)
    bw, gap, ph, left, topm = 30, 24, 140, 44, 24
    gw = bw * len(series) + gap
    legend_h = 16 * len(series) + 6
    w, h = left + gw * len(groups) + 10, topm + ph + 22 + legend_h

    def y(v):
        return topm + ph - ph * max(0.0, min(v, top)) / top

    fmt = (lambda v: f"{100 * v:.0f}%") if percent else (lambda v: f"{v:.3g}")
    out = [f"<svg class='plot' xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' "
           f"role='img' aria-label='{html.escape(title)}'>",
           f"<text x='{left}' y='14' font-size='12' font-weight='bold'>{html.escape(title)}"
           f"{html.escape(f' ({unit})' if unit else '')}</text>",
           f"<line x1='{left}' y1='{topm}' x2='{left}' y2='{topm + ph}' stroke='#888'/>",
           f"<line x1='{left}' y1='{topm + ph}' x2='{w - 6}' y2='{topm + ph}' stroke='#888'/>"]
    for frac in (0.0, 0.5, 1.0):
        out.append(f"<text x='{left - 4}' y='{y(top * frac) + 4:.1f}' font-size='10' text-anchor='end'>"
                   f"{fmt(top * frac)}</text>")
    for gi, (gname, g) in enumerate(groups.items()):
        x0 = left + gap / 2 + gi * gw
        for si, s in enumerate(series):
            v, x = g.get(s), x0 + si * bw
            if not _finite(v):
                out.append(f"<text x='{x + bw / 2:.1f}' y='{topm + ph - 4}' font-size='9' text-anchor='middle' "
                           f"fill='#888'>n/a</text>")
                continue
            out.append(f"<rect x='{x + 2:.1f}' y='{y(v):.1f}' width='{bw - 4}' height='{topm + ph - y(v):.1f}' "
                       f"fill='{colors[si % len(colors)]}'><title>{html.escape(f'{s} / {gname}: {fmt(v)}')}</title>"
                       f"</rect>")
            lohi = (intervals or {}).get(gname, {}).get(s)
            if lohi and all(_finite(t) for t in lohi):
                xc = x + bw / 2
                out.append(f"<path d='M{xc:.1f} {y(lohi[0]):.1f}V{y(lohi[1]):.1f}M{xc - 4:.1f} {y(lohi[0]):.1f}"
                           f"h8M{xc - 4:.1f} {y(lohi[1]):.1f}h8' stroke='#222' fill='none'/>")
        out.append(f"<text x='{x0 + (gw - gap) / 2:.1f}' y='{topm + ph + 14}' font-size='11' "
                   f"text-anchor='middle'>{html.escape(str(gname))}</text>")
    for si, s in enumerate(series):
        ly = topm + ph + 24 + 16 * si
        out.append(f"<rect x='{left}' y='{ly}' width='10' height='10' fill='{colors[si % len(colors)]}'/>"
                   f"<text x='{left + 14}' y='{ly + 9}' font-size='11'>{html.escape(str(s))}</text>")
    out.append("</svg>")
    return "".join(out)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _td(v) -> str:
    text = _fmt(v)
    low = text.lower()
    cls = ("bad" if low.startswith(("failed", "error")) else "skip" if low.startswith("skipped")
           else "none" if low in ("not run", "-", "n/a") else "num" if isinstance(v, (int, float)) else "")
    return f"<td class='{cls}'>{html.escape(text)}</td>" if cls else f"<td>{html.escape(text)}</td>"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def _even(frames: np.ndarray) -> np.ndarray:
    # H.264 yuv420p needs even sizes; drop a row/column rather than refuse a report.
    T, H, W, _ = frames.shape
    return np.ascontiguousarray(frames[:, : H - H % 2, : W - W % 2])
