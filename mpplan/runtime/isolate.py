"""Run a measurement in a child process, so that a crash in it becomes an error, not a dead run.

A measurement executes kernels, ``set_`` views and storage bookkeeping on real
devices; a fault in any of them (issue 14 saw a SIGSEGV on a GPU) would kill the
Python process without a word the user can act on.  ``run_isolated`` runs the
function in a fresh ``spawn``-ed interpreter (CUDA needs a fresh one, not a fork)
with ``faulthandler`` writing the child's Python stack to a file, and returns its
result.  An exception in the child is raised again in the parent; a child killed
by a signal raises ``MeasurementCrash`` naming the signal and carrying the
stack, which the CLI turns into one ``mpplan: error:`` line and exit code 4.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import signal
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from mpplan.errors import MpplanError

__all__ = ["MeasurementCrash", "run_isolated"]

T = TypeVar("T")


class MeasurementCrash(MpplanError, RuntimeError):
    """The process measuring a plan died (a fatal signal, or an exit without a result).

    ``signal`` is the signal's name (``"SIGSEGV"``) or ``None``; ``stack`` the child's
    Python stack as ``faulthandler`` wrote it (innermost call first), or ``""``.
    """

    exit_code = 4

    def __init__(self, message: str, *, signal_name: str | None = None, stack: str = "") -> None:
        super().__init__(message)
        self.signal = signal_name
        self.stack = stack


def run_isolated(fn: Callable[..., T], /, *args: Any, what: str = "the measurement", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a spawned child process; its result, its exception, or ``MeasurementCrash``.

    ``fn``, its arguments and its result must be picklable (``fn`` a module-level
    function).  ``what`` names the work in the crash message.  A daemonic process
    may not start children: there ``fn`` runs in-process.
    """
    if multiprocessing.current_process().daemon:
        return fn(*args, **kwargs)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="mpplan-") as tmp:
        stack_file = Path(tmp) / "stack.txt"
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_child, args=(sender, str(stack_file), fn, args, kwargs), daemon=True)
        child.start()
        sender.close()
        try:
            outcome = receiver.recv()
        except EOFError:
            outcome = None
        except Exception as exc:  # sent, but not rebuilt here (an exception class that does not unpickle)
            outcome = ("error", f"{type(exc).__name__}: {exc}")
        finally:
            receiver.close()
        child.join()
        if outcome is None:
            stack = stack_file.read_text(errors="replace").strip() if stack_file.exists() else ""
            raise _crash(what, child.exitcode, stack)
    kind, value = outcome
    if kind == "ok":
        return cast(T, value)  # fn's result, unpickled
    if isinstance(value, BaseException):
        raise value
    raise RuntimeError(f"{what} failed in its child process:\n{value}")


def _crash(what: str, exitcode: int | None, stack: str) -> MeasurementCrash:
    """The error for a child that ended without sending a result."""
    name: str | None = None
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        how = f"was killed by {name}"
    else:
        how = f"exited with status {exitcode} without a result"
    innermost = next((line.strip() for line in stack.splitlines() if line.strip().startswith("File ")), None)
    where = f" at {innermost}" if innermost else ""
    message = (
        f"{what} crashed: its process {how}{where}. Try measuring without the arena (--no-arena) "
        "and report the crash with its stack (MeasurementCrash.stack)"
    )
    return MeasurementCrash(message, signal_name=name, stack=stack)


def _child(sender: Any, stack_path: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The child's body: faulthandler on, run, send ``("ok", result)`` or ``("error", exception)``."""
    with open(stack_path, "w") as stack:
        faulthandler.enable(stack, all_threads=False)
        try:
            result: tuple[str, Any] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent as data
            result = ("error", exc)
        try:
            sender.send(result)
        except Exception:  # the exception or result does not pickle: send its text instead
            sender.send(("error", "".join(traceback.format_exception(result[1])) if result[0] == "error"
                         else _unsendable(result[1])))
        finally:
            faulthandler.disable()
            sender.close()


def _unsendable(value: Any) -> str:
    """A line for a result that could not be sent back to the parent."""
    return f"its result, a {type(value).__name__}, could not be sent back (not picklable)"
