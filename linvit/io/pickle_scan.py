"""What a checkpoint file holds, read without running anything: its pickle stream's protocol and named globals,
and what its first bytes say it is. These make the refusals and read errors of :mod:`linvit.io.safe_load` precise."""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path
from typing import Any

from linvit.io.errors import UntrustedCheckpointError

__all__ = ["describe_contents", "refusal_reason", "scan_pickle", "unsupported_protocol_error"]

# Globals a plain torch state dict refers to (tensor rebuilding, OrderedDict): named without alarm.
_SAFE_GLOBAL_PREFIXES = ("torch.", "collections.OrderedDict", "builtins.", "_codecs.encode", "numpy.")

# Phrases of PyTorch's safe unpickler when it refuses an object (rather than failing on a damaged file).
_REFUSAL_MARKERS = (
    "unsupported global",
    "trying to call reduce",
    "can only create new object",
    "can only build",
    "whose module",
)


def _pickle_bytes(path: Path) -> bytes | None:
    """The pickle stream of a torch checkpoint (``*/data.pkl`` inside the zip, or the legacy file itself)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = [name for name in archive.namelist() if name.endswith("data.pkl")]
                return archive.read(names[0]) if names else None
        return path.read_bytes()
    except (OSError, zipfile.BadZipFile, KeyError):
        return None


def scan_pickle(data: bytes) -> tuple[int | None, list[str], bool]:
    """Protocol, ``module.name`` globals and completeness (a STOP reached) of a pickle stream, parsed with
    pickletools (nothing is executed).

    ``STACK_GLOBAL`` (protocol 4+) takes its names from the two strings pushed before it (directly or via the memo).
    """
    protocol: int | None = None
    complete = False
    found: list[str] = []
    strings: list[str] = []
    memo: dict[int, Any] = {}
    last: Any = None
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name == "PROTO":
                protocol = int(arg)
            elif name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif name == "STOP":
                complete = True
                break
            if isinstance(arg, str) and "UNICODE" in name:
                strings.append(arg)
                last = arg
            elif name == "MEMOIZE":
                memo[len(memo)] = last
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = last
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                last = memo.get(int(arg))
                if isinstance(last, str):
                    strings.append(last)
            else:
                last = None
    except Exception:  # a truncated stream: report what was read
        pass
    return protocol, list(dict.fromkeys(found)), complete


def refusal_reason(error: BaseException) -> str | None:
    """The line of a safe-loader error that says which object it refused, or None when the file is just corrupt."""
    for line in str(error).splitlines():
        if any(marker in line.lower() for marker in _REFUSAL_MARKERS):
            return line.strip()
    return None


def unsupported_protocol_error(path: Path, error: BaseException) -> UntrustedCheckpointError | None:
    """PyTorch's safe unpickler reads pickle protocols 2-3 only: it stops at the first protocol-4 opcode (FRAME,
    STACK_GLOBAL, ...) with "Unsupported operand". Such a file cannot be checked safely, whatever it holds."""
    if "unsupported operand" not in str(error).lower():
        return None
    data = _pickle_bytes(path)
    protocol, names, complete = scan_pickle(data) if data is not None else (None, [], False)
    if not complete:  # not a whole pickle (text, a cut file): corrupt, not a protocol matter
        return None
    unsafe = [name for name in names if not name.startswith(_SAFE_GLOBAL_PREFIXES)]
    if unsafe:
        named = f"It names Python objects the safe loader would refuse: {', '.join(unsafe[:8])}."
    else:
        named = "It names no objects beyond tensors and plain containers, but that cannot be verified by loading."
    saved_with = f"pickle protocol {protocol}" if protocol is not None else "a newer pickle protocol"
    opcode = next((line.strip() for line in str(error).splitlines() if "nsupported operand" in line), "")
    return UntrustedCheckpointError(
        f"Refusing to load '{path}': it was saved with {saved_with}, which PyTorch's safe loader cannot read (it "
        f"supports protocols 2-3; it stopped at: {opcode}). {named} Nothing from it was executed. If you trust "
        "this file and its source, load it with trusted=True (runs arbitrary code from the file), or re-save it "
        "once in a trusted environment with "
        "`torch.save(state_dict, path)` (default protocol) or `linvit convert SRC DST.safetensors --trusted`."
    )


def describe_contents(path: Path) -> str:
    """What the first bytes of an unreadable file say it is (read only, nothing is parsed or run)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
    except OSError:
        return "it could not be read"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (PyTorch's format) that is incomplete or damaged, e.g. a download or save cut short"
    if head[:1] == b"\x80":
        return "a pickle stream that is incomplete or damaged"
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        return "a safetensors file (name it *.safetensors) or a damaged one"
    text = head.decode("utf-8", errors="ignore")  # a character cut at byte 64 is dropped
    if text.startswith("version https://git-lfs"):
        return "a Git LFS pointer, not the weights: fetch them with `git lfs pull`"
    if text.lstrip().lower().startswith(("<!doctype html", "<html")):
        return "an HTML page, not weights (a download that saved an error or login page?)"
    if text and all(char.isprintable() or char in "\t\n\r" for char in text):
        return f"text, not a checkpoint (it starts with {text.splitlines()[0][:40]!r})"
    return "not a PyTorch checkpoint (neither a zip archive nor a pickle)"
