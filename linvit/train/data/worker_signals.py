"""Data workers that live through a SIGTERM sent to the whole process group, so that the main process can save.

Schedulers (SLURM, ``timeout``, Kubernetes) send SIGTERM to every process of a job. A data worker that dies of it
makes the main process fail ("DataLoader worker (pid ...) is killed by signal: Terminated") before it saves. While a
fit with :class:`~linvit.train.modules.callbacks.SaveOnSigterm` runs, new workers block SIGTERM: the signal stays
pending, and they end as usual when the main process stops them or is gone (torch's watchdog).

Two ways in, one per way workers start:

- fork (Linux's default up to Python 3.13), for any ``DataLoader``, a user's own too: an at-fork hook blocks SIGTERM
  in the child from its first instruction;
- spawn and forkserver (Python 3.14's default on Linux), for linvit's loaders (:class:`SigtermSafeDataLoader`): the
  worker blocks SIGTERM first thing in its ``worker_init_fn``. A new interpreter does not inherit a blocked signal
  mask (spawn), and a forkserver would keep one for every later worker, so the block cannot come from the main
  process. A SIGTERM that reaches a worker while it is still starting (importing torch, seconds after a spawn) ends
  it: persistent workers (linvit's default with workers) start once, at the first epoch.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from torch.utils.data import DataLoader

__all__ = ["SigtermSafeDataLoader", "blocking", "workers_block_sigterm"]

_FITS_BLOCKING = 0  # fits in progress in this process that want new workers to block SIGTERM
_AT_FORK_REGISTERED = False


def workers_block_sigterm(enable: bool) -> None:
    """Count a fit in (``True``) or out (``False``): while any is in, new data workers block SIGTERM."""
    global _FITS_BLOCKING, _AT_FORK_REGISTERED
    if not hasattr(signal, "pthread_sigmask"):
        return  # no POSIX signal masks (Windows): nothing to block
    if not _AT_FORK_REGISTERED:
        os.register_at_fork(after_in_child=_block_sigterm_in_forked_child)
        _AT_FORK_REGISTERED = True
    _FITS_BLOCKING = max(0, _FITS_BLOCKING + (1 if enable else -1))


def blocking() -> bool:
    """Whether new data workers start with SIGTERM blocked now."""
    return _FITS_BLOCKING > 0


def _block_sigterm_in_forked_child() -> None:
    # Blocked, not ignored: torch installs its own SIGTERM handler in workers, which would undo an ignore.
    global _FITS_BLOCKING
    if _FITS_BLOCKING:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _FITS_BLOCKING = 0  # the child's own fits (if any) decide for its children


class _WorkerInit:
    """A ``worker_init_fn`` that blocks SIGTERM when asked, then runs the user's own (picklable, for spawn)."""

    def __init__(self, user_fn: Callable[[int], None] | None, block_sigterm: bool) -> None:
        self.user_fn = user_fn
        self.block_sigterm = block_sigterm

    def __call__(self, worker_id: int) -> None:
        if self.block_sigterm:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if self.user_fn is not None:
            self.user_fn(worker_id)


class SigtermSafeDataLoader(DataLoader):
    """A ``DataLoader`` whose workers, started during a fit that saves on SIGTERM, block SIGTERM whatever the start
    method (``multiprocessing_context`` fork, spawn or forkserver)."""

    def __iter__(self):
        # decided when the workers start (once, with persistent workers), in the main process, where fits count;
        # wraps whatever worker_init_fn is set now (Lightning adds its seeding one after the loader is built)
        current = self.worker_init_fn
        user_fn = current.user_fn if isinstance(current, _WorkerInit) else current
        self.worker_init_fn = _WorkerInit(user_fn, block_sigterm=blocking())
        return super().__iter__()
