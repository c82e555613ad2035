"""The ``mpplan`` command: a thin shell over the library's verbs.

Every ``MpplanError`` becomes one line on stderr (``mpplan: error: ...``) and its
exit code: 2 for bad input, 1 for a failed verification, 3 for a plan that does
not fit, 4 for a measurement that crashed.  An ``OSError`` (an output folder that cannot be
made, a full disk) is one line and exit 2 as well.  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from mpplan import sim
from mpplan.errors import ConfigError, MpplanError
from mpplan.gcpause import collector_paused
from mpplan.passes.remat import RematInfeasibleError
from mpplan.graph import Graph
from mpplan.outputs import output_folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging(args.quiet, args.verbose)
    try:
        if args.verb in _ONE_SHOT_VERBS:
            with collector_paused():
                return args.func(args)
        return args.func(args)
    except MpplanError as exc:  # one line, whatever names (a key, a file) the message quotes
        print(f"mpplan: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("mpplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # an output folder that cannot be written, a full disk: the user's to fix, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"mpplan: error: {_one_line(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return 2


#: Verbs that build one large graph and plan, check or draw it, then exit: they run with the cyclic
#: garbage collector paused (``mpplan.gcpause``).  ``run`` and ``search`` run torch and Ray for long.
_ONE_SHOT_VERBS = frozenset({"inspect", "plan", "verify", "report", "export"})


def _one_line(message: str) -> str:
    """Line breaks a user put in a name or key, escaped: an error is always one line."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


#: Said in --help of every verb that may import user code (docs/cli.md is generated from it).
USER_CODE = (
    "Runs user code: a config whose model.torch.factory is 'module:function' imports that module and calls "
    "the function (inspect and verify too, when given a config). Use configs you trust."
)
RAY_PRIVACY = (
    "Without --address the embedded Ray listens on 127.0.0.1 only and stops with mpplan, even when mpplan is "
    "killed; with --address the search joins a cluster and runs on whatever that cluster exposes."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpplan", description=__doc__.splitlines()[0].replace("``", ""))
    from mpplan import __version__

    parser.add_argument("--version", action="version", version=f"mpplan {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    inspect = verbs.add_parser("inspect", help="sizes and bounds of a model's graph", description=USER_CODE)
    inspect.add_argument("source", help="a run config (YAML) or a graph file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    _add_set(inspect)
    inspect.set_defaults(func=cmd_inspect)

    plan = verbs.add_parser("plan", help="plan memory and write plan.json", description=USER_CODE)
    plan.add_argument("config", help="a run config (YAML)")
    plan.add_argument("--out", help="output folder (default: the config's output.dir/plan)")
    _add_set(plan)
    plan.set_defaults(func=cmd_plan)

    verify = verbs.add_parser("verify", help="check a plan.json against its graph", description=USER_CODE)
    verify.add_argument("plan", help="plan.json")
    where = verify.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--graph", help="the graph file the plan was made for (devices, capacities and settings taken on trust)"
    )
    where.add_argument(
        "--config",
        help="the run config the plan was made from: devices, capacities, alignment, parallel_safe and grads "
        "come from it (imports user code for model.torch)",
    )
    _add_set(verify)
    verify.set_defaults(func=cmd_verify)

    run = verbs.add_parser(
        "run", help="plan, execute the plan for real, measure it against eager PyTorch", description=USER_CODE
    )
    run.add_argument("config", help="a run config with model.torch")
    run.add_argument("--out", help="output folder (default: the config's output.dir/run)")
    run.add_argument("--no-arena", action="store_true", help="let the allocator place tensors instead of the arena")
    run.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    run.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    _add_set(run)
    run.set_defaults(func=cmd_run)

    search = verbs.add_parser(
        "search", help="search plans over the config's search.space on Ray", description=USER_CODE + " " + RAY_PRIVACY
    )
    search.add_argument("config", help="a run config with a search section")
    search.add_argument(
        "--address",
        help="Ray cluster to join: auto, host:port or ray://host:port (default: a private embedded Ray); "
        "see docs/cluster.md for what a cluster exposes and Ray's token authentication",
    )
    search.add_argument("--resume", action="store_true", help="continue a search in --out, skipping finished candidates")
    search.add_argument("--out", help="output folder (default: the config's output.dir; plan, run: subfolders)")
    _add_set(search)
    search.set_defaults(func=cmd_search)

    report = verbs.add_parser("report", help="Markdown (and HTML) report with figures for a plan or a search")
    report.add_argument("source", help="plan.json, or a folder holding plan.json or a search's results.jsonl")
    report.add_argument("--html", action="store_true", help="also write report.html")
    report.set_defaults(func=cmd_report)

    export = verbs.add_parser("export", help="print a plan's placement as an accelerate device_map or split points")
    export.add_argument("plan", help="plan.json")
    export.add_argument("--format", required=True, choices=("accelerate", "split-points"))
    export.set_defaults(func=cmd_export)
    return parser


def _configure_logging(quiet: bool, verbose: bool) -> None:
    """Library code logs under the ``mpplan`` logger; the CLI shows it on stderr."""
    logger = logging.getLogger("mpplan")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("mpplan: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (repeatable)"
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    from mpplan.report import summary_text
    from mpplan.summary import summarize

    summary = summarize(_graph_from(args.source, args.set))
    print(json.dumps(summary.to_dict(), indent=1) if args.json else summary_text(summary))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from mpplan.capture import graph_from_config
    from mpplan.config import load_config, resolve_devices
    from mpplan.plan import save_plan
    from mpplan.planner import PlannerSettings, plan
    from mpplan.report import misfit_text, plan_outcome, plan_text
    from mpplan.verify import verify

    config = load_config(args.config, args.set)
    devices = resolve_devices(config)
    if not devices:
        raise ConfigError(f"{config.source}: devices: needs at least one device to plan for")
    out = output_folder("plan", args.out, config.output.dir)
    graph = graph_from_config(config)
    settings = PlannerSettings.from_config(config.planner)
    try:
        result = plan(graph, devices, settings)
    except RematInfeasibleError as exc:
        if exc.plan is None:
            raise
        return _write_refused_plan(graph, exc, out)
    verify(graph, result, check_capacity=False)  # a misfit is still a correct plan: exit 3 below
    path = save_plan(result, out / "plan.json")
    static = sim.static_bytes(graph)
    baselines = {
        "one device, as-given order, no sharing": static + sim.no_sharing_bytes(graph),
        "one device, as-given order, perfect allocator": static + sim.order_load(graph, range(len(graph.ops))),
    }
    if result.remat:
        without = plan(graph, devices, dataclasses.replace(settings, remat="none"))
        baselines["these settings without recomputation"] = without.max_peak_bytes
    baselines["this plan"] = result.max_peak_bytes
    print(plan_text(result, baselines))
    report = _write_plan_report(graph, result, out, baselines, figures=False)
    print(f"\n{plan_outcome(result, path, report)}")
    if result.misfits:
        print(f"mpplan: error: does not fit: {misfit_text(result)}", file=sys.stderr)
        op, touched = sim.largest_op(graph)
        if touched > max(d.capacity_bytes for d in result.devices):
            print(
                f"mpplan: op {op!r} alone touches {touched} bytes of activations, more than any device holds: "
                "no placement or recomputation fits it; give the devices more memory or a smaller batch",
                file=sys.stderr,
            )
        return 3
    return 0


def _write_refused_plan(graph: Graph, exc: RematInfeasibleError, out: Path) -> int:
    """An infeasible remat budget: the refusal, and the best infeasible plan written next to it (exit 3)."""
    from mpplan.plan import save_plan
    from mpplan.verify import verify

    verify(graph, exc.plan, check_capacity=False)
    path = save_plan(exc.plan, out / "plan.json")
    print(f"mpplan: error: {exc}", file=sys.stderr)
    print(f"does not fit the remat budget: the best infeasible plan (peak {exc.plan.max_peak_bytes} bytes) "
          f"written to {path} (verified)")
    return exc.exit_code


def _write_plan_report(graph: Graph, plan, out: Path, baselines: dict[str, int], **extra) -> Path:
    from mpplan.plan import write_json_atomic
    from mpplan.report import write_report
    from mpplan.timeline import timeline

    line = timeline(graph, plan)
    write_json_atomic(line.to_dict(), out / "timeline.json")
    write_json_atomic(baselines, out / "baselines.json")
    return write_report(out, plan, timeline=line, baselines=baselines, **extra)


def cmd_report(args: argparse.Namespace) -> int:
    path = _report_folder(Path(args.source), html=args.html)
    print(f"report written to {path}" + (f" and {path.with_suffix('.html')}" if args.html else ""))
    return 0


def _report_folder(source: Path, *, html: bool) -> Path:
    """Write the report of a plan file, a plan's folder or a search's folder (its best plan and candidates)."""
    from mpplan.report_folder import write_folder_report

    return write_folder_report(source, html=html)


def cmd_run(args: argparse.Namespace) -> int:
    from mpplan.config import load_config
    from mpplan.plan import save_plan, write_json_atomic
    from mpplan.report import format_table
    from mpplan.runtime import run_config
    from mpplan.units import format_size

    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be at least 1 and --warmup at least 0")
    config = load_config(args.config, args.set)
    out = output_folder("run", args.out, config.output.dir)
    result = run_config(config, arena=not args.no_arena, steps=args.steps, warmup=args.warmup)
    save_plan(result.plan, out / "plan.json")
    data = result.measurement.to_dict()
    write_json_atomic(data, out / "measurement.json")
    rows = [
        (d["name"], format_size(d["predicted_peak_bytes"]), format_size(d["measured_peak_bytes"]), f"{d['error_pct']:+.2f}%")
        for d in data["devices"]
    ]
    print(format_table(("device", "predicted peak", "measured peak", "error"), rows))
    for d in data["devices"]:
        if d.get("allocator_peak_bytes") is not None:
            print(_allocator_line(d, format_size))
    eager = data.get("eager") or {}
    for d in eager.get("devices", []):
        print(f"eager PyTorch on {d['name']}: measured peak {format_size(d['measured_peak_bytes'])}")
        if d.get("allocator_peak_bytes") is not None:
            print(_allocator_line(d, format_size))
    print(f"step time {data['step_time_s']:.4f} s (eager {eager.get('step_time_s', float('nan')):.4f} s)")
    numerics = data.get("numerics") or {}
    print(f"numerics: {'ok' if numerics.get('ok') else 'MISMATCH at ' + str(numerics.get('first_bad_op'))}"
          f" (max abs diff {numerics.get('max_abs_diff')})")
    graph = result.graph  # traced for the device it ran on: a CPU capture has other ops on a GPU
    baselines = {"planned peak (max over devices)": result.plan.max_peak_bytes}
    eager_peaks = [d["measured_peak_bytes"] for d in eager.get("devices", [])]
    if eager_peaks:
        baselines["eager PyTorch, measured (max over devices)"] = max(eager_peaks)
    report = _write_plan_report(graph, result.plan, out, baselines, measurement=data)
    print(f"plan, measurement and report written to {out} ({report.name})")
    return 0 if numerics.get("ok", True) else 1


def _allocator_line(d: dict[str, Any], format_size: Callable[[int], str]) -> str:
    """How a GPU's measured peak came about: which number it is, the raw allocator peaks, the base."""
    shared = d.get("shared_with") or ()
    how = (f"tracked live bytes, the GPU is shared with {', '.join(shared)}" if shared
           else "max_memory_allocated - base")
    line = (f"  {d['name']} on {d.get('torch_device', d['name'])}: measured = {how}; raw allocator peak "
            f"{format_size(d['allocator_peak_bytes'])}, base {format_size(d.get('allocator_base_bytes') or 0)}, "
            f"requested above base {format_size(d.get('requested_peak_bytes') or 0)}, raw reserved peak "
            f"{format_size(d.get('reserved_peak_bytes') or 0)}")
    if d.get("transient_peak_bytes"):
        line += f", computed outside the arena {format_size(d['transient_peak_bytes'])}"
    return line


def cmd_search(args: argparse.Namespace) -> int:
    from mpplan.cluster import run_search
    from mpplan.config import load_config

    config = load_config(args.config, args.set)
    summary = run_search(config, address=args.address, resume=args.resume, out=args.out, progress=not args.quiet)
    print(summary.text())
    if summary.best is not None and summary.best_plan is not None:
        _write_best_timeline(config, summary.best.overrides, summary.best_plan)
        print(f"report: {_report_folder(summary.out, html=False)}")
    return 0


def _write_best_timeline(config, overrides: dict, plan_path: Path) -> None:
    """``timeline.json`` beside the search's best plan, from the graph of the best point's config."""
    from mpplan.capture import graph_from_config
    from mpplan.cluster.space import base_raw, candidate_config
    from mpplan.plan import load_plan, write_json_atomic
    from mpplan.timeline import timeline

    best_config = candidate_config(base_raw(config), tuple(overrides.items()), config.source)
    line = timeline(graph_from_config(best_config), load_plan(plan_path))
    write_json_atomic(line.to_dict(), plan_path.parent / "timeline.json")


def cmd_verify(args: argparse.Namespace) -> int:
    from mpplan.plan import check_plan_graph, load_plan
    from mpplan.verify import truth_from_config, verify

    plan = load_plan(args.plan)
    truth = None
    if args.config and _is_config(Path(args.config)):
        from mpplan.capture import graph_from_config
        from mpplan.config import load_config

        config = load_config(args.config, args.set)
        graph = graph_from_config(config)
        truth = truth_from_config(config)
    else:
        graph = _graph_from(args.config or args.graph, args.set)
    check_plan_graph(plan, graph, args.plan)
    report = verify(graph, plan, truth=truth)
    line = f"{args.plan}: ok ({report.ops} ops, {report.buffers} buffers, {report.devices} devices)"
    if report.trusted:
        line += f"; taken on trust from the plan: {', '.join(report.trusted)} (pass --config to check them)"
    print(line)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from mpplan.export import export
    from mpplan.plan import load_plan

    print(json.dumps(export(load_plan(args.plan), args.format), indent=1))
    return 0


def _graph_from(source: str, overrides: Sequence[str]) -> Graph:
    """A config (a mapping with ``model``) builds its model; anything else is a graph file."""
    from mpplan.capture import graph_from_config
    from mpplan.capture.graph_file import load_graph
    from mpplan.config import load_config

    if _is_config(Path(source)):
        return graph_from_config(load_config(source, overrides))
    return load_graph(source)


def _is_config(path: Path) -> bool:
    if path.suffix.lower() not in (".yaml", ".yml") or not path.is_file():
        return False
    from mpplan.reading import DocumentError, load_yaml, read_text

    try:
        data = load_yaml(read_text(path))
    except (OSError, DocumentError):  # not a readable config: the graph-file reader says why
        return False
    return isinstance(data, dict) and "model" in data


if __name__ == "__main__":
    sys.exit(main())
