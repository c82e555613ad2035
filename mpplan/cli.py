"""The ``mpplan`` command: a thin shell over the library's verbs.

Every ``MpplanError`` becomes one line on stderr (``mpplan: error: ...``) and its
exit code: 2 for bad input, 1 for a failed verification, 3 for a plan that does
not fit, 4 for a measurement that crashed.  An ``OSError`` (an output folder that cannot be
made, a full disk) is one line and exit 2 as well.  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from collections.abc import Callable, Sequence

from mpplan.errors import ConfigError, MpplanError
from mpplan.gcpause import collector_paused
from mpplan.workflows import graph_from_source


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.quiet, args.verbose)
    try:
        command: Callable[[argparse.Namespace], int] = args.func
        if args.verb in _ONE_SHOT_VERBS:
            with collector_paused():
                return command(args)
        return command(args)
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


def build_parser() -> argparse.ArgumentParser:
    """The ``mpplan`` argument parser, every verb with its help (``docs/cli.md`` is generated from it)."""
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
    search.add_argument(
        "--resume", action="store_true", help="continue a search in --out, skipping finished candidates"
    )
    search.add_argument("--out", help="output folder (default: the config's output.dir; plan, run: subfolders)")
    _add_set(search)
    search.set_defaults(func=cmd_search)

    report = verbs.add_parser("report", help="Markdown (and HTML) report with figures for a plan or a search")
    report.add_argument("source", help="plan.json, or a folder holding plan.json or a search's results.jsonl")
    report.add_argument("--html", action="store_true", help="also write report.html")
    report.set_defaults(func=cmd_report)

    export = verbs.add_parser("export", help="print a plan's placement as an accelerate device_map or split points")
    export.add_argument("plan", help="plan.json")
    export.add_argument("--format", required=True, choices=("accelerate", "split-points"),
                        help="accelerate: module path -> GPU index, for accelerate.dispatch_model; split-points: the "
                             "module paths where each stage after the first starts")
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

    summary = summarize(graph_from_source(args.source, args.set))
    print(json.dumps(summary.to_dict(), indent=1) if args.json else summary_text(summary))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from mpplan.config import load_config
    from mpplan.report import misfit_text, plan_outcome, plan_text
    from mpplan.workflows import plan_into_folder

    outcome = plan_into_folder(load_config(args.config, args.set), args.out)
    plan = outcome.plan
    assert outcome.report is not None
    print(plan_text(plan, outcome.baselines))
    print(f"\n{plan_outcome(plan, outcome.path, outcome.report, outcome.budget)}")
    if outcome.budget is not None:  # the plan is written and reported like any other
        print(f"mpplan: error: does not fit the remat budget: {misfit_text(plan, outcome.budget)}", file=sys.stderr)
        if outcome.refused is not None and len(plan.devices) == 1:  # its bounds are the whole graph's on one device
            print(f"mpplan: the recompute search (which counts no arena blocks): {outcome.refused}", file=sys.stderr)
    if plan.misfits:
        print(f"mpplan: error: does not fit: {misfit_text(plan)}", file=sys.stderr)
        if outcome.oversized_op is not None:
            op, touched = outcome.oversized_op
            print(
                f"mpplan: op {op!r} alone touches {touched} bytes of activations, more than any device holds: "
                "no placement or recomputation fits it; give the devices more memory or a smaller batch",
                file=sys.stderr,
            )
    return outcome.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    from mpplan.report_folder import write_folder_report

    path = write_folder_report(Path(args.source), html=args.html)
    print(f"report written to {path}" + (f" and {path.with_suffix('.html')}" if args.html else ""))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from mpplan.config import load_config
    from mpplan.workflows import measurement_text, run_into_folder

    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be at least 1 and --warmup at least 0")
    config = load_config(args.config, args.set)
    outcome = run_into_folder(config, args.out, arena=not args.no_arena, steps=args.steps, warmup=args.warmup)
    print(measurement_text(outcome.measurement))
    print(f"plan, measurement and report written to {outcome.out} ({outcome.report.name})")
    return outcome.exit_code


def cmd_search(args: argparse.Namespace) -> int:
    from mpplan.cluster import run_search
    from mpplan.config import load_config
    from mpplan.workflows import report_best

    config = load_config(args.config, args.set)
    summary = run_search(config, address=args.address, resume=args.resume, out=args.out, progress=not args.quiet)
    print(summary.text())
    report = report_best(config, summary)
    if report is not None:
        print(f"report: {report}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from mpplan.workflows import verify_file

    print(verify_file(args.plan, graph=args.graph, config=args.config, overrides=args.set).text())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from mpplan.export import export
    from mpplan.plan import load_plan

    print(json.dumps(export(load_plan(args.plan), args.format), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
