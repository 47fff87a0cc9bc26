"""Checking a checkpoint or weights file before anything reads it: a damaged byte is named, never loaded.

:func:`verify_file` runs before every load (:func:`linvit.io.load_checkpoint_file`,
:func:`linvit.io.check_checkpoint_intact`, a run's ``ckpt_path=`` and the checkpoint its test step loads, a
``local-dir:`` folder) and raises :class:`DamagedCheckpointError`, one line naming the file and the part of it:

- a torch zip archive (``.ckpt``, ``.pth``, ``.pt``): the declared sizes of its entries must fit in the file, and the
  CRC-32 of every entry, read in chunks, must match the one the archive holds (torch's own reader checks neither, so
  4 KB of flipped bytes loaded silently as other weights);
- a safetensors file: the 8-byte header length (bounded), a header of plain JSON, each tensor's dtype, shape and
  offsets consistent with each other, and the data section exactly as long as the file's remainder;
- any file: the SHA-256 recorded when linvit wrote it (``.linvit-written.json`` in its folder, see
  :mod:`linvit.io.destination`), and for ``model.safetensors`` the ``"sha256"`` of the ``config.json`` beside it,
  checked when present (a flipped byte inside a tensor changes no structure; only the hash sees it).

Training checkpoints get their SHA-256 recorded by :func:`replace_recorded` / :func:`write_recorded`. A file verified
once is not read again while its size, times and inode stay the same (a command that opens a checkpoint twice pays
once).
"""

from __future__ import annotations

import math
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

from linvit.io.bounded import UntrustedFileError, parse_json, read_json
from linvit.io.destination import RECORD_NAME, file_sha256, recorded_sha256s
from linvit.io.errors import CheckpointError, short_message

__all__ = [
    "DamagedCheckpointError",
    "verify_file",
]

_CHUNK = 1 << 20
_MAX_ENTRIES = 1 << 20  # a model's checkpoint has a few thousand entries
_MAX_COMPRESSION = 1100  # deflate cannot do better than ~1032:1; a larger declared ratio is a bomb or damage
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the limit safetensors itself sets
_SHA256 = re.compile(r"[0-9a-f]{64}")
# bytes per element of each safetensors dtype (sub-byte types are left to safetensors' own reader)
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
_verified: dict[str, tuple[tuple[int, ...], str]] = {}  # path -> (its stat when verified, what was checked)


class DamagedCheckpointError(CheckpointError):
    """A checkpoint or weights file whose bytes differ from what was saved (a CRC, a header or a SHA-256 fails)."""


def _damaged(path: Path, what: str) -> DamagedCheckpointError:
    return DamagedCheckpointError(
        f"'{path}' is damaged: {what}; nothing was loaded from it. Save, export or download it again, or use "
        "another copy"
    )


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def verify_file(path: str | os.PathLike, expected_sha256: str | None = None) -> str:
    """Raise :class:`DamagedCheckpointError` naming ``path`` and the damaged part unless the file is intact (see the
    module): a zip archive's entries against their CRC-32, a safetensors file's header against its size, and the
    file against ``expected_sha256`` and the SHA-256s recorded for it. Other files (a legacy pickle) are checked
    against the recorded SHA-256 only. A file that is missing or not a regular file is left to the loader.

    Returns what was checked, for the line that says how a file is loaded (e.g. ``"CRC-32 of 12 zip entries,
    recorded SHA-256"``; ``"nothing to check"`` for a legacy pickle nobody recorded).
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError:
        return "not checked"
    if not stat.S_ISREG(info.st_mode):
        return "not checked"
    key = str(path.resolve())
    cached = _verified.get(key)
    if expected_sha256 is None and cached is not None and cached[0] == _identity(info):
        return cached[1]
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
        checked = []
        if head.startswith(b"PK\x03\x04"):
            checked.append(f"CRC-32 of {_verify_zip(path, info.st_size)} zip entries")
        elif path.name.endswith(".safetensors"):
            checked.append(f"safetensors header of {_verify_safetensors(path, info.st_size)} tensors")
        checked += _verify_sha256(path, expected_sha256)
    except OSError:  # unreadable (permissions, I/O error): the loader names it
        return "not checked"
    summary = ", ".join(checked) or "nothing to check"
    _verified[key] = (_identity(info), summary)
    return summary


# ------------------------------------------------------------------------------------------------------ zip archives
def _verify_zip(path: Path, size: int) -> int:
    from linvit.io.pickle_scan import describe_contents

    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise CheckpointError(
            f"Could not read checkpoint '{path}' (truncated or corrupt?): it is {describe_contents(path)}. "
            f"Save or download it again. Loader message: {short_message(error)}"
        ) from None
    with archive:
        entries = archive.infolist()
        _check_declared_sizes(path, size, entries)
        for entry in entries:
            _check_entry_crc(path, archive, entry)
    return len(entries)


def _check_declared_sizes(path: Path, size: int, entries: list[zipfile.ZipInfo]) -> None:
    """Refuse an archive whose directory claims more than the file can hold (before reading any entry)."""
    if len(entries) > _MAX_ENTRIES:
        raise _damaged(path, f"its zip directory lists {len(entries):,} entries")
    total = 0
    for entry in entries:
        stored = entry.compress_type == zipfile.ZIP_STORED
        if entry.header_offset + entry.compress_size > size:
            raise _damaged(path, f"entry '{entry.filename}' is declared to reach past the end of the file")
        if stored and entry.compress_size != entry.file_size:
            raise _damaged(path, f"entry '{entry.filename}' declares {entry.file_size:,} bytes but stores "
                                 f"{entry.compress_size:,}")  # fmt: skip
        if not stored and entry.file_size > max(entry.compress_size, 1) * _MAX_COMPRESSION:
            raise _damaged(path, f"entry '{entry.filename}' declares {entry.file_size:,} bytes from "
                                 f"{entry.compress_size:,} compressed")  # fmt: skip
        total += entry.compress_size
    if total > size:
        raise _damaged(path, f"its entries declare {total:,} bytes in a file of {size:,}")


def _check_entry_crc(path: Path, archive: zipfile.ZipFile, entry: zipfile.ZipInfo) -> None:
    """Read ``entry`` in chunks: zipfile compares the CRC-32 of what it read with the archive's at the end."""
    import zlib

    try:
        with archive.open(entry) as stream:
            while stream.read(_CHUNK):
                pass
    except zipfile.BadZipFile as error:
        reason = "fails its CRC check" if "CRC" in str(error) else f"cannot be read ({short_message(error)})"
        raise _damaged(path, f"entry '{entry.filename}' {reason}") from None
    except (OSError, EOFError, zlib.error, NotImplementedError, ValueError) as error:
        raise _damaged(path, f"entry '{entry.filename}' cannot be read ({short_message(error)})") from None


# ------------------------------------------------------------------------------------------------------ safetensors
def _verify_safetensors(path: Path, size: int) -> int:
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise _damaged(path, f"it is {size} bytes, shorter than a safetensors header")
        length = int.from_bytes(head, "little")
        if length > min(size - 8, _MAX_SAFETENSORS_HEADER):
            raise _damaged(path, f"its header length says {length:,} bytes, in a file of {size:,}")
        text = handle.read(length)
    try:
        header = parse_json(text, f"the header of '{path}'", limit=_MAX_SAFETENSORS_HEADER)
    except UntrustedFileError as error:
        raise _damaged(path, f"its header is not plain JSON ({str(error).split(': ', 1)[-1]})") from None
    if not isinstance(header, dict):
        raise _damaged(path, f"its header holds a {type(header).__name__}, not an object")
    end, count = _check_tensor_spans(path, header)
    data = size - 8 - length
    if end > data:
        raise _damaged(path, f"its data section is cut short (truncated or corrupt?): {data:,} bytes where its "
                             f"tensors span {end:,}")  # fmt: skip
    if end < data:
        raise _damaged(path, f"its data section is {data:,} bytes, longer than the {end:,} its tensors span")
    return count


def _check_tensor_spans(path: Path, header: dict[str, Any]) -> tuple[int, int]:
    """Check each tensor's dtype, shape and offsets; the spans must tile the data section. Returns its end and the
    number of tensors."""
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise _damaged(path, "its header's __metadata__ is not an object of strings")
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _damaged(path, f"tensor '{name}' is not described by dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _DTYPE_BYTES:
            raise _damaged(path, f"tensor '{name}' has the unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
            raise _damaged(path, f"tensor '{name}' has the shape {shape!r}")
        if (
            not (isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int for x in offsets))
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _damaged(path, f"tensor '{name}' has the data offsets {offsets!r}")
        expected = math.prod(shape) * _DTYPE_BYTES[dtype]
        if offsets[1] - offsets[0] != expected:
            raise _damaged(path, f"tensor '{name}' ({dtype} {shape}) needs {expected:,} bytes, its offsets give "
                                 f"{offsets[1] - offsets[0]:,}")  # fmt: skip
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise _damaged(path, f"tensor '{name}' starts at byte {begin:,} of the data, not {end:,} "
                                 "(tensors overlap or leave a gap)")  # fmt: skip
        end = stop
    return end, len(spans)


# ------------------------------------------------------------------------------------------------------ SHA-256
def _config_sha256(path: Path) -> str | None:
    """The ``"sha256"`` that the ``config.json`` beside a ``model.safetensors`` records for it, or None."""
    config_path = path.with_name("config.json")
    if path.name != "model.safetensors" or not config_path.is_file():
        return None
    try:
        config = read_json(config_path)
    except UntrustedFileError:  # a bad config.json is named by whoever reads it for the model
        return None
    value = config.get("sha256") if isinstance(config, dict) else None
    if value is not None and not (isinstance(value, str) and _SHA256.fullmatch(value)):
        raise CheckpointError(
            f"'{config_path}': sha256 must be the 64 hex digits of {path.name}'s SHA-256, got {str(value)[:80]!r}; "
            "export the folder again or remove the key"
        )
    return value


def _verify_sha256(path: Path, expected: str | None) -> list[str]:
    """Check ``path`` against every SHA-256 known for it; returns the names of those checked."""
    wanted = [((expected,), "the SHA-256 given", "given SHA-256")] if expected else []
    recorded = recorded_sha256s(path)  # two while a replacement was under way: either file is intact
    if recorded:
        wanted.append((recorded, f"the SHA-256 recorded when linvit saved it ({RECORD_NAME})", "recorded SHA-256"))
    configured = _config_sha256(path)
    if configured:
        wanted.append(((configured,), "the SHA-256 in config.json beside it", "SHA-256 of config.json"))
    if not wanted:
        return []
    actual = file_sha256(path)
    for accepted, where, _ in wanted:
        sha256 = accepted[0]
        if actual not in {digest.lower() for digest in accepted}:
            raise _damaged(path, f"its SHA-256 {actual[:12]}... differs from {where}, {sha256[:12]}... (changed "
                                 "after it was written)")  # fmt: skip
    return [name for _, _, name in wanted]
