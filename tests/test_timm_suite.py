"""timm's own model test suite, run on every linvit model (``linvit_*``, ``flatten_*``).

timm's wheel ships no tests; its source distribution on PyPI does. The first run downloads the sdist pinned to the
installed timm version (``pip download --no-binary :all:``), extracts ``tests/test_models.py`` into the repository's
``.timm_tests/`` (git-ignored; never committed) and loads it with importlib. Its test functions are then called with
linvit's model names only, so timm's ~17k parametrized items are never collected.

Tiers (by parameter count, measured on the meta device at collection time):
- small models (<= ``FULL_SUITE_MAX_PARAMS``): every check in the default run;
- larger models: the meta-device cfg check and a small real forward by default, every other check ``slow``.

Filter by model with ``-k`` (``pytest tests/test_timm_suite.py -k flatten_swin``) and by check with its name
(``-k "fx_forward and linvit_nano"``). ``LINVIT_TIMM_TESTS`` may point at an already extracted ``test_models.py``
(for machines without package-index access); when neither works, every item is skipped with the reason.
``LINVIT_TIMM_SUITE_MODELS`` (comma-separated fnmatch patterns) replaces the default model patterns.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402

import linvit.models  # noqa: E402, F401  (registers the families with timm)

MODEL_PATTERNS = ("linvit_*", "flatten_*")
FULL_SUITE_MAX_PARAMS = 8_000_000
SMALL_FORWARD_SIZE = (80, 112)  # not a multiple of any window or stride: exercises pad-and-crop

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO_ROOT / ".timm_tests"
# timm's checks script models on purpose; torch's deprecation notice for torch.jit.script is noise here
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")

TIMM_MARKERS = (
    "base",
    "forward",
    "backward",
    "cfg",
    "cfg_nonstd",
    "torchscript",
    "features",
    "fxforward",
    "fxbackward",
)


# ----------------------------------------------------------------------------------------------------------------
# model discovery and tiers (collection time: cheap, meta device only)
# ----------------------------------------------------------------------------------------------------------------
def _model_patterns() -> list[str]:
    override = os.environ.get("LINVIT_TIMM_SUITE_MODELS", "").strip()
    if override:
        return [p.strip() for p in override.split(",") if p.strip()]
    return list(MODEL_PATTERNS)


def _model_names() -> list[str]:
    return sorted(set(timm.list_models(_model_patterns())))


def _meta_param_count(name: str) -> int | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = timm.create_model(name, pretrained=False, device="meta")
        return sum(p.numel() for p in model.parameters())
    except Exception:  # a broken model is reported by the tests themselves, not at collection
        return None


MODEL_NAMES = _model_names()
PARAM_COUNTS = {name: _meta_param_count(name) for name in MODEL_NAMES}
SMALL_MODELS = [n for n in MODEL_NAMES if PARAM_COUNTS[n] is not None and PARAM_COUNTS[n] <= FULL_SUITE_MAX_PARAMS]


def _params(names_small_only_default: bool, slow_above: int | None = None) -> list:
    """Model-name params; larger models are marked slow when the check is small-models-only by default, and models
    of more than ``slow_above`` parameters (each family's largest; its smaller ones stay) in any case."""
    if not MODEL_NAMES:
        return [pytest.param("<no linvit models registered>", marks=pytest.mark.skip(reason="no linvit models"))]
    params = []
    for name in MODEL_NAMES:
        large = slow_above is not None and (PARAM_COUNTS[name] is None or PARAM_COUNTS[name] > slow_above)
        default = (name in SMALL_MODELS or not names_small_only_default) and not large
        marks = [] if default else [pytest.mark.slow]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


# ----------------------------------------------------------------------------------------------------------------
# fetching and loading timm's test module
# ----------------------------------------------------------------------------------------------------------------
def _fetch_timm_tests(version: str) -> Path:
    """Path of timm's ``tests/test_models.py`` for ``version``, downloading the sdist once into ``.timm_tests/``."""
    explicit = os.environ.get("LINVIT_TIMM_TESTS")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"LINVIT_TIMM_TESTS={explicit} is not a file; point it at timm's test_models.py")
        return path
    target = CACHE_DIR / f"timm-{version}" / "test_models.py"
    if target.is_file():
        return target
    work = Path(tempfile.mkdtemp(prefix="timm_sdist_"))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet"]
        cmd += [f"timm=={version}", "-d", str(work)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        archives = sorted(work.glob("timm-*.tar.gz"))
        if result.returncode != 0 or not archives:
            raise RuntimeError(f"pip download of the timm {version} sdist failed: {result.stderr.strip()[-500:]}")
        with tarfile.open(archives[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith("/tests/test_models.py")]
            if not members:
                raise RuntimeError(f"the timm {version} sdist has no tests/test_models.py")
            source = tar.extractfile(members[0]).read()
        target.parent.mkdir(parents=True, exist_ok=True)
        # write then rename: several developers' runs may race to fill the cache
        partial = target.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(source)
        os.replace(partial, target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def timm_suite(pytestconfig):
    """timm's test_models module, imported under a private name with its markers registered."""
    for marker in TIMM_MARKERS:
        pytestconfig.addinivalue_line("markers", f"{marker}: timm test_models.py marker")
    try:
        path = _fetch_timm_tests(timm.__version__)
    except Exception as error:  # no package index, no sdist, ...
        pytest.skip(f"timm's test suite is unavailable ({error}); set LINVIT_TIMM_TESTS to its test_models.py")
    spec = importlib.util.spec_from_file_location("_timm_test_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timm_test(suite, name: str):
    fn = getattr(suite, name, None)
    if fn is None:
        pytest.skip(f"timm {timm.__version__}'s test_models.py has no {name}")
    return fn


def _cfg_device(suite) -> str:
    return "meta" if getattr(suite, "_HAS_DEVICE_CONTEXT", False) else "cpu"


def _has_spatial_features(name: str) -> bool:
    """Whether forward_features returns an NCHW/NHWC map (timm's "std" cfg test) rather than tokens ("non-std")."""
    try:
        model = timm.create_model(name, device="meta").eval()
        size = model.pretrained_cfg["input_size"]
        return model.forward_features(torch.empty(1, *size, device="meta")).ndim == 4
    except Exception:
        return True  # let the std test show the failure


# ----------------------------------------------------------------------------------------------------------------
# default for every model
# ----------------------------------------------------------------------------------------------------------------
# the default tier must stay under 15 minutes: the models above 30M parameters (13 of 24, every family keeps its
# smaller ones) check their configs in the slow tier
@pytest.mark.parametrize("model_name", _params(False, slow_above=30_000_000))
def test_timm_default_cfgs(timm_suite, model_name):
    """timm's config / API contract check (meta device: structure, shapes, device and dtype threading)."""
    if _has_spatial_features(model_name):
        _timm_test(timm_suite, "test_model_default_cfgs")(model_name, 1, _cfg_device(timm_suite))
    else:
        _timm_test(timm_suite, "test_model_default_cfgs_non_std")(model_name, 1, _cfg_device(timm_suite))


@pytest.mark.parametrize("model_name", _params(False, slow_above=30_000_000))  # as test_timm_default_cfgs
def test_small_forward(model_name):
    """A real forward at a small, odd, non-square size: finite logits of the right shape."""
    torch.manual_seed(0)
    model = timm.create_model(model_name, pretrained=False, num_classes=7).eval()
    in_chans = model.pretrained_cfg["input_size"][0]
    with torch.no_grad():
        out = model(torch.randn(1, in_chans, *SMALL_FORWARD_SIZE))
    assert out.shape == (1, 7)
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------------------------------------------
# every other timm check: default for small models, slow for the rest
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_name", _params(True))
def test_timm_forward(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_forward")(model_name, 1)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_backward(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_backward")(model_name, 2)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_torchscript(timm_suite, model_name):
    if any(fnmatch.fnmatch(model_name, p) for p in getattr(timm_suite, "EXCLUDE_JIT_FILTERS", ())):
        pytest.skip("excluded by timm's EXCLUDE_JIT_FILTERS")
    _timm_test(timm_suite, "test_model_forward_torchscript")(model_name, 1)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_forward_features(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_forward_features")(model_name, 1)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_forward_intermediates(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_forward_intermediates")(model_name, 1)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_forward_intermediates_features(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_forward_intermediates_features")(model_name, 1)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_prune_intermediate_layers_contract(timm_suite, model_name):
    _timm_test(timm_suite, "test_prune_intermediate_layers_contract")(model_name)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_fx_forward(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_forward_fx")(model_name, 1)


@pytest.mark.parametrize("model_name", _params(True))
def test_timm_fx_backward(timm_suite, model_name):
    _timm_test(timm_suite, "test_model_backward_fx")(model_name, 2)
