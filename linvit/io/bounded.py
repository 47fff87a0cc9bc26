"""Reading a JSON or YAML file that nobody vouched for: bounded in size and nesting before it is parsed, plain
values only.

Every config a command reads from disk (a run's ``config.yaml``, a ``config.json`` beside weights, a safetensors
file's metadata) goes through :func:`read_json` / :func:`read_yaml` / :func:`parse_json`. They refuse, in one
:class:`UntrustedFileError` line naming the file: a regular file that is missing or is a FIFO, socket or device (never
opened, so nothing hangs), one over :data:`MAX_CONFIG_BYTES`, text that is not UTF-8, nesting deeper than
:data:`MAX_NESTING`, any YAML tag (``!!python/object``, ``!!binary``, custom ``!tags``), YAML aliases (the
"billion laughs"), non-string keys and keys with leading or trailing white space (``"_target_ "`` would slip past a
check for ``_target_``). What comes back holds only dicts, lists, strings, numbers, booleans and None.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from linvit.io.errors import OneLineError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_NESTING",
    "UntrustedFileError",
    "check_plain",
    "parse_json",
    "read_json",
    "read_regular_file",
    "read_yaml",
]

MAX_CONFIG_BYTES = 1 << 20  # a run's config.yaml is ~5 KB, a timm config.json ~2 KB (labels of 1000 classes ~30 KB)
MAX_NESTING = 32


class UntrustedFileError(OneLineError):
    """A file read as data is not what it may be (too large, too deep, not plain JSON/YAML, not a regular file)."""


def read_regular_file(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of ``path`` if it is a regular file (checked before opening, and again on the open handle) of at
    most ``limit`` bytes; :class:`UntrustedFileError` naming it otherwise. A FIFO is never opened for reading."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as error:
        raise UntrustedFileError(f"cannot read {what} '{path}': {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedFileError(f"{what} '{path}' is not a regular file (a folder, FIFO, socket or device): not read")
    if info.st_size > limit:
        raise UntrustedFileError(f"{what} '{path}' is {info.st_size:,} bytes, over the {limit:,} a {what} may be")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped for a FIFO between the checks
                raise UntrustedFileError(f"{what} '{path}' is not a regular file: not read")
            data = handle.read(limit + 1)
    except OSError as error:
        raise UntrustedFileError(f"cannot read {what} '{path}': {error.strerror or error}") from None
    if len(data) > limit:
        raise UntrustedFileError(f"{what} '{path}' grew past the {limit:,} bytes a {what} may be while being read")
    return data


def _nesting_of_text(text: str) -> int:
    """The deepest bracket nesting of JSON or flow YAML text, counted without parsing (strings skipped roughly)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def check_plain(value: Any, source: str, where: str = "", depth: int = 0) -> None:
    """Raise :class:`UntrustedFileError` unless ``value`` holds only plain data (see the module), keys named."""
    if depth > MAX_NESTING:
        raise UntrustedFileError(f"{source}: nested deeper than {MAX_NESTING} levels at {where or 'the top'}")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UntrustedFileError(f"{source}: key {key!r} at {where or 'the top'} is not a string")
            if key != key.strip() or not key:
                raise UntrustedFileError(
                    f"{source}: key {key!r} at {where or 'the top'} is empty or has white space around it"
                )
            check_plain(item, source, f"{where}.{key}" if where else key, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_plain(item, source, f"{where}[{index}]", depth + 1)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise UntrustedFileError(f"{source}: {where or 'the top'} holds a {type(value).__name__}, not plain data")


def _text_within_bounds(text: str | bytes, source: str, limit: int, nesting: Callable[[str], int]) -> str:
    """``text`` as UTF-8 text, checked against the size ``limit`` and ``nesting(text)`` against :data:`MAX_NESTING`
    before any parser sees it."""
    if len(text) > limit:
        raise UntrustedFileError(f"{source} is {len(text):,} bytes, over the {limit:,} it may be")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise UntrustedFileError(f"{source} is not UTF-8 text") from None
    if nesting(text) > MAX_NESTING:
        raise UntrustedFileError(f"{source} is nested deeper than {MAX_NESTING} levels")
    return text


def parse_json(text: str | bytes, source: str, limit: int = MAX_CONFIG_BYTES) -> Any:
    """JSON text (e.g. a safetensors metadata value) parsed within the bounds; ``source`` names it in errors."""
    text = _text_within_bounds(text, source, limit, _nesting_of_text)
    try:
        value = json.loads(text, parse_constant=lambda name: _refuse_constant(name, source))
    except json.JSONDecodeError as error:
        raise UntrustedFileError(f"{source} is not valid JSON ({error})") from None
    check_plain(value, source)
    return value


def _refuse_constant(name: str, source: str) -> Any:
    raise UntrustedFileError(f"{source} holds {name}, which is not JSON")


def read_json(path: str | os.PathLike, what: str = "config", limit: int = MAX_CONFIG_BYTES) -> Any:
    """A JSON file read within the bounds (see the module)."""
    return parse_json(read_regular_file(path, limit, what), f"{what} '{path}'", limit)


def _plain_yaml_loader():
    import yaml

    class PlainLoader(yaml.SafeLoader):
        """YAML's safe loader without tags or aliases: plain scalars, lists and mappings only."""

        def compose_node(self, parent, index):  # PyYAML's signature
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.constructor.ConstructorError(
                    None, None, "aliases (*name) are not read from untrusted files", event.start_mark
                )
            return super().compose_node(parent, index)

    # an explicit standard tag (!!python/object, !!binary, !!set ...) resolves to tag:yaml.org,2002:...; the plain
    # scalar, sequence and mapping tags are the only ones kept
    PlainLoader.yaml_constructors = {
        tag: constructor
        for tag, constructor in yaml.SafeLoader.yaml_constructors.items()
        if tag
        in {
            "tag:yaml.org,2002:null",
            "tag:yaml.org,2002:bool",
            "tag:yaml.org,2002:int",
            "tag:yaml.org,2002:float",
            "tag:yaml.org,2002:str",
            "tag:yaml.org,2002:seq",
            "tag:yaml.org,2002:map",
        }
    }
    PlainLoader.yaml_constructors[None] = _refuse_tag
    # a plain 2026-12-03 stays a string (YAML 1.1 would make it a date)
    PlainLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return PlainLoader


def _refuse_tag(loader, node):  # PyYAML's signature
    import yaml

    raise yaml.constructor.ConstructorError(None, None, f"the tag {node.tag} is not read", node.start_mark)


def parse_yaml(text: str | bytes, source: str, limit: int = MAX_CONFIG_BYTES) -> Any:
    """YAML text parsed within the bounds (see the module); ``source`` names it in errors."""
    import yaml

    text = _text_within_bounds(text, source, limit, lambda text: max(_nesting_of_text(text), _indent_levels(text)))
    try:
        value = yaml.load(text, Loader=_plain_yaml_loader())  # noqa: S506 - the loader above builds plain data only
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UntrustedFileError(f"{source} is not plain YAML{where}: {problem}") from None
    except RecursionError:
        raise UntrustedFileError(f"{source} is nested too deeply") from None
    check_plain(value, source)
    return value


def _indent_levels(text: str) -> int:
    """Distinct indentation widths of block YAML: a bound on its block nesting, without parsing."""
    return len({len(line) - len(line.lstrip(" ")) for line in text.splitlines() if line.strip()})


def read_yaml(path: str | os.PathLike, what: str = "config", limit: int = MAX_CONFIG_BYTES) -> Any:
    """A YAML file read within the bounds (see the module)."""
    return parse_yaml(read_regular_file(path, limit, what), f"{what} '{path}'", limit)
