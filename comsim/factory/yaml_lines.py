"""Safe YAML that remembers line numbers, so that errors can name the line a person wrote.

``load_with_lines(path)`` parses with a ``yaml.SafeLoader`` subclass (still safe: only the
standard tags) whose mappings are ``LineDict`` and sequences ``LineList``: plain dicts and
lists that also carry the 1-based line of the node (``.line``), of each key
(``.key_lines``) and of each item (``.item_lines``).
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from comsim.config import ConfigError, read_config_text


class LineDict(dict):
    line: int = 0
    key_lines: dict

    def line_of(self, key) -> int:
        return getattr(self, "key_lines", {}).get(key, self.line)


class LineList(list):
    line: int = 0
    item_lines: list

    def line_of(self, i: int) -> int:
        lines = getattr(self, "item_lines", [])
        return lines[i] if 0 <= i < len(lines) else self.line


class _LineLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no Python object tags: a task file a user hands us cannot run code) that
    also records each mapping's and sequence's line number, so errors can name the line."""


# YAML 1.1 reads on/off/yes/no as booleans, so `stack: {on: base}` would have the key True.
# Task files follow YAML 1.2 here: only true/false are booleans.
_LineLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_LineLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                  list("tTfF"))


def _map(loader: _LineLoader, node: yaml.MappingNode):
    data = LineDict()
    data.line = node.start_mark.line + 1
    yield data  # two-step construction, as SafeLoader does, so that recursive nodes work
    data.update(loader.construct_mapping(node))  # flattens merge keys (<<) into node.value first
    data.key_lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def _seq(loader: _LineLoader, node: yaml.SequenceNode):
    data = LineList()
    data.line = node.start_mark.line + 1
    yield data
    data.extend(loader.construct_sequence(node))
    data.item_lines = [item.start_mark.line + 1 for item in node.value]


_LineLoader.add_constructor("tag:yaml.org,2002:map", _map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _seq)


def load_with_lines(path: str | Path) -> LineDict:
    path = Path(path)
    text = read_config_text(path)
    loader = _LineLoader(text)  # a SafeLoader: standard tags only (tests/test_factory.py tries a python tag)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from e
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: top level must be a mapping, got {type(data).__name__}")
    return data
