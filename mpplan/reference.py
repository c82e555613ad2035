"""Reference pages generated from the code itself, so the docs cannot drift.

``docs/configuration.md`` comes from the config schema's dataclasses and
``docs/cli.md`` from the argument parser; ``scripts/gen_docs.py`` writes both, and the table of
search statuses in ``docs/cluster.md`` (from ``mpplan.search_status``), and a test fails when the
committed pages differ from what the code generates.
"""

from __future__ import annotations

import argparse

from mpplan.config import MAX_DEVICES, Config, schema_fields
from mpplan.reading import MAX_ALIAS_NODES, MAX_DEPTH, MAX_FILE_BYTES
from mpplan.search_status import Status


def config_reference() -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, doc in schema_fields(Config):
        rows.append(f"| `{key}` | {kind.replace('|', '&#124;')} | {default.replace('|', '&#124;')} | {doc} |")
    return (
        "# Configuration reference\n\n"
        "Generated from `mpplan/config/schema.py` by `python scripts/gen_docs.py`; "
        "a test keeps it in step with the code.\n"
        "Sizes accept `16GiB`, `512MB` or integers. Any key can be overridden with `--set dotted.key=value`.\n"
        "YAML is read with a safe loader only; `model.torch.factory` imports and calls user code by design, "
        "so run configs you trust.\n"
        f"Every file mpplan reads (configs, graph files, plans) must be UTF-8, at most {MAX_FILE_BYTES // 2**20} MiB "
        f"and nested at most {MAX_DEPTH} levels deep; a key given twice in one mapping is an error, and YAML aliases "
        f"may add at most {MAX_ALIAS_NODES} nodes (no alias bombs). Sizes and integers are at most 2**62, and a "
        f"config expands to at most {MAX_DEVICES} devices.\n\n" + "\n".join(rows) + "\n"
    )


def cli_reference() -> str:
    from mpplan.cli import build_parser

    parser = build_parser()
    parts = ["# CLI reference\n", "Generated from `mpplan/cli.py` by `python scripts/gen_docs.py`.\n",
             "Exit codes: 0 ok, 1 verification failed, 2 bad input (one line naming file and field), "
             "3 the plan does not fit (the best infeasible plan is still written), 4 a measurement crashed "
             "(`mpplan run`: a fatal signal in the child process that runs it), 130 interrupted.\n"]
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in verbs.choices.items():
        sub.prog = f"mpplan {name}"
        parts.append(f"## `mpplan {name}`\n\n```\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


#: The marks around docs/cluster.md's generated table of statuses.
STATUS_TABLE = ("<!-- generated: status_table -->", "<!-- /generated: status_table -->")


def status_table() -> str:
    """The table of docs/cluster.md's "Statuses": each search status and its meaning, as the report says it."""
    rows = ["| status | meaning |", "|---|---|"]
    return "\n".join(rows + [f"| `{status.value}` | {status.meaning} |" for status in Status]) + "\n"


def with_status_table(page: str) -> str:
    """``page`` (docs/cluster.md) with the table between its ``STATUS_TABLE`` marks rewritten by ``status_table``."""
    start, end = page.index(STATUS_TABLE[0]) + len(STATUS_TABLE[0]), page.index(STATUS_TABLE[1])
    return page[:start] + "\n" + status_table() + page[end:]

