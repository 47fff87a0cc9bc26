"""Hypothesis strategies that damage real artefacts: the bytes of a checkpoint or an image, and the keys and values of
a run's ``config.yaml`` or a weights folder's ``config.json``, as an attacker or a failing disk would.

Every strategy starts from a real file (made by a real run in ``conftest.py``), so what it finds is one step beside
what works, where the promises broke before.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from hypothesis import strategies as st

CANARY_NAME = "canary.pth"  # a file beside the artefacts that no command line names: opening it breaks a promise

# Values an attacker would put where a config has a number, a string or a list.
HOSTILE_SCALARS = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            0,
            -1,
            2**63,
            10**400,
            math.nan,
            math.inf,
            -math.inf,
            1e308,
            "",
            " ",
            "nan",
            "${oc.env:HOME}",
            "${now:%Y}",
            "../" * 8 + "etc/passwd",
            "/dev/zero",
            "local-dir:/",
            "hf-hub:timm/resnet18.a1_in1k",
            "linvit_nano",
            "os.system",
            "builtins.eval",
            "x" * 10_000,
        ]
    ),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
HOSTILE_VALUES = st.recursive(
    HOSTILE_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=8,
)
# Keys that mean something to Hydra, Lightning, timm or linvit's loaders, and near misses of them.
HOSTILE_KEYS = st.one_of(
    st.sampled_from(
        [
            "_target_",
            "_target_ ",
            " _target_",
            "_partial_",
            "_recursive_",
            "_convert_",
            "_args_",
            "_instantiator",
            "trusted",
            "allow_non_finite",
            "pretrained",
            "pretrained_cfg",
            "pretrained_cfg_overlay",
            "checkpoint_path",
            "cache_dir",
            "file",
            "model_args",
            "num_classes",
            "in_chans",
            "img_size",
            "root",
            "mean",
            "std",
            "batch_size",
        ]
    ),
    st.text(min_size=1, max_size=12),
)
# Lines that turn YAML text into something only an unsafe loader reads.
YAML_INJECTIONS = [
    "evil: !!python/object/apply:os.system ['touch {canary}']\n",
    "evil: !!python/name:os.system\n",
    "evil: !!binary aGVsbG8=\n",
    "evil: !custom 1\n",
    "anchor: &a [1, 2]\nalias: *a\n",
    "a: &a ['x','x']\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b]\n",
    "deep: " + "[" * 200 + "]" * 200 + "\n",
    "\x00\x01\x02: bad\n",
]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a value inside nested dicts and lists, the root included."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _set(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = node
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return node


CANARY = "<canary>"  # a value that apply_config_edits replaces with the canary file's path
# An edit: (which value, as a fraction of the list of paths; action; a key to add; a value to put).
CONFIG_EDIT = st.tuples(
    st.floats(0, 1, exclude_max=True),
    st.sampled_from(["replace", "add", "remove"]),
    HOSTILE_KEYS,
    st.one_of(HOSTILE_VALUES, st.just(CANARY)),
)
config_edits = st.lists(CONFIG_EDIT, min_size=1, max_size=3)
"""Damage to a config's keys and values as a short list of edits."""


def _with_canary(value: Any, canary: str) -> Any:
    if value == CANARY:
        return canary
    if isinstance(value, list):
        return [_with_canary(item, canary) for item in value]
    if isinstance(value, dict):
        return {key: _with_canary(item, canary) for key, item in value.items()}
    return value


def apply_config_edits(original: dict, edits: list, canary: str) -> tuple[Any, list[str]]:
    """``original`` with ``edits`` applied: a value replaced, a key added (often one Hydra, timm or a loader reads),
    a key removed; values may name the canary file. Returns the config and the keys touched (what an error may
    name)."""
    config: Any = copy.deepcopy(original)
    touched: list[str] = []
    for where, action, key, value in edits:
        paths = _paths(config)
        path = paths[int(where * len(paths))]
        value = _with_canary(value, canary)
        target = config
        for part in path:
            target = target[part]
        if action == "add" and isinstance(target, dict):
            target[key] = value
            touched.append(str(key))
        elif action == "remove" and path:
            parent = config
            for part in path[:-1]:
                parent = parent[part]
            del parent[path[-1]]
        else:
            config = _set(config, path, value)
        touched.extend(str(part) for part in path if isinstance(part, str))
    return config, touched


BYTE_ACTIONS = ("flip", "zero", "overwrite", "truncate", "append", "repeat", "header")
# An edit: (action, where as a fraction of the length, a number the action reads, bytes the action writes).
BYTE_EDIT = st.tuples(
    st.sampled_from(BYTE_ACTIONS),
    st.floats(0, 1, exclude_max=True),
    st.integers(0, 4096),
    st.binary(min_size=1, max_size=32),
)
byte_edits = st.lists(BYTE_EDIT, min_size=1, max_size=4)
"""Byte-level damage as a short list of edits (kept as a regression example, it reads as what was done)."""


def apply_byte_edits(original: bytes, edits: list[tuple[str, float, int, bytes]]) -> bytes:
    """``original`` with ``edits`` applied: bits flipped, a range zeroed or overwritten, the file cut short or grown,
    a slice repeated, a byte of the header (where formats keep their sizes and magic numbers) changed. Never the
    original bytes themselves."""
    data = bytearray(original)
    for action, where, number, patch in edits:
        at = int(where * len(data))
        if action == "flip" and data:
            data[at] ^= 1 << (number % 8)
        elif action == "zero":
            data[at : at + number + 1] = bytes(len(data[at : at + number + 1]))
        elif action == "overwrite":
            data[at : at + len(patch)] = patch
        elif action == "truncate":
            del data[at:]
        elif action == "append":
            data.extend(patch * (1 + number // 32))
        elif action == "repeat":
            data[at:at] = data[at : at + number + 1]
        elif action == "header" and data:
            data[number % min(len(data), 64)] = patch[0]
    if bytes(data) == original:
        data.append(0)
    return bytes(data)
