"""The config file as YAML: its document, the line of every part, and the keys it repeats.

The document is composed once with its marks (libyaml's loader when PyYAML has it), checked
against alias bombs before it is expanded, then constructed; one walk over the nodes gives the
lines, so a problem can name its `file:line` without a second parse.
"""

from __future__ import annotations

from typing import Any

import yaml

# Where each part of the YAML document starts: ("tables", 0) -> line of the first row,
# ("tables", 0, "keys") -> line of its keys, ("defaults", "schedule") -> line of that default.
LineMap = dict[tuple[Any, ...], int]
# A key a YAML mapping repeats: (row index or None outside rows, field, message, line).
Duplicate = tuple[int | None, str, str, int]


def compose(text: str) -> tuple[Any, LineMap, list[Duplicate]]:
    """The YAML document and its line map; repeated keys are recorded, not silently dropped.

    libyaml's loader (when PyYAML has it) composes the node tree with marks; the same tree is
    then constructed, so lines cost one walk over the nodes and no second parse.
    """
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node, {}, set(), 0)
        document = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    marks: LineMap = {}
    duplicates: list[Duplicate] = []
    if node is not None:
        _walk(node, (), marks, duplicates)
    return document, marks, duplicates


# A config table is a few hundred nodes; aliases may repeat a defaults block per row. Beyond
# these bounds the file is refused before it is expanded ("billion laughs": 9 levels of aliases
# took 2.3 GB, and a recursive alias ended in a RecursionError).
MAX_EXPANDED_NODES = 100_000
MAX_DEPTH = 50


class UnsafeYamlError(yaml.YAMLError):
    """A YAML document whose aliases expand too far, refer to themselves, or nest too deep."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.problem_mark = mark


def _expanded_size(node: Any, sizes: dict[int, int], open_nodes: set[int], depth: int) -> int:
    """How many nodes the document has once every alias is expanded (each shared node counted
    once per use); UnsafeYamlError past the bounds or for a node inside itself."""
    key = id(node)
    if key in open_nodes:
        raise UnsafeYamlError("an alias refers to a node that contains it", node.start_mark)
    if key in sizes:
        return sizes[key]
    if depth > MAX_DEPTH:
        raise UnsafeYamlError(f"nested more than {MAX_DEPTH} levels deep", node.start_mark)
    children: list[Any] = []
    if isinstance(node, yaml.MappingNode):
        children = [item for pair in node.value for item in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    open_nodes.add(key)
    total = 1 + sum(_expanded_size(child, sizes, open_nodes, depth + 1) for child in children)
    open_nodes.discard(key)
    if total > MAX_EXPANDED_NODES:
        raise UnsafeYamlError(
            f"its aliases expand to more than {MAX_EXPANDED_NODES:,} nodes", node.start_mark
        )
    sizes[key] = total
    return total


def _walk(node: Any, path: tuple[Any, ...], marks: LineMap, duplicates: list[Duplicate]) -> None:
    marks[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(_duplicate(path, key, seen[key], line))
            seen[key] = line
            _walk(value_node, (*path, key), marks, duplicates)
            marks[(*path, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), marks, duplicates)


def _duplicate(path: tuple[Any, ...], key: str, first: int, line: int) -> Duplicate:
    message = f"key {key!r} appears twice (lines {first} and {line}); keep one (YAML would silently keep the last)"
    if len(path) >= 2 and path[0] == "tables" and isinstance(path[1], int):
        return (path[1], ".".join(str(p) for p in path[2:]) or key, message, line)
    return (None, ".".join(str(p) for p in path) or key, message, line)
