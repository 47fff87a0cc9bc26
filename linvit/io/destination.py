"""Writing files without losing anyone's: every file linvit writes goes through :func:`write_file`.

- The bytes go to a temporary file in the destination's folder (``.NAME.<random>.linvit-tmp``), which is flushed,
  fsynced and renamed onto the destination (``os.replace``, atomic on POSIX), so a kill at any moment leaves the old
  file or the new one under the final name, never a partial one.
- Each folder linvit writes into holds a record, :data:`RECORD_NAME`, of what it wrote there: file name, kind (e.g.
  ``onnx``, ``checkpoint``), size and SHA-256. A destination that exists is replaced only when the record says
  linvit wrote it as the same kind and its bytes still match (so ``linvit export`` never replaces a user's
  ``notes.txt`` nor the run's ``best.ckpt``), or when the user passed ``--force`` (``force=True``). Even then a
  folder, a link or a special file is never replaced.
- The SHA-256 in the record is also what :func:`recorded_sha256` gives the loaders, which check a file against it
  before use (a byte flipped after the save is then named, not loaded).
- Failures of the file system (a full disk, a read-only or missing folder, a destination that is a folder) raise
  :class:`DestinationError`, one line naming the path; so does a destination that is the command's own input
  (:func:`check_not_input`, even with ``--force``).
- Writers that must name their file themselves use a temporary name of ours: :func:`move_into_place` renames and
  records it (a checkpoint Lightning saves on every rank); :func:`staging_folder` holds files written together under
  their final names (ONNX with external data). :func:`remove_own_temporaries` removes what a kill left of either,
  and nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from linvit.io.errors import OneLineError

__all__ = [
    "RECORD_NAME",
    "TEMPORARY_SUFFIX",
    "DestinationError",
    "check_destination",
    "check_not_input",
    "file_sha256",
    "move_into_place",
    "prepare_folder",
    "recorded_sha256",
    "refuse_os_error",
    "remove_own_temporaries",
    "save_figure",
    "staging_folder",
    "write_file",
    "write_text",
]

RECORD_NAME = ".linvit-written.json"
TEMPORARY_SUFFIX = ".linvit-tmp"
_RECORD_LIMIT = 4 * 1024 * 1024  # bytes: a record holds a line per file written; a larger one is not ours


class DestinationError(OneLineError):
    """A file cannot be written where asked (exists and is not linvit's, a folder, unwritable, disk full)."""


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes, read in chunks (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _read_record(folder: Path) -> dict[str, dict[str, Any]]:
    """The folder's record of what linvit wrote there; {} when absent or not one linvit wrote (never an error)."""
    path = folder / RECORD_NAME
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _RECORD_LIMIT:
            return {}
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(record, dict):
        return {}
    return {
        name: entry
        for name, entry in record.items()
        if isinstance(name, str)
        and isinstance(entry, dict)
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("kind"), str)
        and isinstance(entry.get("size"), int)
    }


def recorded_sha256s(path: str | os.PathLike) -> tuple[str, ...]:
    """Every SHA-256 the record accepts for ``path``: what linvit wrote, and while a replacement of it was under way
    (a kill between record and rename) also what was there before. Empty when nothing is recorded."""
    path = Path(path)
    entry = _read_record(path.parent).get(path.name)
    if not entry:
        return ()
    previous = entry.get("previous_sha256")
    return (entry["sha256"], previous) if isinstance(previous, str) else (entry["sha256"],)


def recorded_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 linvit recorded when it wrote ``path`` (in the folder's :data:`RECORD_NAME`), or None."""
    path = Path(path)
    entry = _read_record(path.parent).get(path.name)
    return entry["sha256"] if entry else None


def _written_by_linvit(path: Path, kind: str) -> bool:
    """Whether the record says linvit wrote ``path`` as ``kind`` and the file still has those bytes."""
    entry = _read_record(path.parent).get(path.name)
    if not entry or entry["kind"] != kind:
        return False
    try:
        return path.stat().st_size == entry["size"] and file_sha256(path) == entry["sha256"]
    except OSError:
        return False


def _problem(path: Path, error: OSError) -> DestinationError:
    reasons = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exceeded",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENOENT: "its folder does not exist",
        errno.ENOTDIR: "a part of the path is not a folder",
        errno.EISDIR: "it is a folder",
        errno.ENAMETOOLONG: "the name is too long",
    }
    reason = reasons.get(error.errno, error.strerror or type(error).__name__)
    return DestinationError(f"cannot write '{path}': {reason}")


def check_destination(
    path: str | os.PathLike, kind: str, *, force: bool = False, force_option: str = "--force"
) -> Path:
    """Raise :class:`DestinationError` unless ``path`` may be written as ``kind``: it does not exist, or linvit wrote
    it as that kind and it is unchanged, or ``force`` (never a folder, a link or a special file). Returns the path."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as error:
        raise _problem(path, error) from None
    if stat.S_ISDIR(info.st_mode):
        raise DestinationError(f"cannot write '{path}': it is a folder; name a file inside it")
    if not stat.S_ISREG(info.st_mode):
        raise DestinationError(
            f"cannot write '{path}': it is a link or a special file, not replaced even with {force_option}"
        )
    if force or _written_by_linvit(path, kind):
        return path
    raise DestinationError(
        f"'{path}' exists and linvit did not write it as {kind}: not replaced. Name another destination, or pass "
        f"{force_option} to replace it"
    )


def check_not_input(path: str | os.PathLike, *inputs: str | os.PathLike | None) -> None:
    """Raise :class:`DestinationError` when ``path`` is one of the files a command reads (the same file, also
    through a link): a destination never replaces its own input, even with ``--force``."""
    for source in inputs:
        if source is None:
            continue
        with contextlib.suppress(OSError):
            if os.path.samefile(path, source):
                raise DestinationError(
                    f"cannot write '{path}': it is the input '{source}' itself; name another destination"
                )


def refuse_os_error(path: str | os.PathLike, error: OSError) -> DestinationError:
    """The one-line :class:`DestinationError` for a failure of the file system writing ``path`` (a full disk, a
    read-only or missing folder, ...)."""
    return _problem(Path(path), error)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")


def _write_record(folder: Path, record: dict[str, dict[str, Any]]) -> None:
    text = json.dumps(record, indent=1, sort_keys=True)
    _replace_atomically(folder / RECORD_NAME, lambda tmp: tmp.write_text(text))


def _record_coming(path: Path, kind: str, temporary: Path) -> None:
    """Before ``temporary`` is renamed onto ``path``: record the new bytes, and keep the SHA-256 of the bytes now under
    that name as ``previous_sha256``, so that a kill between the record and the rename leaves a record that accepts
    whichever file is there (never one that calls the intact old file damaged)."""
    record = _read_record(path.parent)
    entry = {"kind": kind, "size": temporary.stat().st_size, "sha256": file_sha256(temporary)}
    if path.is_file():
        old = record.get(path.name)
        entry["previous_sha256"] = old["sha256"] if old else file_sha256(path)
    record[path.name] = entry
    _write_record(path.parent, record)


def _record_done(path: Path) -> None:
    """After the rename: the record accepts the new bytes only."""
    record = _read_record(path.parent)
    if record.get(path.name, {}).pop("previous_sha256", None) is not None:
        _write_record(path.parent, record)


def _write_temporary(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(temporary)`` for a temporary name beside ``path``, fsynced; removed again if anything fails."""
    temporary = _temporary_name(path)
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
    except BaseException:  # also a KeyboardInterrupt/SystemExit (SIGTERM) during the write
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return temporary


def _rename_into_place(temporary: Path, path: Path, kind: str, record: bool) -> None:
    """Rename the complete ``temporary`` onto ``path`` (atomic), recorded as ``kind`` around the rename."""
    try:
        if record:
            _record_coming(path, kind, temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)
    if record:
        _record_done(path)


def _replace_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """``path`` replaced by what ``write`` writes, through a temporary name, not recorded (the record itself)."""
    _rename_into_place(_write_temporary(path, write), path, "", record=False)


def write_file(
    path: str | os.PathLike,
    write: Callable[[Path], Any],
    kind: str,
    *,
    force: bool = False,
    force_option: str = "--force",
    record: bool = True,
) -> Path:
    """Write ``path`` as ``kind`` by calling ``write(temporary_path)``, then rename it into place and record it.

    ``write`` writes the whole file to the temporary path it is given (in ``path``'s folder). The destination is
    checked first (:func:`check_destination`); a kill leaves the old file or the new one; a failure of the file system
    is a :class:`DestinationError` naming ``path``, and the temporary file is removed. ``record=False``: a file that
    is not linvit's product (e.g. the record itself). Returns ``path``.
    """
    path = Path(path)
    check_destination(path, kind, force=force, force_option=force_option)
    try:
        if not path.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no folder", str(path.parent))
        _rename_into_place(_write_temporary(path, write), path, kind, record)
    except OSError as error:
        raise _problem(path, error) from None
    return path


def move_into_place(
    temporary: str | os.PathLike,
    path: str | os.PathLike,
    kind: str,
    *,
    force: bool = False,
    force_option: str = "--force",
) -> Path:
    """Rename a complete file that a writer of linvit wrote under a temporary name in ``path``'s folder onto ``path``
    and record it as ``kind``, for writers that must name their file themselves (e.g. a checkpoint saved by Lightning
    on every rank). The destination is checked as by :func:`write_file`; on refusal or failure the temporary file is
    removed. Returns ``path``."""
    temporary, path = Path(temporary), Path(path)
    try:
        check_destination(path, kind, force=force, force_option=force_option)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        _rename_into_place(temporary, path, kind, record=True)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise _problem(path, error) from None
        raise
    return path


def prepare_folder(folder: str | os.PathLike) -> Path:
    """``folder`` created if missing; :class:`DestinationError` naming it when it is a file
    or cannot be created (read-only, under a file, disk full)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DestinationError(f"cannot write into '{folder}': it is a file, not a folder; name a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _problem(folder, error) from None
    return folder


def staging_folder(path: str | os.PathLike) -> Path:
    """A new hidden folder beside ``path`` (named like its temporary files) for a writer that writes several files
    at once under their final names (ONNX with external data); move them out with :func:`move_into_place`, then
    remove it. :func:`remove_own_temporaries` removes one a kill left behind."""
    path = Path(path)
    folder = _temporary_name(path)
    try:
        folder.mkdir()
    except OSError as error:
        raise _problem(path, error) from None
    return folder


def save_figure(
    figure: Any, path: str | os.PathLike, *, force: bool = False, kind: str = "plot", **options: Any
) -> Path:
    """``figure.savefig`` through :func:`write_file` (its folder created): the format from ``path``'s suffix (PNG
    without one), ``options`` to ``savefig`` (e.g. ``dpi``). Returns ``path``."""
    path = prepare_folder(Path(path).parent) / Path(path).name
    image_format = options.pop("format", None) or path.suffix[1:].lower() or "png"
    return write_file(
        path, lambda temporary: figure.savefig(temporary, format=image_format, **options), kind, force=force
    )


def write_text(path: str | os.PathLike, text: str, kind: str, *, force: bool = False) -> Path:
    """``text`` (UTF-8) to ``path`` through :func:`write_file`, its folder created. Returns ``path``."""
    path = prepare_folder(Path(path).parent) / Path(path).name
    return write_file(path, lambda temporary: temporary.write_text(text, encoding="utf-8"), kind, force=force)


def remove_own_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files (and :func:`staging_folder` folders) a killed writer left in ``folder``: hidden
    names ending in :data:`TEMPORARY_SUFFIX`, nobody else's file is touched. Call it when no writer of linvit is
    active in ``folder``. Returns what was removed."""
    removed = []
    folder = Path(folder)
    if folder.is_dir():
        for leftover in sorted(folder.glob(f".*{TEMPORARY_SUFFIX}")):
            with contextlib.suppress(OSError):
                if leftover.is_symlink():
                    continue
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                elif leftover.is_file():
                    leftover.unlink()
                else:
                    continue
                removed.append(leftover)
    return removed
