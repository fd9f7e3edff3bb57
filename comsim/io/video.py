"""H.264 mp4 read/write with PyAV: deterministic, atomic, seekable.

Frames are uint8 ``(T, H, W, 3)`` RGB. Encoding settings are fixed (libx264, one
thread, fixed GOP, no B-frames, no scene-cut keyframes) so the same frames always give
the same bytes (with the same FFmpeg/x264 build): a crashed-and-resumed dataset write is
identical to an uninterrupted one.

Frame ``k`` of a file is the frame whose presentation time is ``k / fps``. Files that hold
several episodes (LeRobot v3) are built by ``concat_videos``, which copies the compressed
packets and shifts their timestamps; nothing is decoded or re-encoded.

Quality: with yuv420p the colour planes have half the resolution, which, not the crf,
bounds the round-trip PSNR (crf 15 -> 23 moves it by < 1 dB). Real camera frames at
64x64 come back at ~37 dB with crf 18; hard-edged saturated renders at ~32-34 dB. Use
``pix_fmt="yuv444p"`` (+4-5 dB, same size) when that matters more than playing the file
in a browser.
"""
from __future__ import annotations

import contextlib
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from comsim.errors import ComSimError
from comsim.io.files import atomic_output

DEFAULT_CRF = 18  # visually lossless; lower crf barely helps (chroma subsampling dominates)
DEFAULT_GOP = 10  # keyframe every 10 frames: a window read decodes at most 9 extra frames
PIX_FMTS = ("yuv420p", "yuv444p")


class VideoError(ComSimError, ValueError):
    """A video file that FFmpeg cannot read: truncated, corrupt, or not a video at all."""


@contextlib.contextmanager
def open_video(path: Path):
    """``av.open`` for reading, its video stream checked; FFmpeg's errors, at opening or while
    decoding in the block, become one VideoError naming the file."""
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                raise VideoError(f"{path}: expected a video stream, the file has none")
            yield c
    except av.error.FFmpegError as e:
        why = getattr(e, "strerror", None) or str(e)
        raise VideoError(f"{path}: not a readable video ({why}); the file is truncated, corrupt or not a "
                         "video") from None


def _fps_fraction(fps: float) -> Fraction:
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return Fraction(fps).limit_denominator(1001)


def write_video(path: str | Path, frames: np.ndarray, fps: float, crf: int = DEFAULT_CRF,
                gop: int = DEFAULT_GOP, pix_fmt: str = "yuv420p") -> Path:
    """Encode uint8 ``(T, H, W, 3)`` RGB frames to an H.264 mp4 at ``path`` (atomically)."""
    path = Path(path)
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"{path}: frames must be uint8 (T>0, H, W, 3), got {frames.dtype} {frames.shape}")
    T, H, W, _ = frames.shape
    if H % 2 or W % 2:
        raise ValueError(f"{path}: H.264 ({pix_fmt}) needs an even height and width, got {H}x{W}; "
                         "crop or pad the frames by one pixel")
    if pix_fmt not in PIX_FMTS:
        raise ValueError(f"{path}: pix_fmt must be one of {PIX_FMTS}, got {pix_fmt!r}")
    rate = _fps_fraction(fps)
    with atomic_output(path) as tmp:
        with av.open(str(tmp), "w", format="mp4") as out:
            stream = out.add_stream("libx264", rate=rate)
            stream.width, stream.height, stream.pix_fmt = W, H, pix_fmt
            stream.codec_context.time_base = 1 / rate
            stream.codec_context.thread_count = 1  # multi-threaded x264 is not bit-reproducible
            stream.options = {
                "crf": str(crf), "preset": "medium",
                # No lookahead / macroblock tree: on tiny frames (seen at 16-48 px) x264's
                # lowres lookahead reads memory it never wrote, so the same frames encoded to
                # different bytes now and then (about 1 in 300), which broke byte-identical
                # resume of tiny conversions. With no B-frames and no VBV it buys little here.
                "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:rc-lookahead=0:no-mbtree=1",
            }
            for i, f in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
                frame.pts, frame.time_base = i, 1 / rate
                out.mux(stream.encode(frame))
            out.mux(stream.encode())  # flush
    return path


def concat_videos(inputs: list[str | Path], path: str | Path, fps: float) -> list[int]:
    """Join mp4 files made by ``write_video`` (same size and settings) into one, without
    re-encoding. Returns the number of frames taken from each input; input ``i`` starts at
    frame ``sum(counts[:i])``, i.e. at time ``sum(counts[:i]) / fps``."""
    rate = _fps_fraction(fps)
    counts: list[int] = []
    with atomic_output(path) as tmp:
        with av.open(str(tmp), "w", format="mp4") as out:
            ost, ref, offset = None, None, 0
            for src in inputs:
                if not Path(src).is_file():
                    raise FileNotFoundError(f"{src}: video file not found")
                with open_video(Path(src)) as inp:
                    ist = inp.streams.video[0]
                    cc = ist.codec_context
                    # Packets of one file are only valid in another if the decoder set-up
                    # (SPS/PPS in extradata, size, pixel format) is the same.
                    key = (ist.codec_context.name, bytes(cc.extradata or b""), cc.width, cc.height, cc.pix_fmt)
                    if ost is None:
                        ost, ref = out.add_stream_from_template(ist), key
                        ost.time_base = 1 / rate
                    elif key != ref:
                        raise ValueError(f"{src}: codec settings or frame size differ from {inputs[0]}; "
                                         "cannot join without re-encoding")
                    n = 0
                    for pkt in inp.demux(ist):
                        if pkt.dts is None:  # empty flush packet
                            continue
                        k = round(pkt.pts * ist.time_base * rate)
                        pkt.pts = pkt.dts = offset + k
                        pkt.duration, pkt.time_base, pkt.stream = 1, 1 / rate, ost
                        out.mux(pkt)
                        n = max(n, k + 1)
                counts.append(n)
                offset += n
    return counts


def video_info(path: str | Path) -> dict:
    """Size, rate, codec and frame count (from the container header, nothing decoded)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: video file not found")
    with open_video(path) as c:
        s = c.streams.video[0]
        return {"width": s.codec_context.width, "height": s.codec_context.height,
                "fps": float(s.average_rate or s.base_rate or 0), "num_frames": s.frames,
                "codec": s.codec_context.name, "pix_fmt": s.codec_context.pix_fmt}


def count_frames(path: str | Path) -> int:
    """Frames that decode, start to end: a corrupt file raises VideoError, a truncated one counts short."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: video file not found")
    with open_video(path) as c:
        return sum(1 for _ in c.decode(c.streams.video[0]))


def read_video(path: str | Path, start_frame: int = 0, num_frames: int | None = None,
               fps: float | None = None) -> np.ndarray:
    """Decode frames ``[start_frame, start_frame + num_frames)`` as uint8 ``(N, H, W, 3)``.

    Seeks to the keyframe at or before ``start_frame`` and decodes forward, so reading one
    episode of a multi-episode file costs that episode plus at most one GOP. Frame ``k``
    is the one shown at ``k / fps`` (``fps`` defaults to the stream's rate). Returns fewer
    frames than asked only if the file ends first; callers that need an exact count check.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: video file not found")
    if start_frame < 0 or (num_frames is not None and num_frames < 0):
        raise ValueError(f"{path}: bad frame range start={start_frame} num={num_frames}")
    out: list[np.ndarray] = []
    with open_video(path) as c:
        s = c.streams.video[0]
        empty = np.zeros((0, s.codec_context.height, s.codec_context.width, 3), np.uint8)
        if num_frames == 0:
            return empty
        rate = _fps_fraction(fps) if fps else Fraction(s.average_rate or s.base_rate)
        if start_frame > 0:
            c.seek(int(Fraction(start_frame) / rate / s.time_base), stream=s, backward=True)
        for frame in c.decode(s):
            k = round(frame.pts * s.time_base * rate)
            if k < start_frame:
                continue
            if not out and k > start_frame:  # seek overshot (should not happen): decode from the top
                return _read_linear(path, start_frame, num_frames, rate)
            out.append(frame.to_ndarray(format="rgb24"))
            if num_frames is not None and len(out) == num_frames:
                break
    return np.stack(out) if out else empty


def _read_linear(path: Path, start_frame: int, num_frames: int | None, rate: Fraction) -> np.ndarray:
    out = []
    with open_video(path) as c:
        s = c.streams.video[0]
        empty = np.zeros((0, s.codec_context.height, s.codec_context.width, 3), np.uint8)
        for frame in c.decode(s):
            k = round(frame.pts * s.time_base * rate)
            if k >= start_frame:
                out.append(frame.to_ndarray(format="rgb24"))
                if num_frames is not None and len(out) == num_frames:
                    break
    return np.stack(out) if out else empty
