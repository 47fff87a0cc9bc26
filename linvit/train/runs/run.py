"""The training entry behind ``train.py``: build everything from a Hydra config, fit, test, export.

This is the one module of :mod:`linvit` that uses Hydra (``hydra.utils.instantiate``); the rest of
:mod:`linvit.train` is plain Lightning and can be used without configs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from linvit.train.runs.config_types import ConfigValueError

_log = logging.getLogger("linvit.train")


class RunDirectoryGuard(Callback):
    """Hydra callback (``configs/hydra/default.yaml``): one ``python train.py`` per run directory.

    Before Hydra creates the run directory and writes ``.hydra/`` into it: a timestamped ``run_name`` (the default)
    becomes one that no other run has (``<time>``, else ``<time>_1`` ...), and the directory is locked for the life
    of the process, so that a second process with the same explicit ``run_name`` is refused at once (exit status 1,
    the message on stderr) instead of writing into a running run. The other processes of a multi-process run (DDP
    ranks) share rank 0's directory.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from omegaconf import open_dict, read_write

        from linvit.io.destination import refuse_os_error
        from linvit.train.runs.run_dir import (
            RunDirectoryInUseError,
            claim_new_directory,
            hold_run_directory,
            is_first_process,
        )

        if not is_first_process():
            return
        run_dir = Path(str(config.hydra.run.dir))
        # Hydra turns a callback's exceptions into warnings and goes on; SystemExit stops it before it writes
        try:
            with read_write(config), open_dict(config):
                timestamped = "${now:" in str(config._get_node("run_name")._value())
                if timestamped and run_dir.name == str(config.run_name):
                    config.run_name = claim_new_directory(run_dir.parent, run_dir.name).name
                    run_dir = Path(str(config.hydra.run.dir))
            hold_run_directory(run_dir)
        except RunDirectoryInUseError as error:
            raise SystemExit(f"error: {error}") from None
        except OSError as error:  # a log folder that is read-only, under a file, on a full disk: one line naming it
            raise SystemExit(f"error: {refuse_os_error(error.filename or run_dir, error)}") from None


def _instantiate_all(section: DictConfig | None) -> list[Any]:
    """Instantiate every entry with a ``_target_`` in a config group such as ``callbacks`` or ``logger`` (targets of
    classes that moved updated first)."""
    from hydra.utils import instantiate

    if not section:
        return []
    entries = [entry for entry in section.values() if isinstance(entry, DictConfig) and "_target_" in entry]
    for entry in entries:
        _update_renamed_targets(entry)
    return [instantiate(entry) for entry in entries]


def _update_renamed_targets(node: Any) -> None:
    """A ``_target_`` a class had before it moved (a config written then) becomes the class's name now, with a
    warning that says which line to change (:data:`linvit.train.runs.saved_run.RENAMED_TARGETS`)."""
    from linvit.train.runs.saved_run import current_target

    if not isinstance(node, DictConfig):
        return
    for key in list(node.keys()):
        child = node._get_node(key)  # unresolved: a mandatory "???" elsewhere is not this function's to raise
        if isinstance(child, DictConfig):
            _update_renamed_targets(child)
        elif key == "_target_" and current_target(child._value()) != child._value():
            _log.warning("_target_: %s has moved: write _target_: %s", child._value(), current_target(child._value()))
            node[key] = current_target(child._value())


def _instantiate_plain(section: DictConfig, name: str) -> Any:
    """``instantiate`` with plain Python arguments; a ValueError/TypeError of the target comes out unwrapped, as a
    :class:`ConfigValueError` with the target's own message.

    Hydra wraps every error of the target in ``InstantiationException``; the target's own message (what was
    wrong, how to fix it) is what a user of ``train.py`` needs to see first. Targets of classes that moved are
    updated first.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    _update_renamed_targets(section)
    try:
        return instantiate(section, _convert_="all")
    except InstantiationException as error:
        if isinstance(error.__cause__, (ValueError, TypeError)):
            raise ConfigValueError(_name_the_keys(str(error.__cause__), section, name)) from error.__cause__
        if isinstance(error.__cause__, FileNotFoundError):
            raise error.__cause__ from None
        raise


def _name_the_keys(message: str, section: DictConfig, name: str) -> str:
    """The class names its argument (``drop_path_rate=-1``); the user set a config key
    (``model.model_kwargs.drop_path_rate``): the message starts with the keys it is about, unless it names them."""
    import re

    def leaves(node: Any, prefix: str) -> Iterator[str]:
        for key, value in node.items() if isinstance(node, dict) else ():
            yield from leaves(value, f"{prefix}.{key}") if isinstance(value, dict) else (f"{prefix}.{key}",)

    plain = OmegaConf.to_container(section, resolve=False)
    keys = [key for key in leaves(plain, name) if re.search(rf"\b{re.escape(key.rsplit('.', 1)[1])}=", message)]
    if not keys or any(key in message for key in keys):
        return message
    return f"{', '.join(keys)}: {message}"


def _check_model_matches_data(model: Any, datamodule: Any) -> None:
    """The model's class count and input channels must be the data's (the configs link them; an override may not)."""
    hparams = getattr(model, "hparams", {})
    for key in ("num_classes", "in_chans"):
        built, data = hparams.get(key), getattr(datamodule, key, None)
        if built is not None and data is not None and int(built) != int(data):
            raise ConfigValueError(
                f"model.{key}={built} but the data has {key}={data}: drop the model.{key} override (it follows "
                f"data.{key} by default) or set both to the same value."
            )


def _choose_img_size(cfg: DictConfig, datamodule: Any) -> None:
    """``data.img_size=auto``: the DataModule picks it from the images, rounded to the model's stride, before the
    model is built (the model config reads ``${data.img_size}``); the saved config.yaml holds the number."""
    if not getattr(datamodule, "img_size_is_auto", False):
        return
    from linvit.train.data.auto_size import DEFAULT_MULTIPLE, model_stride

    model_cfg = cfg.get("model") or {}
    name, kwargs = model_cfg.get("model_name"), model_cfg.get("model_kwargs")
    kwargs = OmegaConf.to_container(kwargs, resolve=True) if isinstance(kwargs, DictConfig) else kwargs
    stride = model_stride(str(name), kwargs) if name else DEFAULT_MULTIPLE
    cfg.data.img_size = datamodule.choose_img_size(stride)


def _choose_auto_values(cfg: DictConfig, datamodule: Any) -> None:
    """The ``auto`` values of folder data (``data.num_classes``, ``batch_size``, ``drop_last``, the augmentation) and
    ``trainer.max_epochs=auto``, chosen before the model and the trainer are built and written into ``cfg`` (so the
    run's saved config.yaml holds the numbers); each is logged with its reason (:mod:`linvit.train.data.auto_recipe`).
    """
    from linvit.train.data.auto_recipe import (
        EPOCHS_OF_KNOWN_DATA,
        MIN_AUTO_EPOCHS,
        TARGET_STEPS,
        auto_max_epochs,
        steps_per_epoch,
    )
    from linvit.train.data.folder_scan import FolderLayoutError

    processes = _processes(cfg.trainer)
    saved = _saved_choices(cfg)
    # before a resume takes the saved batch (and drops "batch_size" from auto_options): its lr is scaled as at first
    batch_is_auto = "batch_size" in getattr(datamodule, "auto_options", ())
    if hasattr(datamodule, "take_chosen_values") and saved:
        data = saved.get("data") if isinstance(saved.get("data"), dict) else {}
        for key, value in datamodule.take_chosen_values(data, "as the run chose when it began: resuming").items():
            cfg.data[key] = value
    if hasattr(datamodule, "choose_num_classes"):
        try:
            cfg.data.num_classes = datamodule.choose_num_classes()
        except FolderLayoutError:
            raise
        except ValueError as error:  # a number given that disagrees with the folders: both named
            raise ConfigValueError(str(error)) from None
        batch_size, drop_last = datamodule.choose_batch_size(processes, even_batches=_mixup_on(cfg.get("model")))
        cfg.data.batch_size, cfg.data.drop_last = batch_size, drop_last
        if batch_is_auto:
            _scale_lr_to_the_auto_batch(cfg, batch_size * processes)
        for key, value in datamodule.choose_augmentation().items():
            cfg.data[key] = value
    if cfg.trainer.get("max_epochs") != "auto":
        return
    auto = cfg.get("auto") or {}
    before = (saved.get("trainer") or {}).get("max_epochs") if isinstance(saved.get("trainer"), dict) else None
    if isinstance(before, int) and not isinstance(before, bool) and before > 0:
        epochs, reason = before, "as the run chose when it began: resuming"
    elif hasattr(datamodule, "training_images"):
        images = datamodule.training_images()
        steps = steps_per_epoch(images, datamodule.batch_size * processes, datamodule.drop_last)
        target_steps, min_epochs = auto.get("target_steps", TARGET_STEPS), auto.get("min_epochs", MIN_AUTO_EPOCHS)
        epochs, reason = auto_max_epochs(steps, int(target_steps), int(min_epochs))
    else:  # data of a known size, with a tuned recipe
        epochs = int(auto.get("epochs", EPOCHS_OF_KNOWN_DATA))
        reason = f"auto.epochs for {type(datamodule).__name__}, whose size the recipe knows"
    cfg.trainer.max_epochs = epochs
    _log.info("trainer.max_epochs=auto: %d (%s)", epochs, reason)


def _choose_stem_stride(cfg: DictConfig, datamodule: Any) -> None:
    """``auto.small_image_stem``: on folder data, a linvit model (``LinViT``) whose ``model.model_kwargs`` do not set
    ``stem_stride`` takes the stem for the input size (:func:`~linvit.train.data.auto_recipe.auto_stem_stride`),
    written into them so that config.yaml, the checkpoints and config.json record it. A run that loads a checkpoint
    (resume, ``ckpt_path``) builds the stem it was trained with: its hyper-parameters' value, or the model's own."""
    from omegaconf import open_dict

    from linvit.train.data.auto_recipe import auto_stem_stride

    model_cfg = cfg.get("model") or {}
    kwargs = model_cfg.get("model_kwargs")
    if not (cfg.get("auto") or {}).get("small_image_stem", False) or not hasattr(datamodule, "choose_num_classes"):
        return
    if not isinstance(kwargs, DictConfig) or "stem_stride" in kwargs or not _builds_linvit(model_cfg.get("model_name")):
        return
    checkpoint = _checkpoint_to_load(cfg)
    if checkpoint is not None:
        stride = _trained_model_kwargs(checkpoint).get("stem_stride")
        stride = stride if type(stride) is int and stride in (2, 4) else None  # the file's word, checked
        if stride is not None:
            with open_dict(kwargs):
                kwargs.stem_stride = stride
        _log.info("model.model_kwargs.stem_stride: %s, as %s was trained", stride or "the model's own", checkpoint)
        return
    choice = auto_stem_stride(OmegaConf.to_container(cfg.data, resolve=True)["img_size"])
    with open_dict(kwargs):
        kwargs.stem_stride = choice.value
    _log.info("model.model_kwargs.stem_stride=%d (auto.small_image_stem: %s)", choice.value, choice.reason)


def _builds_linvit(model_name: Any) -> bool:
    """``model_name`` is a registered model of linvit's own family (``LinViT``)."""
    from linvit.io.allowed_config import registered_model_class
    from linvit.models.linvit import LinViT

    model_cls = registered_model_class(model_name) if isinstance(model_name, str) else None
    return model_cls is not None and issubclass(model_cls, LinViT)


def _checkpoint_to_load(cfg: DictConfig) -> Path | None:
    """The checkpoint this run will load (``ckpt_path``, or the run's ``last.ckpt`` when it resumes and it exists),
    unchecked: :func:`resolve_ckpt_path` checks it before anything loads it."""
    if cfg.get("ckpt_path"):
        return Path(str(cfg.ckpt_path)).expanduser()
    last = Path(str(cfg.paths.output_dir)) / "checkpoints" / "last.ckpt"
    return last if cfg.get("resume", True) and last.is_file() else None


def _trained_model_kwargs(path: Path) -> dict[str, Any]:
    """The ``model_kwargs`` a checkpoint's hyper-parameters hold; empty when it has none or cannot be read here
    without running code from it (:func:`resolve_ckpt_path` names the problem, or loads a trusted file)."""
    from linvit.train.runs.export import load_checkpoint

    try:
        checkpoint = load_checkpoint(path, opt_in="trust_checkpoint=true", mmap=True)
    except Exception:  # noqa: BLE001 - refused or damaged: resolve_ckpt_path raises it in one line
        return {}
    kwargs = (checkpoint.get("hyper_parameters") or {}).get("model_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else {}


def _scale_lr_to_the_auto_batch(cfg: DictConfig, effective_batch: int) -> None:
    """``model.optimizer.lr`` for an auto batch: the configured rate is for ``auto.lr_batch`` images (timm's square
    root rule for adaptive optimizers, linear for SGD; :func:`~linvit.train.data.auto_recipe.auto_batch_lr`), written
    into ``cfg`` and logged. Left as given where ``auto.lr_batch`` is null or ``lr_base_size`` scales it already."""
    from linvit.train.data.auto_recipe import auto_batch_lr

    lr_batch = (cfg.get("auto") or {}).get("lr_batch")
    optimizer = (cfg.get("model") or {}).get("optimizer")
    if not lr_batch or not optimizer or optimizer.get("lr") is None or optimizer.get("lr_base_size"):
        return
    choice = auto_batch_lr(float(optimizer.lr), effective_batch, int(lr_batch), str(optimizer.get("opt", "adamw")))
    optimizer.lr = choice.value
    _log.info("model.optimizer.lr for the auto batch: %.3g (%s)", choice.value, choice.reason)


def _saved_choices(cfg: DictConfig) -> dict[str, Any]:
    """The saved config.yaml of the run this one resumes in its own directory (``resume: true`` and its
    ``last.ckpt``), read within bounds, as plain data; empty otherwise (or when it cannot be read: chosen again)."""
    from linvit.io.bounded import read_yaml

    output_dir = Path(str(cfg.paths.output_dir))
    if cfg.get("ckpt_path") or not cfg.get("resume", True) or not (output_dir / "checkpoints" / "last.ckpt").is_file():
        return {}
    try:
        saved = read_yaml(output_dir / "config.yaml", what="run config")
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _processes(trainer_cfg: DictConfig) -> int:
    """Devices x nodes x gradient accumulation: the factor from a DataModule's batch to the optimizer's (devices
    other than a number or a list of them count as one)."""
    devices = trainer_cfg.get("devices", 1)
    count = len(devices) if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices) else devices
    count = count if isinstance(count, int) and count > 0 else 1
    nodes = trainer_cfg.get("num_nodes", 1)
    accumulate = trainer_cfg.get("accumulate_grad_batches", 1)
    return count * (nodes if isinstance(nodes, int) and nodes > 0 else 1) * (accumulate if accumulate > 0 else 1)


def _mixup_on(model_cfg: Any) -> bool:
    """Mixup or cutmix configured (they need even batches)."""
    mixup = (model_cfg or {}).get("mixup") or {}
    return bool(mixup.get("mixup_alpha", 0) or mixup.get("cutmix_alpha", 0))


def _sync_batchnorm_only_on_gpus(trainer_cfg: DictConfig) -> None:
    """``trainer=ddp`` syncs BatchNorm statistics across GPUs; on the CPU (gloo) Lightning refuses it: turn it off.

    So that ``trainer=ddp trainer.accelerator=cpu`` runs as documented; the saved config.yaml says what ran.
    """
    if not trainer_cfg.get("sync_batchnorm", False):
        return
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda"):
        return
    if accelerator == "auto":
        import torch

        if torch.cuda.is_available():
            return
    _log.info("trainer.sync_batchnorm=true needs GPUs: off for accelerator=%s (per-process statistics)", accelerator)
    trainer_cfg.sync_batchnorm = False


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """The checkpoint to resume from: ``ckpt_path`` if given, else (``resume: true``) the run's ``last.ckpt``.

    The file is read before anything is built: an empty, truncated or corrupt one raises
    :class:`~linvit.io.CheckpointError` naming it (for the run's own ``last.ckpt``, with the run's other checkpoint
    to resume from instead). Unless ``trust_checkpoint``, its saved hyper-parameters are checked like any saved
    config (see :mod:`linvit.utils.saved_config`): a file that asks to build other classes is refused before
    training.
    """
    from linvit.io import CheckpointError

    path = _checkpoint_to_load(cfg)
    if path is None:
        return None
    if not path.is_file():
        raise CheckpointError(f"ckpt_path={cfg.ckpt_path} is not a file; give a .ckpt written by a run.")
    try:
        _check_checkpoint(path, trusted=bool(cfg.get("trust_checkpoint", False)))
    except CheckpointError as error:
        if cfg.get("ckpt_path"):
            raise
        raise type(error)(f"{str(error).rstrip('.')}. {_fall_back_advice(path)}") from None
    return str(path)


def _check_checkpoint(path: Path, trusted: bool) -> None:
    """Read the checkpoint (memory-mapped) and refuse one whose hyper-parameters name callables outside linvit's
    allow-list; a trusted one is only checked to be intact (loading it would run its code twice)."""
    from linvit.io import check_checkpoint_intact
    from linvit.train.runs.export import load_checkpoint
    from linvit.utils.saved_config import check_targets

    if trusted:
        check_checkpoint_intact(path)
        return
    checkpoint = load_checkpoint(path, opt_in="trust_checkpoint=true", mmap=True)
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        check_targets(checkpoint.get(key) or {}, path, opt_in="trust_checkpoint=true", prefix=key, allowed=frozenset())


def _fall_back_advice(last: Path) -> str:
    """What to do about a damaged ``last.ckpt``: resume from the newest other intact checkpoint of the run, or
    start over."""
    from linvit.io import CheckpointError, check_checkpoint_intact

    others = sorted(
        (other for other in last.parent.glob("*.ckpt") if other != last and other.is_file()),
        key=lambda other: other.stat().st_mtime,
        reverse=True,
    )
    for other in others:
        try:
            check_checkpoint_intact(other)
        except CheckpointError:
            continue
        return (
            f"To resume from the run's newest other checkpoint, run again with ckpt_path={other}; to start the "
            f"run over, move {last.name} out of {last.parent}."
        )
    return f"The run has no other checkpoint: to start it over, move {last.name} out of {last.parent}."


def train(cfg: DictConfig, callbacks: list[Any] | None = None) -> dict[str, float]:
    """Fit (``cfg.train``), test (``cfg.test``) and export (``cfg.export``) as configured; returns the metrics.

    ``callbacks``: Lightning callbacks added to those of ``cfg.callbacks`` (for programmatic use and tests).
    The run directory (``paths.output_dir``) is locked meanwhile: a second process that runs in it is refused with
    :class:`linvit.train.runs.run_dir.RunDirectoryInUseError` (see :mod:`linvit.train.runs.run_dir`). Values of the
    wrong type are refused first, before anything is built
    (:func:`linvit.train.runs.config_types.check_config_types`).
    """
    from linvit.io.destination import prepare_folder
    from linvit.train.runs.config_types import check_config_types
    from linvit.train.runs.run_dir import is_first_process, run_directory_lock
    from linvit.train.runs.run_identity import register_resolvers

    register_resolvers()  # task_name in the saved config.yaml
    check_config_types(cfg)
    output_dir = Path(str(cfg.paths.output_dir))
    if is_first_process():
        prepare_folder(output_dir)  # one line naming it when it cannot be made (under a file, read-only, disk full)
    with run_directory_lock(output_dir) if is_first_process() else contextlib.nullcontext():
        try:
            return _fit_test_export(cfg, callbacks)
        finally:
            leave_process_group()


def leave_process_group() -> None:
    """Destroy the process group a DDP run joined, if any.

    Lightning destroys only NCCL groups at exit. A gloo group (DDP on the CPU) left to the interpreter's shutdown can
    abort the process as it exits ("terminate called without an active exception", exit status -6) after a run
    that succeeded.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _fit_test_export(cfg: DictConfig, callbacks: list[Any] | None) -> dict[str, float]:
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from linvit.io.destination import prepare_folder, write_file

    started = time.perf_counter()
    _route_lightning_logs_to_root()
    if cfg.get("seed") is not None:
        pl.seed_everything(int(cfg.seed), workers=True)
    output_dir = prepare_folder(Path(str(cfg.paths.output_dir)))

    # plain Python containers (no omegaconf ListConfig) in the hyper-parameters, so checkpoints load weights_only
    datamodule: pl.LightningDataModule = _instantiate_plain(cfg.data, "data")
    _choose_img_size(cfg, datamodule)
    _choose_auto_values(cfg, datamodule)
    _choose_stem_stride(cfg, datamodule)
    model: pl.LightningModule = _instantiate_plain(cfg.model, "model")
    _check_model_matches_data(model, datamodule)
    callbacks = _instantiate_all(cfg.get("callbacks")) + list(callbacks or [])
    loggers = _instantiate_all(cfg.get("logger"))
    _sync_batchnorm_only_on_gpus(cfg.trainer)
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    if trainer.is_global_zero:
        text = OmegaConf.to_yaml(cfg, resolve=True)
        write_file(output_dir / "config.yaml", lambda tmp: tmp.write_text(text), "run-config", force=True)
    metrics: dict[str, float] = {}
    ckpt_path = resolve_ckpt_path(cfg)
    trusted = bool(cfg.get("trust_checkpoint", False))
    if cfg.get("train", True):
        with warnings.catch_warnings():
            if ckpt_path:  # verified by resolve_ckpt_path before anything was built
                _log.info("resuming from %s (%s)", ckpt_path, _how_loaded(ckpt_path, trusted))
                # a resumed run appends to its metrics.csv and keeps its checkpoints: nothing is deleted
                warnings.filterwarnings("ignore", message=r"(Experiment logs|Checkpoint) directory .* not empty")
            with _refuse_untrusted(ckpt_path):
                trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=not trusted)
        metrics.update(_floats(trainer.callback_metrics))

    best = _best_checkpoint(trainer)
    if cfg.get("test", True):
        if cfg.get("train", True):
            test_ckpt = best or None
            if test_ckpt is None:
                _log.warning("no best checkpoint found: testing the current weights")
        else:
            test_ckpt = ckpt_path
        if test_ckpt:  # Lightning's own load checks no CRC: verified here first
            _log.info("testing %s (%s)", test_ckpt, _how_loaded(test_ckpt, trusted))
        else:
            _log.info("testing the current weights")
        with _refuse_untrusted(test_ckpt):
            results = trainer.test(model, datamodule=datamodule, ckpt_path=test_ckpt, weights_only=not trusted)
        for result in results:
            metrics.update(_floats(result))

    export_cfg = cfg.get("export") or {}
    if export_cfg.get("enabled", False) and trainer.is_global_zero and not _exportable(model):
        _log.info("export skipped: %s is not an ImageClassifier (set export.enabled=false)", type(model).__name__)
    elif export_cfg.get("enabled", False) and trainer.is_global_zero:
        from linvit.train.runs.export import export_checkpoint

        source = best or str(output_dir / "checkpoints" / "last.ckpt")
        if Path(source).is_file():
            # the run's own folder (an older linvit wrote its files without a record): force
            exported = export_checkpoint(source, output_dir, ema=bool(export_cfg.get("ema", False)), force=True)
            _log.info("exported %s (from %s)", exported, Path(source).name)
        else:
            _log.warning("nothing to export: no checkpoint in %s", output_dir / "checkpoints")

    if hasattr(datamodule, "skipped_files"):  # unreadable images skipped (data.bad_files=skip), for the summary
        metrics["data/skipped_files"] = float(len(datamodule.skipped_files()))
    metrics["time/total_s"] = time.perf_counter() - started
    if trainer.is_global_zero:
        text = json.dumps(metrics, indent=2, sort_keys=True) + "\n"
        write_file(output_dir / "metrics.json", lambda tmp: tmp.write_text(text), "metrics", force=True)
    return metrics


def _how_loaded(path: str, trusted: bool) -> str:
    """Verify a checkpoint given to Lightning (:func:`linvit.io.verify_file`; once per file as it is) and say how it
    is read, for the log line that names it."""
    from linvit.io import verify_file

    checked = verify_file(path)
    how = "torch.load(weights_only=False): trust_checkpoint=true" if trusted else "torch.load(weights_only=True)"
    return f"verified: {checked}; {how}"


@contextlib.contextmanager
def _refuse_untrusted(path: str | None) -> Iterator[None]:
    """Checkpoints load with ``weights_only=True``: turn the loader's refusal into an error naming the opt-in."""
    try:
        yield
    except pickle.UnpicklingError as error:
        from linvit.train.runs.export import untrusted_checkpoint_error

        raise untrusted_checkpoint_error(path, error, "trust_checkpoint=true") from error


def _exportable(model: Any) -> bool:
    from linvit.train.modules.classification import ImageClassifier

    return isinstance(model, ImageClassifier)


def _route_lightning_logs_to_root() -> None:
    """Under Hydra the root logger prints to the console and train.log: stop Lightning printing twice."""
    if not logging.getLogger().handlers:
        return
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
        logger.propagate = True


def _best_checkpoint(trainer: Any) -> str:
    callback = getattr(trainer, "checkpoint_callback", None)
    path = getattr(callback, "best_model_path", "") if callback is not None else ""
    return path if path and Path(path).is_file() else ""


def _floats(values: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def summarize(cfg: DictConfig, metrics: dict[str, float]) -> str:
    """A few lines for the console: test accuracy (raw and EMA weights), time, where the run's files are."""
    lines = [f"run directory: {cfg.paths.output_dir}"]
    for prefix, label in (("test", "test"), ("test_ema", "test (EMA weights)")):
        if f"{prefix}/acc1" in metrics:
            lines.append(
                f"{label}: top-1 {100 * metrics[f'{prefix}/acc1']:.2f}%  top-5 {100 * metrics[f'{prefix}/acc5']:.2f}%"
                f"  loss {metrics[f'{prefix}/loss']:.4f}"
            )
    if len(lines) == 1:  # another task (e.g. segmentation): list its test metrics
        lines += [f"{key}: {value:.4f}" for key, value in sorted(metrics.items()) if key.startswith("test")]
    if metrics.get("data/skipped_files"):
        lines.append(
            f"data: {int(metrics['data/skipped_files'])} unreadable image file(s) skipped, named in the log "
            "(data.bad_files=error stops on them)"
        )
    lines.append(f"wall time: {metrics.get('time/total_s', float('nan')):.1f} s")
    return "\n".join(lines)
