"""The search statuses and their meanings, said once for the search, the report and docs/cluster.md."""

import subprocess
import sys

from mpplan.cluster import records
from mpplan.search_status import Status


def test_every_status_has_a_meaning_of_one_line():
    for status in Status:
        assert status.meaning and "\n" not in status.meaning and "|" not in status.meaning, status


def test_the_search_records_hold_this_status():
    assert records.Status is Status


def test_the_meanings_and_the_report_load_no_ray():
    """The report says what each status means without importing the cluster package, which loads Ray."""
    code = "import sys, mpplan.report, mpplan.reference; assert 'ray' not in sys.modules, 'ray imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
