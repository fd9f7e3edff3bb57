"""One static HTML page that opens from disk: side-by-side videos, images, tables, inline SVG plots.

Media lie in one folder next to the page, linked by relative paths, so any browser shows
them from ``file://`` without a server and the page plus its folder can be moved as one:
clips made from frames are per-episode H.264 (yuv420p) mp4 files; images and videos
that a stage wrote (overlays, validation grids, rollouts) are copied in. The page is
written atomically, after all its media exist; media of an earlier build that the new
page does not use are removed.

A small inline script records on ``<body>`` what the browser made of the page, so a
headless browser's DOM dump tells whether it really worked: how many videos loaded or
failed (``data-videos``, ``data-videos-loaded``, ``data-videos-failed``,
``data-video-errors``), the same for images (``data-images*``), and every SVG text
whose box does not fit inside its SVG (``data-svg-texts``, ``data-svg-clipped``).
"""
from __future__ import annotations

import html
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from comsim.io.files import atomic_output
from comsim.io.video import video_info, write_video

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
h3{font-size:1.05em;margin:1.2em 0 .3em}
.row{display:flex;gap:12px;flex-wrap:wrap;align-items:flex-start;margin:.6em 0}
figure{margin:0;text-align:center} figcaption{font-size:.85em;color:#555}
video,img.media{width:192px;image-rendering:pixelated;border:1px solid #bbb;background:#000}
.missing{width:192px;height:144px;display:flex;align-items:center;justify-content:center;
 border:1px dashed #bbb;color:#888;font-size:.85em;background:#fafafa;text-align:center;padding:0 6px;box-sizing:border-box}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
p.tcap{margin:.8em 0 .2em}
td.bad{color:#a11} td.skip{color:#a60} td.none{color:#888}
p.note{color:#555;font-size:.9em} p.absent{color:#888;font-size:.9em;font-style:italic}
p.warn{border-left:4px solid #c60;background:#fff4e5;padding:.5em .8em;font-weight:600;color:#7a3b00}
p.ok{border-left:4px solid #2a9d4b;background:#eef8f0;padding:.5em .8em;color:#1d5e31}
svg.plot{margin:.4em 12px .4em 0;font-family:system-ui,sans-serif;overflow:hidden}
"""

# Records each video's and image's fate and any SVG text that sticks out of its SVG (see
# the module docstring); checks readyState / complete too, in case something loaded before
# the listeners were attached. Text boxes are measured once the fonts are ready.
_STATUS_JS = """
(function(){
 var b=document.body;
 function track(els,name,isOk,isBad,ev,desc){var ok=0,bad=0,errs=[];
  function upd(){b.dataset[name]=els.length;b.dataset[name+'Loaded']=ok;b.dataset[name+'Failed']=bad;
   b.dataset[name.replace(/s$/,'')+'Errors']=errs.join(' | ');}
  Array.prototype.forEach.call(els,function(el){var done=false;
   function good(){if(done)return;done=true;ok++;el.dataset.state='loaded '+desc(el);upd();}
   function fail(){if(done)return;done=true;bad++;el.dataset.state='error';errs.push(el.getAttribute('src'));upd();}
   el.addEventListener(ev,function(){if(isOk(el))good();else fail();});el.addEventListener('error',fail);
   if(isOk(el))good();else if(isBad(el))fail();});
  upd();}
 track(document.querySelectorAll('video'),'videos',function(v){return v.readyState>=2;},
       function(v){return !!v.error;},'loadeddata',function(v){return v.videoWidth+'x'+v.videoHeight;});
 track(document.querySelectorAll('img'),'images',function(i){return i.complete&&i.naturalWidth>0;},
       function(i){return i.complete&&i.naturalWidth===0;},'load',function(i){return i.naturalWidth+'x'+i.naturalHeight;});
 function texts(){var n=0,bad=[];
  Array.prototype.forEach.call(document.querySelectorAll('svg'),function(s,si){var r=s.getBoundingClientRect();
   Array.prototype.forEach.call(s.querySelectorAll('text'),function(t){n++;var q=t.getBoundingClientRect();
    if(q.left<r.left-0.5||q.right>r.right+0.5||q.top<r.top-0.5||q.bottom>r.bottom+0.5)
     bad.push('svg '+si+' "'+t.textContent+'" '+[q.left-r.left,q.right-r.left,q.top-r.top,q.bottom-r.top].map(Math.round)
              +' in '+Math.round(r.width)+'x'+Math.round(r.height));});});
  b.dataset.svgTexts=n;b.dataset.svgClipped=bad.join(' | ');}
 if(document.fonts&&document.fonts.ready)document.fonts.ready.then(texts);else texts();
})();
"""

MEDIA_PREFIXES = ("clip_", "img_", "vid_")  # the report's own files in its media folder


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

    def heading(self, text: str, level: int = 2) -> None:
        self._body.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def text(self, text: str) -> None:
        self._body.append(f"<p class='note'>{html.escape(text)}</p>")

    def absent(self, text: str) -> None:
        """A part with nothing to show, and why (e.g. "not run: ...")."""
        self._body.append(f"<p class='absent'>{html.escape(text)}</p>")

    def warn(self, text: str) -> None:
        """Something the reader must not miss (e.g. a training stopped early)."""
        self._body.append(f"<p class='warn'>{html.escape(text)}</p>")

    def ok(self, text: str) -> None:
        self._body.append(f"<p class='ok'>{html.escape(text)}</p>")

    def raw(self, markup: str) -> None:
        """Append trusted markup (e.g. an SVG from ``comsim.report.plots``)."""
        self._body.append(markup)

    def video_row(self, clips: list[tuple[str, np.ndarray | None]], fps: float, caption: str = "") -> None:
        """One row of videos side by side, e.g. [("sim", a), ("pseudo-real", b), ("real", None)].

        A clip of ``None`` is drawn as an empty box labelled "not available"."""
        figs = []
        for label, frames in clips:
            if frames is None:
                figs.append(missing_figure("not available", label))
                continue
            name = self._media_name("clip_", ".mp4")
            write_video(self.out_dir / name, _even(np.asarray(frames)), fps)
            figs.append(_video_figure(name, label))
        self.row(figs, caption)

    def row(self, figures: list[str], caption: str = "") -> None:
        """Figures (from ``image_figure``, ``video_figure``, ``missing_figure``, SVGs) side by side."""
        cap = f"<p class='note'>{html.escape(caption)}</p>" if caption else ""
        self._body.append(f"<div class='row'>{''.join(figures)}</div>{cap}")

    def image_figure(self, src: str | Path, caption: str = "", min_width: int = 192, max_height: int = 480,
                     max_scale: int = 6) -> str:
        """A copy of the image file ``src`` in the media folder, as a figure. Small images are
        shown enlarged by a whole factor (pixelated) so that their pixels stay visible; an
        image that cannot be read becomes a box saying so."""
        from PIL import Image, UnidentifiedImageError

        src = Path(src)
        try:
            with Image.open(src) as im:
                w, h = im.size
                im.verify()
        except (OSError, UnidentifiedImageError) as e:
            return missing_figure(f"unreadable image {src.name}: {e}", caption)
        scale = max(1, min(max_scale, math.ceil(min_width / max(1, w)), max_height // max(1, h)))
        name = self._media_name("img_", src.suffix.lower() or ".png")
        shutil.copyfile(src, self.out_dir / name)
        shown = f" (native {w}x{h} px, shown at {scale}x)" if scale > 1 else f" ({w}x{h} px)"
        return (f"<figure style='width:{w * scale}px;max-width:100%'><img class='media' src='{html.escape(name)}' "
                f"width='{w * scale}' height='{h * scale}' style='width:100%;height:auto' "
                f"alt='{html.escape(caption)}'><figcaption>{html.escape(caption + shown)}</figcaption></figure>")

    def video_figure(self, src: str | Path, caption: str = "", min_width: int = 192) -> str:
        """A copy of the mp4 ``src`` (H.264, e.g. a rollout) in the media folder, as a figure."""
        import av

        src = Path(src)
        try:
            info = video_info(src)
        except (OSError, IndexError, av.error.FFmpegError) as e:
            return missing_figure(f"unreadable video {src.name}: {e}", caption)
        if info["codec"] != "h264":
            return missing_figure(f"{src.name}: {info['codec']} video (browsers play H.264 mp4)", caption)
        name = self._media_name("vid_", ".mp4")
        shutil.copyfile(src, self.out_dir / name)
        return _video_figure(name, caption, width=max(min_width, info["width"]))

    def table(self, rows: list[dict], caption: str = "", cls: str = "") -> None:
        if not rows:
            return
        cols = list(dict.fromkeys(k for r in rows for k in r))
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
        body = "".join("<tr>" + "".join(_td(r.get(c, "")) for c in cols) + "</tr>" for r in rows)
        # The caption goes above as a paragraph: a <caption> is as narrow as its table and wraps.
        cap = f"<p class='note tcap'>{html.escape(caption)}</p>" if caption else ""
        klass = f" class='{html.escape(cls)}'" if cls else ""
        self._body.append(f"{cap}<table{klass}><tr>{head}</tr>{body}</table>")

    def write(self) -> Path:
        page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
                f"<style>{_CSS}</style></head><body><h1>{html.escape(self.title)}</h1>\n"
                + "\n".join(self._body) + f"\n<script>{_STATUS_JS}</script></body></html>\n")
        path = self.out_dir / self.page
        with atomic_output(path) as tmp:
            tmp.write_text(page)
        for old in (self.out_dir / self.media).iterdir():  # media of an earlier build
            if old.is_file() and old.name.startswith(MEDIA_PREFIXES) and old.name not in self._written:
                old.unlink()
        return path

    def _media_name(self, prefix: str, suffix: str) -> str:
        self._n_media += 1
        name = f"{prefix}{self._n_media:04d}{suffix}"
        self._written.add(name)
        return f"{self.media}/{name}"


def missing_figure(why: str, label: str = "") -> str:
    return (f"<figure style='width:192px'><div class='missing'>{html.escape(why)}</div>"
            f"<figcaption>{html.escape(label)}</figcaption></figure>")


def _video_figure(name: str, label: str, width: int = 192) -> str:
    return (f"<figure style='width:{width}px;max-width:100%'><video src='{html.escape(name)}' style='width:100%' "
            f"autoplay loop muted playsinline preload='auto'></video><figcaption>{html.escape(label)}</figcaption>"
            "</figure>")


def fmt_seconds(s) -> str:
    """A duration for people: "44.7 s", "12 min 5 s", "1 h 02 min"."""
    if not isinstance(s, (int, float)) or isinstance(s, bool) or not math.isfinite(s):
        return "-" if s is None else str(s)
    if s < 60:
        return f"{s:.2f} s" if s < 1 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(round(s % 60)):d} s"
    return f"{int(s // 3600)} h {int(round(s % 3600 / 60)):02d} min"


def fmt_number(v) -> str:
    """Up to 3 decimals, no trailing zeros ("24.5", "0.812", "190.5", "1234")."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    text = f"{v:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _td(v) -> str:
    text = fmt_number(v)
    low = text.lower()
    cls = ("bad" if low.startswith(("failed", "error", "stopped early")) else "skip" if low.startswith("skipped")
           else "none" if low in ("not run", "-", "n/a") or low.startswith("not run")
           else "num" if isinstance(v, (int, float)) and not isinstance(v, bool) else "")
    return f"<td class='{cls}'>{html.escape(text)}</td>" if cls else f"<td>{html.escape(text)}</td>"


def _even(frames: np.ndarray) -> np.ndarray:
    # H.264 yuv420p needs even sizes; drop a row/column rather than refuse a report.
    T, H, W, _ = frames.shape
    return np.ascontiguousarray(frames[:, : H - H % 2, : W - W % 2])


def read_json(path: Path):
    """The JSON at ``path``; None when there is no such file; ValueError naming the file when
    it is not valid JSON (the section then says so instead of pretending it was not run)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
