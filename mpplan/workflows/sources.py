"""What a user names on the command line: a run config (YAML with a ``model``) or a graph file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mpplan.graph import Graph


def graph_from_source(source: str | Path, overrides: Sequence[str] = ()) -> Graph:
    """A config (a mapping with ``model``) builds its model (with ``overrides``); anything else is a graph file."""
    from mpplan.capture import graph_from_config
    from mpplan.capture.graph_file import load_graph
    from mpplan.config import load_config

    if is_config(Path(source)):
        return graph_from_config(load_config(source, overrides))
    return load_graph(source)


def is_config(path: Path) -> bool:
    """Whether ``path`` is a readable YAML mapping with a ``model`` key (a run config, not a graph file)."""
    if path.suffix.lower() not in (".yaml", ".yml") or not path.is_file():
        return False
    from mpplan.reading import DocumentError, load_yaml, read_text

    try:
        data = load_yaml(read_text(path))
    except (OSError, DocumentError):  # not a readable config: the graph-file reader says why
        return False
    return isinstance(data, dict) and "model" in data
