"""Each room of the package imports only the rooms below it (README, Architecture):

    ops <- attention <- layers <- models <- utils, dense <- viz, bench, train <- commands
    io (checkpoint files) sits beside ops: the model families and everything above them use it
    linvit._lazy (the packages' lazy exports) sits at the bottom: every room may use it, it imports no room

Inside `train`, its rooms import one way, data <- modules <- runs: `data` (DataModules and what they stand on)
imports neither of the others, `modules` (LightningModules and their callbacks) imports `data`, `runs` (the Hydra
entry, run directories, saved runs, export) imports both; the package's own `__init__` only re-exports.

Lightning, Hydra and OmegaConf stay above the model rooms: `dense` and `bench` import neither; in `train` only the
training entry (`run.py`, `hydra_app.py`) imports Hydra; the commands import no Hydra or OmegaConf, and only
`linvit train` reaches the Hydra entry. Nothing in the package imports the checkout's `benchmarks/` or edits
`sys.path` to find it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "linvit"

BELOW_MODELS = {"layers", "attention", "ops", "io"}
# each room and the linvit rooms its modules may import (itself included)
ALLOWED = {
    "ops": {"ops"},
    "io": {"io"},
    "attention": {"attention", "ops"},
    "layers": {"layers", "attention", "ops"},
    "models": {"models", *BELOW_MODELS},
    "utils": {"utils", "models", *BELOW_MODELS},
    "dense": {"dense", "models", *BELOW_MODELS},
    "viz": {"viz", "dense", "models", *BELOW_MODELS},
    "bench": {"bench", "utils", "models", *BELOW_MODELS},
    "train": {"train", "dense", "utils", "models", *BELOW_MODELS},
}
ROOMS = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
# `import linvit` registers the models: it imports the rooms its __init__ imports
ROOT_IMPORTS = {"attention", "models"}

LIGHTNING, HYDRA, OMEGACONF = ("lightning", "pytorch_lightning"), ("hydra",), ("omegaconf",)
TORCH_ONLY = ("ops", "io", "attention", "layers", "models", "dense", "viz", "bench")
FORBIDDEN = {
    **dict.fromkeys(TORCH_ONLY, LIGHTNING + HYDRA + OMEGACONF),
    "utils": LIGHTNING + HYDRA,  # saved_config reads the OmegaConf nodes it is handed (an optional import)
    "train": HYDRA,  # except the training entry, below
    "commands": HYDRA + OMEGACONF,
}
HYDRA_ENTRY = {"train/runs/run.py", "train/runs/hydra_app.py"}
# the modules of train that import Hydra: only `linvit train` may reach them
HYDRA_MODULES = {"linvit.train.runs.run", "linvit.train.runs.hydra_app"}
# the rooms of train and the rooms of train each may import (itself included): data <- modules <- runs
TRAIN_ALLOWED = {
    "data": {"data"},
    "modules": {"modules", "data"},
    "runs": {"runs", "modules", "data"},
}


def _imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names), anywhere in it (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import; linvit imports by absolute name"
            names.add(node.module)
    return names


# package-root helpers below every room: any room may import them, they import nothing of linvit
FOUNDATION = {"linvit._lazy"}


def _rooms_named(name: str) -> set[str]:
    if name in FOUNDATION:
        return set()
    parts = name.split(".")
    return ROOT_IMPORTS if len(parts) == 1 else {parts[1]}


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_rooms_import_only_the_rooms_below(room):
    wrong = []
    for path in sorted((PACKAGE / room).rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] == "linvit" and not _rooms_named(name) <= ALLOWED[room]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("module", sorted(FOUNDATION))
def test_the_foundation_imports_no_room(module):
    path = PACKAGE / f"{module.split('.')[1]}.py"
    assert sorted(name for name in _imports(path) if name.split(".")[0] == "linvit") == []


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_training_frameworks_stay_in_their_rooms(room):
    wrong = []
    for path in sorted((PACKAGE / room).rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN[room] and where not in HYDRA_ENTRY:
                wrong.append(f"{where} imports {name}")
            if room == "commands" and where != "commands/train.py" and name in HYDRA_MODULES:
                wrong.append(f"{where} imports {name} (Hydra's entry: only `linvit train` runs it)")
    assert wrong == []


@pytest.mark.parametrize("room", sorted(TRAIN_ALLOWED))
def test_train_rooms_import_one_way(room):
    """A module of a train room imports only the train rooms below it (``linvit.train`` itself, whose ``__init__``
    imports the rooms, included: it is above them all)."""
    wrong = []
    for path in sorted((PACKAGE / "train" / room).rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[:2] == ["linvit", "train"] and (len(parts) < 3 or parts[2] not in TRAIN_ALLOWED[room]):
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == []


def test_every_module_of_train_is_in_a_room():
    """``linvit/train`` holds its rooms and the ``__init__`` that re-exports their public classes, nothing else."""
    train = PACKAGE / "train"
    loose = sorted(path.name for path in train.glob("*.py") if path.name != "__init__.py")
    rooms = sorted(path.name for path in train.iterdir() if (path / "__init__.py").is_file())
    assert (loose, rooms) == ([], sorted(TRAIN_ALLOWED))


def test_every_room_is_placed():
    """A new folder of the package joins ALLOWED (or is a command room) before anything imports it."""
    placed = set(ALLOWED) | {"commands", "memory"}  # memory: the memory estimates (in progress)
    assert sorted(set(ROOMS) - placed) == []


def test_nothing_in_the_package_reaches_into_the_checkout():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(PACKAGE))
        wrong += [f"{where} imports {name}" for name in _imports(path) if name.split(".")[0] == "benchmarks"]
        wrong += [f"{where} edits sys.path" for call in ("sys.path.insert", "sys.path.append") if call in text]
    assert wrong == []
