"""Reading and writing files nobody vouched for, and checkpoint I/O; shared by the model families, ``linvit.dense``,
``linvit.train`` and the ``linvit`` commands.

- :mod:`~linvit.io.safe_load`: :func:`load_checkpoint_file` reads ``.pth`` / ``.pt`` / ``.bin`` / ``.safetensors``
  files without running code from them (pickled training configs come back inert; anything else is refused unless
  ``trusted=True``); :mod:`~linvit.io.pickle_scan` says what an unreadable or refused file holds;
- :mod:`~linvit.io.state_dict`: the weights inside a checkpoint (training-checkpoint entries, EMA, wrapper prefixes)
  and how a state dict differs from a model's;
- :mod:`~linvit.io.pretrained`: a weight file into a timm model (``load_pretrained``, the ``trusted`` opt-in of
  ``timm.create_model``); :mod:`~linvit.io.families`: the registered variants a file may fit instead;
- :mod:`~linvit.io.integrity`: :func:`verify_file`, run before every load: zip CRC-32s, safetensors headers, recorded
  SHA-256s (:class:`DamagedCheckpointError` names the file and the entry);
- :mod:`~linvit.io.finite`: weights with NaN/Inf named (:func:`check_finite_weights`), and the opt-out;
- :mod:`~linvit.io.destination`: every file linvit writes (temporary name, rename, a record of what it wrote and its
  SHA-256; a file it did not write is replaced only with ``--force``);
- :mod:`~linvit.io.bounded`: JSON/YAML from untrusted files, bounded in size and nesting, plain data only;
  :mod:`~linvit.io.allowed_config`: the keys and value types a ``config.json`` or saved config may set;
- :mod:`~linvit.io.images`: the one image loader (regular files only, pixel and aspect limits from the header,
  non-finite float pixels refused);
- :mod:`~linvit.io.errors`: :class:`CheckpointError` (a ValueError), :class:`UntrustedCheckpointError` and
  :class:`UntrustedConfigError`; every error that names what a file holds prints as one line (``OneLineError``:
  a separator or control character in a hostile key or file name is shown escaped).

Imports torch, timm and safetensors only (no other room of linvit).
"""

from linvit._lazy import lazy_exports

# name -> the submodule defining it; imported on first use (PEP 562), so that a light submodule such as
# linvit.io.destination or linvit.io.bounded costs no torch import (the `linvit --help` of the console script)
_EXPORTS = {
    "CheckpointError": "errors",
    "UntrustedCheckpointError": "errors",
    "family_models": "families",
    "model_family": "families",
    "NonFiniteWeightsError": "finite",
    "allow_non_finite_weights": "finite",
    "check_finite_weights": "finite",
    "DamagedCheckpointError": "integrity",
    "verify_file": "integrity",
    "build_model_loading_safely": "pretrained",
    "load_pretrained_file": "pretrained",
    "route_pretrained_to_model": "pretrained",
    "check_checkpoint_intact": "safe_load",
    "load_checkpoint_file": "safe_load",
    "describe_mismatch": "state_dict",
    "extract_model_state_dict": "state_dict",
    "state_dict_mismatch": "state_dict",
    "strip_wrapper_prefixes": "state_dict",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("linvit.io", _EXPORTS)
