"""One static HTML page that opens from disk: side-by-side videos, tables, images.

Videos are per-episode H.264 (yuv420p) mp4 files next to the page, so any browser plays
them without a server. The page is written atomically, after all its media exist.
"""
from __future__ import annotations

import html
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
video,img.media{width:192px;image-rendering:pixelated;border:1px solid #bbb}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
p.note{color:#555;font-size:.9em}
"""


@dataclass
class Report:
    """Collects sections, then ``write()`` renders ``out_dir/index.html``."""

    out_dir: Path
    title: str = "ComSim report"
    _body: list[str] = field(default_factory=list)
    _n_media: int = 0

    def __post_init__(self):
        self.out_dir = Path(self.out_dir)
        (self.out_dir / "media").mkdir(parents=True, exist_ok=True)

    def heading(self, text: str) -> None:
        self._body.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str) -> None:
        self._body.append(f"<p class='note'>{html.escape(text)}</p>")

    def video_row(self, clips: list[tuple[str, np.ndarray]], fps: float, caption: str = "") -> None:
        """One row of videos shown side by side, e.g. [("sim", a), ("pseudo-real", b), ("real", c)]."""
        figs = []
        for label, frames in clips:
            self._n_media += 1
            frames = _even(frames)
            name = f"media/clip_{self._n_media:04d}.mp4"
            write_video(self.out_dir / name, frames, fps)
            figs.append(f"<figure><video src='{name}' autoplay loop muted playsinline></video>"
                        f"<figcaption>{html.escape(label)}</figcaption></figure>")
        cap = f"<p class='note'>{html.escape(caption)}</p>" if caption else ""
        self._body.append(f"<div class='row'>{''.join(figs)}</div>{cap}")

    def image(self, path: str | Path, caption: str = "") -> None:
        """Embed an image that already lies under out_dir (plots, overlays)."""
        rel = os.path.relpath(Path(path), self.out_dir)
        self._body.append(f"<figure><img class='media' style='width:auto;max-width:100%' src='{html.escape(rel)}'>"
                          f"<figcaption>{html.escape(caption)}</figcaption></figure>")

    def table(self, rows: list[dict], caption: str = "") -> None:
        if not rows:
            return
        cols = list(dict.fromkeys(k for r in rows for k in r))
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                       for r in rows)
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self._body.append(f"<table>{cap}<tr>{head}</tr>{body}</table>")

    def write(self) -> Path:
        page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
                f"<style>{_CSS}</style></head><body><h1>{html.escape(self.title)}</h1>"
                + "\n".join(self._body) + "</body></html>")
        path = self.out_dir / "index.html"
        with atomic_output(path) as tmp:
            tmp.write_text(page)
        return path


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def _even(frames: np.ndarray) -> np.ndarray:
    # H.264 yuv420p needs even sizes; drop a row/column rather than refuse a report.
    T, H, W, _ = frames.shape
    return np.ascontiguousarray(frames[:, : H - H % 2, : W - W % 2])
