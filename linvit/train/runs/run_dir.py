"""One run directory, one process: new names for timestamped runs, and an exclusive lock while a run writes.

Two ``python train.py`` started in the same second used to share ``outputs/<task>/<time>``: one crashed, the other
mixed both runs' checkpoints, metrics and configs. Now a timestamped run claims a directory nobody has (``<time>``,
else ``<time>_1``, ``<time>_2`` ...: ``mkdir`` is atomic), and every run holds an exclusive lock on its directory
(``.lock``, ``flock``; the kernel drops it when the process ends, also by SIGKILL). A second process that names a
directory in use (``run_name=my_run`` twice at once) is refused with :class:`RunDirectoryInUseError`; one that
comes after the first has ended takes the lock and resumes the run as before.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "LOCK_NAME",
    "RunDirectoryInUseError",
    "claim_new_directory",
    "hold_run_directory",
    "is_first_process",
    "run_directory_lock",
]

LOCK_NAME = ".lock"

# locks this process holds: resolved directory -> [file descriptor, holders] (flock is per open file, so a second
# open of the same lock file by this process would refuse itself)
_HELD: dict[str, list[int]] = {}


class RunDirectoryInUseError(RuntimeError):
    """Another process is running in this run directory."""


def claim_new_directory(parent: str | os.PathLike, name: str) -> Path:
    """Create and return ``parent/name``, or ``parent/name_1``, ``name_2`` ... whichever no one has created yet."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    for number in range(10_000):
        candidate = parent / (name if number == 0 else f"{name}_{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"{parent} already holds {name} and 9,999 numbered copies of it; choose another run_name.")


@contextlib.contextmanager
def run_directory_lock(directory: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock of ``directory`` (created if missing) for the ``with`` block.

    Re-entrant within a process. Raises :class:`RunDirectoryInUseError` if another process holds it.
    """
    key = _acquire(Path(directory))
    try:
        yield Path(directory)
    finally:
        _release(key)


def hold_run_directory(directory: str | os.PathLike) -> None:
    """Take the lock of ``directory`` until this process ends (for the Hydra entry, before it writes there)."""
    _acquire(Path(directory))


def is_first_process() -> bool:
    """False in the other processes of a multi-process run (DDP ranks, SLURM tasks), which share rank 0's directory.

    Read from the launchers' environment variables, so that it can be asked before any Trainer exists.
    """
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def _acquire(directory: Path) -> str:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; runs are not locked there
        return ""
    directory.mkdir(parents=True, exist_ok=True)
    key = str(directory.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    path = directory / LOCK_NAME
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(handle)
        os.close(handle)
        raise RunDirectoryInUseError(
            f"run directory {directory} is in use by another process ({holder or 'unknown holder'}): two runs "
            "writing one directory would mix their checkpoints, metrics and configs. Wait until it has ended (then "
            "the same command resumes the run), or start this run under another name (run_name=<new name>, or "
            "paths.output_dir=<another directory> outside train.py)."
        ) from None
    os.ftruncate(handle, 0)
    os.write(handle, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
    _HELD[key] = [handle, 1]
    return key


def _release(key: str) -> None:
    if not key or key not in _HELD:
        return
    _HELD[key][1] -= 1
    if _HELD[key][1] == 0:
        handle, _ = _HELD.pop(key)
        os.close(handle)  # closing drops the flock


def _read_holder(handle: int) -> str:
    try:
        return os.pread(handle, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
