"""Trial records: the per-trial outcomes of a policy table as small text files, committed as they land.

A records folder holds everything a table is pooled from (``comsim.pipeline.table``), so a fresh clone
rebuilds the table's page from it alone::

    DIR/table.json                    what the table is judged by, from the experiment's config: its arms and
                                      labels, panels, training seeds, the cell, the claim, the look test, the
                                      gap's baseline and oracle, the comparisons reported beside them
    DIR/<arm>/seed<s>/trials.csv      one row per trial: panel, trial (index on its panel), seed (the trial's lab
                                      seed), success (0/1), box (the panel's layout box), steps (policy steps)
    DIR/<arm>/seed<s>/manifest.json   where those trials come from: the arm and its training seed, each dataset's
                                      content fingerprint, the translator's hash, the cell's content hash, each
                                      panel's identity, the claim's identity, the commit of the code that ran

Every file is written the same way for the same content (sorted keys and rows, no time, no absolute path), so
records committed twice are one diff of nothing. ``comsim.pipeline.experiment.export_records`` writes them.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from comsim.errors import InputError
from comsim.io.files import atomic_output

TABLE_FILE = "table.json"
TRIALS_FILE = "trials.csv"
MANIFEST_FILE = "manifest.json"
COLUMNS = ("panel", "trial", "seed", "success", "box", "steps")
SEED_PREFIX = "seed"


def unit_dir(root: str | Path, arm: str, seed: int) -> Path:
    """The folder of one arm at one training seed."""
    return Path(root) / arm / f"{SEED_PREFIX}{seed}"


def dumps(obj) -> str:
    """The one JSON form of a records file: sorted keys, two-space indent, a final newline."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def trials_csv(rows: list[dict]) -> str:
    """The trials as CSV text, sorted by panel then trial index (``\\n`` line ends on every platform)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in sorted(rows, key=lambda r: (r["panel"], int(r["trial"]))):
        w.writerow([r["panel"], int(r["trial"]), int(r["seed"]), int(bool(r["success"])), int(r["box"]),
                    int(r["steps"])])
    return buf.getvalue()


def write_unit(root: str | Path, arm: str, seed: int, rows: list[dict], manifest: dict) -> Path:
    """Write one (arm, seed)'s trials.csv and manifest.json; returns its folder."""
    d = unit_dir(root, arm, seed)
    write_text(d / TRIALS_FILE, trials_csv(rows))
    write_text(d / MANIFEST_FILE, dumps(manifest))
    return d


def read_trials(path: Path) -> list[dict]:
    """The rows of a trials.csv, typed; an InputError names the file, the line and the column."""
    text = path.read_text()
    reader = csv.reader(io.StringIO(text))
    head = next(reader, None)
    if tuple(head or ()) != COLUMNS:
        raise InputError(path, "header", ",".join(COLUMNS), ",".join(head or []))
    rows = []
    for line, values in enumerate(reader, start=2):
        if len(values) != len(COLUMNS):
            raise InputError(path, f"line {line}", f"{len(COLUMNS)} values ({','.join(COLUMNS)})", ",".join(values))
        row: dict = {"panel": values[0]}
        for name, v in zip(COLUMNS[1:], values[1:]):
            try:
                row[name] = int(v)
            except ValueError:
                raise InputError(path, f"line {line}: {name}", "an integer", v) from None
        if row["success"] not in (0, 1):
            raise InputError(path, f"line {line}: success", "0 or 1", row["success"])
        row["success"] = bool(row["success"])
        rows.append(row)
    return rows


def read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(path, None, "a JSON object", f"invalid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise InputError(path, None, "a JSON object", type(doc).__name__)
    return doc


def differing_fields(a, b, where: str = "") -> list[str]:
    """Dotted names of the fields where two JSON-like values differ (``[where]`` if they differ as a whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differing_fields(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))
        return out
    return [] if a == b else [where or "(the whole file)"]


def check_definitions(root: str | Path, defs: dict) -> None:
    """Refuse a records folder whose table.json holds other definitions (another claim, cell, arm list...):
    records of two tables are never mixed. Writes nothing."""
    path = Path(root) / TABLE_FILE
    if path.is_file():
        old = read_json(path)
        bad = differing_fields(old, json.loads(dumps(defs)))  # as it would be written: tuples are lists
        if bad:
            raise InputError(path, ", ".join(bad[:4]), "the definitions of the experiment being exported (records "
                             "of another table are not mixed: export into another folder)",
                             {k: field_at(old, k) for k in bad[:2]})


def field_at(doc, dotted: str):
    """The value at a dotted field name (``differing_fields``' names); None where there is none."""
    for k in dotted.split("."):
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def write_definitions(root: str | Path, defs: dict) -> None:
    check_definitions(root, defs)
    write_text(Path(root) / TABLE_FILE, dumps(defs))


def read_records(root: str | Path) -> tuple[dict, dict[tuple[str, int], tuple[dict, list[dict]]]]:
    """(table.json, {(arm, seed): (manifest, trials)}) of a records folder; only what is in the folder."""
    root = Path(root)
    if not (root / TABLE_FILE).is_file():
        raise InputError(root, TABLE_FILE, "a records folder written by `comsim table export` (its table.json)",
                         "no such file")
    defs = read_json(root / TABLE_FILE)
    units = {}
    for manifest in sorted(root.glob(f"*/{SEED_PREFIX}*/{MANIFEST_FILE}")):
        d = manifest.parent
        arm, tag = d.parent.name, d.name[len(SEED_PREFIX):]
        if not tag.isdigit():
            raise InputError(d, None, f"a folder named {SEED_PREFIX}<integer>", d.name)
        if not (d / TRIALS_FILE).is_file():
            raise InputError(d, TRIALS_FILE, "the trials beside the manifest", "no such file")
        units[(arm, int(tag))] = (read_json(manifest), read_trials(d / TRIALS_FILE))
    return defs, dict(sorted(units.items()))
