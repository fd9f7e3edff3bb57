"""The package's import graph has no circle: every module can be read (and imported) before the
modules that use it. Parsed with ast, so it also sees imports made inside functions."""
import ast
from pathlib import Path

import pytest

import comsim

ROOT = Path(comsim.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """{module: the comsim modules it imports}. ``from pkg import sub`` counts as an import of the
    submodule ``pkg.sub`` (Python imports a package before its submodules, which is no circle);
    ``from pkg import name`` of anything else counts as an import of ``pkg`` itself."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    deps.add(sub if sub in mods else base)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_checker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    graph = import_graph()
    assert "comsim.twin.replay" in graph["comsim.cli"] or any("comsim.twin" in d for d in graph["comsim.cli"])
    assert "comsim.io.lerobot" in graph["comsim.convert"]


def test_no_import_circle_outside_the_policy_package():
    graph = {m: {d for d in deps if not d.startswith("comsim.policy")}
             for m, deps in import_graph().items() if not m.startswith("comsim.policy")}
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_import_circle_in_comsim():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


# What each part of the package may import: the pipeline's order (docs: README "Layout"). The twin runs on a
# real cell, so it imports neither the lab (the stand-in with its hidden truth) nor the metrics; the metrics
# score frames and never need the twin; a policy trains on the datasets it is given and knows nothing of the
# lab, the factory or the converter; only the orchestrator (pipeline), the report and the CLI see everything.
CORE = {"errors", "config", "episode", "memory", "workers", "run_layout"}
ALLOWED = {
    "": set(), "errors": set(), "config": {"errors"}, "episode": {"errors"}, "memory": set(), "workers": set(),
    "run_layout": set(),
    "io": CORE,
    "sim": CORE | {"io"},
    "metrics": CORE | {"io", "sim"},
    "twin": CORE | {"io", "sim"},
    "translator": CORE | {"io", "sim", "metrics"},
    "factory": CORE | {"io", "sim", "twin"},
    "convert": CORE | {"io", "translator"},
    "policy": CORE | {"io", "metrics"},
    "lab": CORE | {"io", "sim", "twin", "metrics"},
    "report": CORE | {"io", "sim", "metrics", "twin", "translator", "factory", "convert", "policy", "lab"},
    "pipeline": CORE | {"io", "sim", "metrics", "twin", "translator", "factory", "convert", "policy", "lab", "report"},
    "cli": CORE | {"io", "sim", "metrics", "twin", "translator", "factory", "convert", "policy", "lab", "report",
                   "pipeline"},
}


def part(module: str) -> str:
    """comsim.twin.replay -> twin; comsim.convert -> convert; comsim -> '' (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in sorted(graph.items()):
        p = part(m)
        if p not in ALLOWED:
            bad.append(f"{m}: {p!r} is not a known part of the package (add it to ALLOWED)")
            continue
        for d in sorted(deps):
            q = part(d)
            if q and q != p and q not in ALLOWED[p]:
                bad.append(f"{m} imports {d} ({p} may import {sorted(ALLOWED[p])})")
    return bad


def test_the_layer_checker_finds_an_upward_import():
    assert layer_violations({"comsim.twin.replay": {"comsim.lab.truth", "comsim.io.keys"}}) == [
        "comsim.twin.replay imports comsim.lab.truth (twin may import "
        f"{sorted(ALLOWED['twin'])})"]
    assert layer_violations({"comsim.pipeline.demo": {"comsim.lab.record", "comsim.report.run"}}) == []


def test_imports_point_down_the_pipeline():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the pipeline's order:\n" + "\n".join(bad)


def test_benchmarks_call_public_names_only():
    """bench/ scripts use the library as a user would: no name starting with an underscore."""
    bench = ROOT.parent / "bench"
    if not bench.is_dir():
        pytest.skip("no bench/ folder next to the package")
    bad = []
    for f in sorted(bench.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("comsim"):
                bad += [f"{f.name}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in _comsim_names(f):
                    bad.append(f"{f.name}: {ast.unparse(node)}")
    assert not bad, "private names used by benchmarks:\n" + "\n".join(bad)


def _comsim_names(path: Path) -> set[str]:
    """Names a script binds to comsim modules (``from comsim.policy import training`` -> training)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("comsim"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("comsim"))
    return names
