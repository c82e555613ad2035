"""``mpplan report``'s inputs: a plan file, a plan's folder, or a search's folder, read without trust.

A folder holds what earlier runs wrote (``plan.json``, ``timeline.json``,
``measurement.json``, ``baselines.json``, a search's ``results.jsonl`` and
``best/``), and anything may have happened to it since: a disk filled up, a file
was edited or cut short.  Every file is read through ``mpplan.reading`` and checked
for its shape, so a corrupt one gives one ``PlanError`` line naming the file, never
a traceback from deep inside the renderer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mpplan.durable import remove_stale_temps
from mpplan.errors import MpplanError, PlanError
from mpplan.reading import DocumentError, load_json, read_document

#: Errors a renderer raises on fields of the wrong shape in files it was handed.
_SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def write_folder_report(source: Path, *, html: bool) -> Path:
    """Write the report of a plan file, a plan's folder or a search's folder (its best plan and candidates)."""
    from mpplan.plan import load_plan
    from mpplan.report import write_report
    from mpplan.timeline import Timeline

    folder = source if source.is_dir() else source.parent
    results = None
    if (folder / "results.jsonl").is_file():
        results = read_results(folder / "results.jsonl")
        plan_path = folder / "best" / "plan.json"
    else:
        plan_path = source if source.is_file() else folder / "plan.json"
    here = plan_path.parent
    for place in {folder, here}:  # temp files of a run killed mid-write
        remove_stale_temps(place)
    plan = load_plan(plan_path)
    timeline_data = _optional(here / "timeline.json")
    result = _optional(here / "result.json")
    measurement = _optional(here / "measurement.json") or (result.get("measurement") if result else None)
    baselines = _optional(here / "baselines.json")
    if measurement is not None and not isinstance(measurement, dict):
        raise PlanError(f"{here}: measurement: expected a mapping, got {type(measurement).__name__}")
    if baselines is not None and not (
        all(isinstance(v, int) and not isinstance(v, bool) for v in baselines.values())
    ):
        raise PlanError(f"{here / 'baselines.json'}: expected a mapping of baseline name to bytes")
    try:
        timeline = Timeline.from_dict(timeline_data) if timeline_data else None
    except _SHAPE_ERRORS as exc:
        raise PlanError(f"{here / 'timeline.json'}: not a timeline ({type(exc).__name__}: {exc})") from None
    try:
        return write_report(
            folder, plan, timeline=timeline, measurement=measurement, baselines=baselines, results=results, html=html
        )
    except _SHAPE_ERRORS as exc:
        read = ", ".join(n for n in ("measurement.json", "result.json", "results.jsonl") if (folder / n).is_file())
        raise PlanError(
            f"{folder}: cannot report: a field of {read or 'the plan'} has the wrong shape "
            f"({type(exc).__name__}: {exc})"
        ) from None


def read_results(path: Path) -> list[dict[str, Any]]:
    """A search's ``results.jsonl``, every line checked as a search result."""
    from mpplan.cluster.records import Result

    results = []
    for number, line in enumerate(read_document(path, str, PlanError).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = load_json(line)
        except DocumentError as exc:
            raise PlanError(f"{path}: line {number}: {exc}") from None
        try:
            results.append(Result.from_dict(data, f"{path}: line {number}").to_dict())
        except MpplanError as exc:
            raise PlanError(str(exc)) from None
    return results


def _optional(path: Path) -> dict[str, Any] | None:
    """A JSON mapping beside the plan, or None when the file is not there."""
    if not path.is_file():
        return None
    data = read_document(path, load_json, PlanError)
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
