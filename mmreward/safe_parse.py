"""One YAML loader and one JSON loader for everything a user or a downloaded folder hands us.

`yaml.safe_load` and `json.loads` already refuse code, but not shapes that hurt: a nested-anchor ("billion
laughs") document builds a few hundred nodes that expand to billions once anything walks them (our config
resolution, `diffusion-rl config`'s dump); a 20,000-deep list ends in a RecursionError traceback; and a key given
twice silently keeps the last value, so a typo'd override of a setting is lost without a word. These loaders
bound the depth and the expanded size, refuse duplicate keys, and raise the caller's typed error naming the
source.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from mmreward.errors import MMRewardError

MAX_DEPTH = 100  # configs and cards nest < 10 levels; far below Python's recursion limit of 1000 frames
MAX_NODES = 200_000  # a YAML document's size with every alias expanded (a large config has ~1,000)
_MERGE_TAG = "tag:yaml.org,2002:merge"


class UnsafeYAMLError(yaml.MarkedYAMLError):
    """A document our loader refuses (too deep, too large once aliases expand, a duplicate key).

    A YAMLError, so code that reports YAML syntax errors reports these the same way."""


def _too_deep(what: str, node: Node) -> UnsafeYAMLError:
    return UnsafeYAMLError(problem=f"{what} nests deeper than {MAX_DEPTH} levels", problem_mark=node.start_mark)


class _BoundedComposer:
    """Mixin for a yaml Loader: composition depth bounded while building, expanded size checked per document."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:  # checked before recursing, so no RecursionError can happen first
                raise UnsafeYAMLError(problem=f"the document nests deeper than {MAX_DEPTH} levels",
                                      problem_mark=self.peek_event().start_mark)  # type: ignore[attr-defined]
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1

    def compose_document(self) -> Node:
        node = super().compose_document()  # type: ignore[misc]
        _check_expansion(node)
        return node


def _check_expansion(root: Node) -> None:
    """Refuse a node graph whose alias-expanded size or depth is too large, or which refers to itself.

    Each node's expanded size is computed once (memoised), so the check costs the graph's size, not the
    expansion's; the recursion follows the expanded depth, which is bounded before it can overflow."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if depth > MAX_DEPTH:
            raise _too_deep("with its aliases expanded, the document", node)
        if key in active:
            raise UnsafeYAMLError(problem="an alias refers to a node that contains it (a recursive document)",
                                  problem_mark=node.start_mark)
        total = 1
        if not isinstance(node, ScalarNode):
            active.add(key)
            children: list[Node] = []
            if isinstance(node, SequenceNode):
                children = list(node.value)
            elif isinstance(node, MappingNode):
                children = [n for pair in node.value for n in pair]
            for child in children:
                total += size(child, depth + 1)
                if total > MAX_NODES:
                    raise UnsafeYAMLError(
                        problem=f"with its aliases expanded the document exceeds {MAX_NODES:,} nodes (an alias "
                                "bomb?); write the values out or use fewer nested aliases",
                        problem_mark=node.start_mark)
            active.discard(key)
        sizes[key] = total
        return total

    if root is not None:
        size(root, 1)


class SafeLoader(_BoundedComposer, yaml.SafeLoader):
    """yaml.SafeLoader with bounded depth and alias expansion, and duplicate mapping keys refused."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # '<<: *defaults' then explicit keys override on purpose
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base constructor reports it
                    continue
                if duplicate:
                    raise UnsafeYAMLError(problem=f"duplicate key {key!r} (the earlier value would be silently "
                                                  "replaced); give each key once", problem_mark=key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)



def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what went wrong, and where."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(exc, 'problem', None) or type(exc).__name__}{where}"


def safe_yaml(text: str) -> Any:
    """Parse one YAML document like yaml.safe_load, raising a yaml.YAMLError (UnsafeYAMLError) for refused ones."""
    try:
        return yaml.load(text, Loader=SafeLoader)  # noqa: S506 - SafeLoader subclass: no tags that run code
    except RecursionError:  # a safety net: the depth bound fires first for every shape we know
        raise UnsafeYAMLError(problem=f"the document nests too deeply (limit {MAX_DEPTH})") from None


def load_yaml(text: str, *, source: str, error: type[MMRewardError]) -> Any:
    """Parse YAML from `source` (named in the message) or raise `error` in one line."""
    try:
        return safe_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{source} is not valid YAML: {yaml_problem(exc)}") from None


class UnsafeJSONError(ValueError):
    """JSON our loader refuses: a duplicate key, or nesting deeper than MAX_DEPTH."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise UnsafeJSONError(f"duplicate key {key!r} (the earlier value would be silently replaced)")
        out[key] = value
    return out


def _check_depth(value: Any) -> None:
    """Iterative (no recursion): the parsed value's containers nest at most MAX_DEPTH levels."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > MAX_DEPTH:
            raise UnsafeJSONError(f"it nests deeper than {MAX_DEPTH} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def safe_json(text: str | bytes) -> Any:
    """json.loads refusing duplicate keys and deep nesting; raises ValueError (json.JSONDecodeError or
    UnsafeJSONError), so code that handles invalid JSON handles these too."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:  # the C scanner gives up at Python's recursion limit (~1000 levels)
        raise UnsafeJSONError(f"it nests deeper than {MAX_DEPTH} levels") from None
    _check_depth(value)
    return value


def load_json(text: str | bytes, *, source: str, error: type[MMRewardError]) -> Any:
    """Parse JSON from `source` (named in the message) or raise `error` in one line."""
    try:
        return safe_json(text)
    except UnsafeJSONError as exc:
        raise error(f"{source} is refused: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError of bytes
        raise error(f"{source} is not valid JSON ({exc})") from None
