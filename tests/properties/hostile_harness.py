"""Running a linvit command on hostile input and judging the outcome by the promises of docs/reliability.md.

:func:`run_command` runs ``linvit ARGS`` in this process (a fresh interpreter per example would cost seconds of
imports) and returns an :class:`Outcome`: the exit status, what went to stderr and stdout, the exception if one
escaped, and what the run did as seen by Python's audit hooks (``sys.addaudithook``): files opened, processes spawned,
code executed by a shell, objects found by an unpickler. :meth:`Outcome.check` asserts the promises: exit 0, or a
non-zero exit with one error line that names the file or key; no traceback; nothing spawned or unpickled; no file
opened under the artefacts' folder but the ones the command line names (and what they name inside their own run or
export folder); within a time limit.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from linvit.io.destination import RECORD_NAME, TEMPORARY_SUFFIX

# Audit events that mean code ran or a process started (https://docs.python.org/3/library/audit_events.html).
SPAWN_EVENTS = frozenset(
    {"os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.startfile", "pty.spawn"}
)
UNPICKLE_EVENT = "pickle.find_class"
TIME_LIMIT_S = 120  # one example; the decompression of a bomb or a hang on a FIFO would take far longer


@dataclass
class _Recording:
    opened: list[str] = field(default_factory=list)
    spawned: list[tuple[str, str]] = field(default_factory=list)
    unpickled: list[str] = field(default_factory=list)


_RECORDING: _Recording | None = None
_MAIN_THREAD = threading.main_thread()


def _audit(event: str, args: tuple) -> None:
    recording = _RECORDING
    if recording is None:
        return
    if event == "open":
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            recording.opened.append(os.fsdecode(path))
    elif event in SPAWN_EVENTS:
        recording.spawned.append((event, repr(args)[:200]))
    elif event == UNPICKLE_EVENT:
        recording.unpickled.append(".".join(str(part) for part in args))


sys.addaudithook(_audit)  # hooks cannot be removed: this one does nothing outside a recording


@contextlib.contextmanager
def recording() -> Iterator[_Recording]:
    global _RECORDING
    _RECORDING = _Recording()
    try:
        yield _RECORDING
    finally:
        _RECORDING = None


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the main thread if the block runs longer than ``seconds``."""

    def expire(signum, frame):  # a signal handler's signature
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def peak_memory_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Outcome:
    argv: list[str]
    status: int | None
    stderr: str
    stdout: str
    escaped: BaseException | None
    record: _Recording

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.lower().lstrip().startswith(("error", "linvit "))]

    def check(self, names: Iterable[str], artefacts: Path, allowed_opens: Iterable[Path], report: bool = False) -> None:
        """Assert the promises; ``names``: what a refusal may name (files, keys: one of them must appear).
        ``report``: a command whose exit status 1 comes with a report on stdout (check-data), not an error line."""
        where = f"linvit {' '.join(self.argv)}"
        if self.escaped is not None:
            raise AssertionError(f"{where}: {type(self.escaped).__name__} escaped: {self.escaped}") from self.escaped
        assert "Traceback (most recent call last)" not in self.stderr + self.stdout, (
            f"{where}: traceback\n{self.stderr}"
        )
        assert not self.record.spawned, f"{where}: spawned {self.record.spawned}"
        assert not self.record.unpickled, f"{where}: unpickled {self.record.unpickled[:5]}"
        allowed = [Path(path).resolve() for path in allowed_opens]
        # beside a file it writes, linvit writes a temporary name first and records what it wrote
        writers = {path.parent for path in allowed}
        for opened in self.record.opened:
            path = Path(opened).resolve() if not opened.startswith("/proc") else Path(opened)
            if artefacts in path.parents or path == artefacts:
                own = path in writers or (
                    path.parent in writers and path.name.endswith((TEMPORARY_SUFFIX, RECORD_NAME))
                )
                assert own or any(path == root or root in path.parents for root in allowed), (
                    f"{where}: opened {path}, which the command line does not name"
                )
        if self.status not in (0, None) and not (report and self.status == 1):
            errors = self.error_lines()
            assert len(errors) == 1, (
                f"{where}: exit {self.status} with {len(errors)} error lines:\n{self.stderr[-2000:]}"
            )
            names = [str(name) for name in names]
            assert any(name in errors[0] for name in names), (
                f"{where}: the error names none of {names[:6]}: {errors[0]}"
            )
            assert len(errors[0]) < 2000, f"{where}: the error line is {len(errors[0])} characters"


def run_command(argv: list[str], seconds: int = TIME_LIMIT_S) -> Outcome:
    """``linvit ARGV`` in this process, with its output captured and its actions recorded."""
    from linvit.cli import main

    stderr, stdout = io.StringIO(), io.StringIO()
    status: int | None = None
    escaped: BaseException | None = None
    with recording() as record, contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            with time_limit(seconds):
                status = main(list(argv))
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if not isinstance(exit_.code, (int, type(None))):
                stderr.write(f"{exit_.code}\n")
        except BaseException as error:  # noqa: BLE001 - anything that escapes breaks a promise
            escaped = error
    return Outcome(list(argv), status, stderr.getvalue(), stdout.getvalue(), escaped, record)
