"""The Hydra application behind ``python train.py`` (a checkout) and ``linvit train`` (any install): one of each.

Both compose ``train.yaml`` from the training configs (:func:`config_dir`: ``linvit/configs`` inside the package,
which in a checkout is the link to the top-level ``configs/``), take the same command-line overrides, Hydra's own
flags included (``--config-dir DIR`` puts your own configs first in the search path, ``--cfg job`` prints the config,
``-m`` sweeps), and run :func:`linvit.train.runs.run.train`.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_NAME", "config_dir", "main", "run_task"]

CONFIG_NAME = "train"
_log = logging.getLogger("linvit.train")
# errors of the file system that only writing raises: one line naming the file, not a traceback
_WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def config_dir() -> Path:
    """The training configs that ship with the package (``linvit/configs``)."""
    directory = (Path(__file__).resolve().parents[2] / "configs").resolve()
    if not (directory / f"{CONFIG_NAME}.yaml").is_file():
        raise FileNotFoundError(
            f"linvit's training configs are missing: no {CONFIG_NAME}.yaml in {directory}. Reinstall linvit (the wheel "
            "ships them), or in a checkout restore the link linvit/configs -> ../configs."
        )
    return directory


def run_task(cfg: Any) -> float | None:
    """Hydra's task: train, test, export; the summary from the first process; the metric a sweeper optimises.

    A data set that is not there or cannot be read as one label per class folder (a symlink loop, a single class), a
    config value of the wrong type or one its class refuses, a checkpoint that cannot be read (``ckpt_path=``, the
    run's ``last.ckpt``) and a file that cannot be written (a full disk, a read-only folder:
    :class:`~linvit.io.destination.DestinationError`) end the run with their one-line message (exit status 1)
    instead of a traceback; ``HYDRA_FULL_ERROR=1`` shows the traceback. The checkpoints on disk stay as they were.
    """
    from hydra.errors import InstantiationException

    from linvit.io import CheckpointError
    from linvit.io.destination import DestinationError, refuse_os_error
    from linvit.train.data.datasets import DataUnavailableError
    from linvit.train.data.folder_scan import FolderLayoutError
    from linvit.train.runs.config_types import ConfigTypeError, ConfigValueError
    from linvit.train.runs.run import summarize, train
    from linvit.train.runs.run_dir import is_first_process

    try:
        try:
            metrics = train(cfg)
        except OSError as error:  # a write outside linvit's own writers (a logger's): the disk, not the code
            if error.errno not in _WRITE_FAILURES or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            raise refuse_os_error(error.filename or "a file of the run", error) from error
    except (DataUnavailableError, FolderLayoutError, CheckpointError, ConfigTypeError, DestinationError) as error:
        _stop(error)
    except ConfigValueError as error:  # a value its class refused, in the class's words (one line)
        _stop(error if os.environ.get("HYDRA_FULL_ERROR") == "1" else " ".join(str(error).split()))
    except InstantiationException as error:  # a config value the typed check has no rule for, refused by its class
        if not isinstance(error.__cause__, (ValueError, TypeError)):
            raise
        target = str(error).split("'")[1] if str(error).count("'") >= 2 else "an object of the config"
        _stop(f"the config's values for {target} were refused: {' '.join(str(error.__cause__).split())}")
    if is_first_process():
        _log.info(summarize(cfg, metrics))
    return metrics.get(str(cfg.get("optimized_metric", "test/acc1")))


def _stop(error: BaseException | str) -> None:
    """End the run with one ``error:`` line (``HYDRA_FULL_ERROR=1``: the traceback instead)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1" and isinstance(error, BaseException):
        raise error
    _log.error("%s", error)
    sys.stderr.write(f"error: {error}\n")
    sys.exit(1)


def main(
    argv: list[str] | None = None,
    configs: str | os.PathLike | None = None,
    before_task: Callable[[], None] | None = None,
) -> None:
    """Run the Hydra app on ``argv`` (default: ``sys.argv[1:]``) with the configs in ``configs`` (default: ours).

    ``before_task`` runs when the task starts, not for Hydra's flags that only print (``--help``, ``--cfg job``):
    ``linvit train`` loads the library there (:func:`linvit.cli.load_library`).

    ``sys.argv`` is what Hydra parses; it is handed back whole to the task, because Lightning re-launches
    ``sys.argv`` for the other DDP ranks (``linvit train ...`` must restart as ``linvit train ...``).
    """
    import hydra

    from linvit.train.runs.run_identity import register_resolvers

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    register_resolvers()
    original = list(sys.argv)

    def task(cfg: Any) -> float | None:
        sys.argv[:] = original
        if before_task is not None:
            before_task()
        return run_task(cfg)

    directory = Path(configs).resolve() if configs is not None else config_dir()
    app = hydra.main(version_base="1.3", config_path=str(directory), config_name=CONFIG_NAME)(task)
    if argv is not None:
        sys.argv[:] = [original[0] if original else "linvit", *argv]
    try:
        app()
    finally:
        sys.argv[:] = original
