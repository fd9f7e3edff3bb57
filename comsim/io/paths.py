"""Paths from untrusted metadata, and output folders a command may write into.

Feature keys, camera names and path templates come from files a user was handed
(info.json, a scene YAML, translator.json). They become file names, so each one is
checked here before it is joined to a folder:

- ``safe_name``: one path component (no ``/``, ``\\``, ``..``, leading dot or control
  characters), e.g. a camera name or a feature key;
- ``contained``: a relative path that stays inside its root, also after symlinks are
  resolved (reading and writing).

``claim_output`` is how generate, convert and lab record decide whether an output folder
is theirs: new or empty, or holding their own run manifest with the same settings. Anything
else is refused, so no command writes into (or deletes from) a folder it did not make.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from comsim.errors import ComSimError, InputError
from comsim.io.lock import is_lock_file

_BAD_CHARS = re.compile(r"[/\\\x00-\x1f]")


class OutputFolderError(ComSimError, ValueError):
    """An output folder holds something this command did not make (or another run of it)."""


def safe_name(name: object, file: str | Path | None, field: str) -> str:
    """``name`` if it can be used as one file or folder name; InputError otherwise."""
    if (not isinstance(name, str) or not name or name in (".", "..") or name.startswith(".")
            or _BAD_CHARS.search(name) or len(name) > 200):
        raise InputError(file, field, "a plain name (no path separator, no '..', no leading '.')", name)
    return name


def contained(root: str | Path, relative: str | Path, file: str | Path | None, field: str) -> Path:
    """``root / relative``, refused unless it stays inside ``root`` (symlinks resolved)."""
    root, rel = Path(root), str(relative)
    if os.path.isabs(rel) or rel.startswith("~") or ".." in Path(rel).parts or "\x00" in rel:
        raise InputError(file, field, f"a relative path inside {root}", rel)
    path = root / rel
    real_root = root.resolve()
    real = path.resolve()  # non-strict: a path still to be written resolves through its existing parents
    if real != real_root and real_root not in real.parents:
        raise InputError(file, field, f"a path inside {root} (symlinks included)", f"{rel} -> {real}")
    return path


def check_output_path(out: str | Path, field: str = "--out") -> Path:
    """``out`` must be a folder or not exist yet (a file there is refused)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(out, field, "a folder (new or empty) for the output", "an existing file")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise InputError(out, field, "a folder path", f"{parent} is a file")
    return out


def check_output_file(path: str | Path, field: str = "--out") -> Path:
    """``path`` may be written as a file: not a folder, and no file where a parent folder must be."""
    path = Path(path)
    if path.is_dir():
        raise InputError(path, field, "a file path for the output", "an existing folder")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise InputError(path, field, "a file path in a folder", f"{parent} is a file")
    return path


def claim_output(out: str | Path, manifest: str, header: dict | None, keys: tuple[str, ...], command: str,
                 field: str = "--out", error: type[ComSimError] = OutputFolderError, made: str = "was made") -> bool:
    """Check that ``out`` may be written by ``command``; True when resuming its own run.

    Allowed: ``out`` does not exist or is empty (a fresh run), or ``out/manifest`` is a
    manifest of ``command`` whose ``keys`` equal ``header``'s (the same run, resumed). The
    caller writes the manifest (with ``"command"``) before any other file. A different run
    there raises ``error("OUT/MANIFEST: <made> with {...}, now asked for {...}; ...")``. ``header=None``
    checks only that the folder is new, empty or this command's (a cheap early check).
    """
    out = check_output_path(out, field)
    # A manifest still being written by a parallel job of the same run (atomic_output's temporary), and
    # the output lock (comsim/io/lock.py), are not content.
    entries = [p for p in out.iterdir() if not p.name.startswith(f".{manifest}.tmp-") and not is_lock_file(p.name)] \
        if out.exists() else []
    if not entries:
        return False
    path = out / manifest
    if not path.is_file():
        raise InputError(out, field, f"a new or empty folder, or one holding a `{command}` run to resume "
                         f"({manifest})", "a non-empty folder that is not such a run; choose another folder")
    try:
        old = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(path, "", "a JSON run manifest", f"unreadable JSON ({e})") from None
    if not isinstance(old, dict) or old.get("command", command) != command:
        raise InputError(path, "command", f"a manifest of `{command}`", old.get("command") if isinstance(old, dict)
                         else old)
    if header is None:
        return True
    diff = [k for k in keys if old.get(k) != header[k]]
    if diff:
        raise error(f"{path}: {made} with {({k: old.get(k) for k in diff})}, now asked for "
                    f"{({k: header[k] for k in diff})}; resume with the same arguments or use a new folder")
    return True


def is_inside(path: str | Path, folder: str | Path) -> bool:
    """True when ``path`` is ``folder`` or inside it (both resolved)."""
    p, f = Path(path).resolve(), Path(folder).resolve()
    return p == f or f in p.parents
