"""``linvit train [OVERRIDES]``: ``python train.py`` for any install, with the configs that ship in the package.

Every argument goes to Hydra as it would to ``python train.py``: overrides (``data=imagefolder data.root=...``),
``--config-dir DIR`` for your own configs (searched first: ``DIR/experiment/mine.yaml`` is ``experiment=mine``, a
``DIR/train.yaml`` replaces ours), ``--cfg job`` to print the composed config, ``-m`` for sweeps, ``--help``.
"""

from __future__ import annotations

import argparse

HELP = "Train with Lightning + Hydra: `linvit train [--config-dir DIR] [OVERRIDES]`, like `python train.py`."
# linvit.cli hands this command its arguments untouched: Hydra parses them
RAW_ARGUMENTS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="Hydra overrides and flags, e.g. data=imagefolder data.root=/data/x --config-dir ~/my_configs "
        "(`linvit train --help` lists the config groups)",
    )


def run(args: argparse.Namespace) -> int:
    return run_arguments(list(args.overrides or []))


def run_arguments(arguments: list[str]) -> int:
    from linvit.cli import load_library
    from linvit.train.runs.hydra_app import main

    main(argv=arguments, before_task=load_library)
    return 0
