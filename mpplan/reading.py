"""Reading the YAML and JSON files users give mpplan, in bounded time and memory.

Configs, graph files, plans and search records all come through here, so every
reader refuses the same hostile or broken inputs with one line, before any of
mpplan's own code walks the data:

* files larger than ``MAX_FILE_BYTES``, and text that is not UTF-8 (a BOM is fine);
* nesting deeper than ``MAX_DEPTH`` (PyYAML's C composer would crash the process
  with a stack overflow, Python's walkers raise ``RecursionError``);
* YAML aliases that would expand the document past ``MAX_ALIAS_NODES`` nodes more
  than it holds (the "billion laughs"), and recursive aliases: aliases are counted
  on the composed node graph, never expanded;
* a key given twice in one mapping (YAML and JSON both keep the last one silently);
* integers too long for Python to convert, and YAML that ``safe_load`` refuses.

Errors are ``DocumentError`` (a ``ValueError``) without the file name: each caller
prefixes its file and raises its own error class, so messages stay
``<file>: <where>: <what>``.

>>> load_yaml("a: 1\\nb: [2, 3]\\n")
{'a': 1, 'b': [2, 3]}
>>> load_yaml("a: 1\\na: 2\\n")
Traceback (most recent call last):
...
mpplan.reading.DocumentError: line 2, column 1: key 'a' is given twice in one mapping
"""

from __future__ import annotations

import json
import os
import re
from itertools import chain, compress, repeat
from typing import Any, Callable, TypeVar

import yaml

#: Largest file read, in bytes: far above any real config, graph file of 100k ops or plan.
MAX_FILE_BYTES = 256 * 2**20
#: Deepest nesting of lists and mappings: real files nest fewer than ten levels.
MAX_DEPTH = 64
#: Most nodes that YAML aliases may add to a document beyond the nodes it spells out.
MAX_ALIAS_NODES = 1_000_000

T = TypeVar("T")

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: the same rules, faster
_MERGE = "tag:yaml.org,2002:merge"
_BRACKETS = bytes.maketrans(b"{}", b"[]")  # only the nesting matters, not which kind of container nests
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}":')  # what the structure scan deletes
_STRING = re.compile(rb'"[^"]*"')


class DocumentError(ValueError):
    """A file is unreadable, too large, too deep, not UTF-8, or not valid YAML/JSON; one line."""


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of ``path``; ``FileNotFoundError`` when it does not exist, ``DocumentError`` when unreadable."""
    if not os.path.exists(path):
        raise FileNotFoundError(str(path))
    if os.path.isdir(path):
        raise DocumentError("cannot read: Is a directory")
    if not os.path.isfile(path):  # a FIFO would block, a device such as /dev/zero never ends
        raise DocumentError("cannot read: not a regular file")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise DocumentError(f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"larger than {MAX_FILE_BYTES // 2**20} MiB; mpplan reads no file that big")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save the file as UTF-8"
        ) from None


def read_document(path: str | os.PathLike[str], parse: Callable[[str], T], error: Callable[[str], Exception]) -> T:
    """``parse`` of the user's file at ``path``; a missing or unreadable file raises ``error("<path>: <what>")``.

    Each reader raises its own error class (``ConfigError``, ``PlanError``, ...) naming the
    file, so the one line a user sees is ``<path>: file not found`` or ``<path>: <what>``.

    >>> read_document("/no/such/file.yaml", load_yaml, LookupError)
    Traceback (most recent call last):
    ...
    LookupError: /no/such/file.yaml: file not found
    """
    try:
        return parse(read_text(path))
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except DocumentError as exc:
        raise error(f"{path}: {exc}") from None


def load_json(text: str) -> Any:
    """Parse JSON, refusing duplicate keys, over-deep nesting and over-long integers.

    The parser first runs without a hook (a Python call per mapping costs 40% more on a
    100k-op graph file); when every mapping it built holds as many keys as the text has
    ``key: value`` pairs (colons outside strings), no key was given twice.  Otherwise, and
    on any error, the checking parse (``_checked_json``) runs and says what is wrong.
    """
    structure = _structure(text)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = _checked_json(text)
    else:
        if _keys(data, structure.count(b"{")) != structure.count(b":"):  # a key given twice, dropped silently
            data = _checked_json(text)
    _check_depth(structure)
    return data


def _checked_json(text: str) -> Any:
    """``json.loads`` that refuses a key given twice, with each failure as a one-line ``DocumentError``."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a duplicate key (below), or an integer past Python's digit limit
        raise DocumentError(f"invalid JSON: {_value_problem(exc)}") from None


def load_yaml(text: str) -> Any:
    """Parse one YAML document with ``safe_load``'s types, refusing the inputs the module docstring lists."""
    try:
        _check_events(text)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_nodes(node, loader)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise DocumentError(f"{where}invalid YAML: {problem}") from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"invalid YAML: {_value_problem(exc)}") from None


def _value_problem(exc: ValueError) -> str:
    """A converter's complaint in the user's terms (Python's digit limit names a ``sys`` call, not the file)."""
    if "integer string conversion" in str(exc):
        return "an integer with more than 4300 digits"
    return " ".join(str(exc).split())


def _keys(data: Any, mappings: int) -> int:
    """How many keys the mappings in ``data`` hold in all, walked level by level at C speed.

    The walk stops once it has met all ``mappings`` (the text's count of objects): the lists
    of names and sizes below a graph file's tensors and ops then need no look.
    """
    # A level keeps its scalars: picking out its dicts and its lists from them costs less than a
    # third pass (and list) to drop them first, 0.145 -> 0.103 s on a 100k-op graph file.
    count, met, level = 0, 0, [data]
    while level:
        found = list(compress(level, map(isinstance, level, repeat(dict))))
        count += sum(map(len, found))
        met += len(found)
        if met >= mappings:
            break
        lists = compress(level, map(isinstance, level, repeat(list)))
        level = list(chain(chain.from_iterable(map(dict.values, found)), chain.from_iterable(lists)))
    return count


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) < len(pairs):  # the common case stays at ``dict``'s speed; the loop names the repeated key
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key!r} is given twice in one object")
            seen.add(key)
    return data


def _structure(text: str) -> bytes:
    """The brackets, braces and colons of JSON ``text`` outside its strings, scanning its bytes at C speed.

    The scan keeps only brackets, colons and quotes (escaped quotes and backslashes removed
    first, so every quote left opens or closes a string), then drops the strings with whatever
    they hold.  In valid JSON, the braces left open its objects and the colons are its ``key: value`` pairs.
    """
    data = text.encode("utf-8", "surrogatepass")
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")  # left to right, as JSON pairs escapes
    # two adjacent quotes are an empty string, or one string's end and the next one's start: dropping either
    # keeps the strings paired, and leaves only the (rare) strings that hold a bracket or colon for the regex
    data = data.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in data:
        data = _STRING.sub(b"", data)
    return data


def _check_depth(structure: bytes) -> None:
    """Refuse valid JSON nested deeper than ``MAX_DEPTH``, from its ``_structure``.

    Walking the parsed values cost a Python step per value (0.3 s for a 100k-op graph file); the
    text says the same thing. Without its colons, the structure is the containers' brackets. Each
    ``replace("[]", "")`` then removes exactly the innermost containers, one level a round, so
    the text is nested deeper than the limit when ``MAX_DEPTH`` rounds do not empty it.
    """
    data = structure.translate(_BRACKETS, b":")
    for _ in range(MAX_DEPTH):
        if not data:
            return
        data = data.replace(b"[]", b"")
    if data:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels")


def _check_events(text: str) -> None:
    """Refuse over-deep nesting from the event stream, before any (recursive) composer sees it."""
    try:
        _scan_events(_Loader(text))
    except yaml.YAMLError:
        if _Loader is yaml.SafeLoader:
            raise
        _scan_events(yaml.SafeLoader(text))  # the pure-Python parser words its errors better (and as documented)
        raise


def _scan_events(loader: Any) -> None:
    try:
        depth = 0
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    raise DocumentError(f"line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node, loader: Any) -> None:
    """Count what aliases expand to, refuse recursive aliases and duplicate keys; linear in distinct nodes."""
    size: dict[int, int] = {}  # id(node) -> nodes it expands to, itself included
    distinct = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            continue
        if key in size:
            continue
        if key in on_path:
            raise DocumentError(f"line {node.start_mark.line + 1}: an alias refers to a node that contains it")
        distinct += 1
        if isinstance(node, yaml.MappingNode):
            _check_keys(node, loader)
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise DocumentError(f"line {child.start_mark.line + 1}: an alias refers to a node that contains it")
            if id(child) not in size:
                stack.append((child, False))
    if size[id(root)] - distinct > MAX_ALIAS_NODES:
        raise DocumentError(
            f"aliases expand the document to {size[id(root)]} nodes from {distinct}; at most {MAX_ALIAS_NODES} "
            "more are allowed (an alias bomb?)"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_keys(node: yaml.MappingNode, loader: Any) -> None:
    """Two equal scalar keys in one mapping are an error (merge keys, ``<<``, may override, as YAML says)."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            mark = key_node.start_mark
            raise DocumentError(
                f"line {mark.line + 1}, column {mark.column + 1}: key {key!r} is given twice in one mapping"
            )
        seen.add(key)
