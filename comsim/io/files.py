"""Crash-safe file output: every file ComSim writes goes through ``atomic_output``.

A killed job leaves either the old file or the new one, never half of one, which is what
lets long jobs resume by looking at what is on disk.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np

from comsim.errors import OutOfSpaceError, no_space


def write_png(path, image: np.ndarray) -> Path:
    """uint8 (H, W, 3) RGB or (H, W) grey (a mask) -> ``path`` (folders made), atomically: a reader never sees
    half a file."""
    import cv2

    image = np.asarray(image)
    if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise ValueError(f"{path}: expected a uint8 (H, W, 3) RGB or (H, W) grey image, got {image.dtype} "
                         f"{image.shape}")
    # OpenCV writes BGR: reverse the channels of a colour image, never the columns of a grey one.
    ok, png = cv2.imencode(".png", np.ascontiguousarray(image if image.ndim == 2 else image[..., ::-1]))
    if not ok:
        raise ValueError(f"{path}: could not encode the image as PNG ({image.dtype} {image.shape})")
    with atomic_output(path) as tmp:  # written by Python, so a full disk is reported as one
        tmp.write_bytes(png.tobytes())
    return Path(path)


@contextlib.contextmanager
def out_of_space_is(what: str):
    """A full disk or quota in the block (from Python, PyAV or Arrow) -> one OutOfSpaceError about ``what``
    (the outermost ``what``: the episode or dataset, rather than a temporary file inside it)."""
    try:
        yield
    except Exception as e:
        if not no_space(e):
            raise
        raise OutOfSpaceError(f"{what}: no space left on device; what was finished is kept: free space, then "
                              "rerun the same command to resume") from None


@contextlib.contextmanager
def atomic_output(path: str | Path):
    """Yield a temporary path next to ``path``; on success fsync it and rename it over ``path``.

    A crash leaves either the old file or the new one, never a partial file (the
    temporary is a dot-file that readers ignore); a full disk leaves the old one and an OutOfSpaceError."""
    path = Path(path)
    # No .parquet/.mp4 suffix: a leftover from a killed process must not match a reader's glob.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with out_of_space_is(str(path)):
            path.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def weights_hash(path: str | Path) -> str:
    """The checkpoint hash that provenance records: the first 16 hex digits of the file's sha256."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def read_json_object(path: str | Path, error: type[Exception], expected: str = "a JSON object") -> dict:
    """A JSON file that must hold an object; a file that does not parse or holds something else raises
    ``error`` naming the file (callers check that it exists, each with its own advice)."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise error(f"{path}: expected {expected}, got {type(d).__name__}")
    return d


def write_json(obj, path: str | Path, indent: int = 2) -> Path:
    """``obj`` as JSON at ``path``, atomically; numpy arrays/scalars and paths are converted."""
    path = Path(path)
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=indent, default=_jsonable) + "\n")
    return path


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")
