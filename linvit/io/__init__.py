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

from linvit.io.errors import CheckpointError, UntrustedCheckpointError
from linvit.io.families import family_models, model_family
from linvit.io.finite import NonFiniteWeightsError, allow_non_finite_weights, check_finite_weights
from linvit.io.integrity import DamagedCheckpointError, verify_file
from linvit.io.pretrained import build_model_loading_safely, load_pretrained_file, route_pretrained_to_model
from linvit.io.safe_load import check_checkpoint_intact, load_checkpoint_file
from linvit.io.state_dict import (
    describe_mismatch,
    extract_model_state_dict,
    state_dict_mismatch,
    strip_wrapper_prefixes,
)

__all__ = [
    "CheckpointError",
    "DamagedCheckpointError",
    "NonFiniteWeightsError",
    "UntrustedCheckpointError",
    "allow_non_finite_weights",
    "build_model_loading_safely",
    "check_checkpoint_intact",
    "check_finite_weights",
    "describe_mismatch",
    "extract_model_state_dict",
    "family_models",
    "load_checkpoint_file",
    "load_pretrained_file",
    "model_family",
    "route_pretrained_to_model",
    "state_dict_mismatch",
    "strip_wrapper_prefixes",
    "verify_file",
]
