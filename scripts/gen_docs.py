"""Regenerate docs/configuration.md, docs/cli.md and the status table of docs/cluster.md from the code:
``python scripts/gen_docs.py``."""

import os
from pathlib import Path

from mpplan.reference import cli_reference, config_reference, with_status_table

DOCS = Path(__file__).resolve().parents[1] / "docs"

if __name__ == "__main__":
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: pin it, as the test does
    (DOCS / "configuration.md").write_text(config_reference())
    (DOCS / "cli.md").write_text(cli_reference())
    cluster = DOCS / "cluster.md"
    cluster.write_text(with_status_table(cluster.read_text()))
    print("wrote docs/configuration.md, docs/cli.md and the status table of docs/cluster.md")
