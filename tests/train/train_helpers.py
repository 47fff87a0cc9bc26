"""Helpers for the training tests: compose the real configs with tiny, fast overrides."""

from __future__ import annotations

from pathlib import Path

from linvit.train.runs.hydra_app import config_dir

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = config_dir()  # the configs linvit ships (linvit/configs: in a checkout, the link to configs/)

# A tiny timm model that works at 16 px: keeps these tests independent of the linvit models in progress.
TINY_TIMM = ["model=timm", "model.model_name=test_resnet"]
FAST = [
    "data.img_size=16",
    "data.batch_size=16",
    "data.eval_batch_size=64",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.num_sanity_val_steps=0",
    "callbacks.model_summary=null",
]

# A run of one epoch of two steps (validation and test one batch each): the suffix that shortens a training command
SHORT = [
    "trainer.max_epochs=1",
    "+trainer.limit_train_batches=2",
    "+trainer.limit_val_batches=1",
    "+trainer.limit_test_batches=1",
    "trainer.enable_progress_bar=false",
]


def compose(overrides: list[str], output_dir: Path | None = None):
    """``configs/train.yaml`` with ``overrides``, ``paths.output_dir`` set (no Hydra run needed)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from linvit.train.runs.run_identity import register_resolvers

    register_resolvers()  # ${linvit.task_name:...}, as the training entries do
    extra = [f"paths.output_dir={output_dir}"] if output_dir is not None else ["paths.output_dir=/nonexistent"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=[*overrides, *extra])


def report_ema_parameters(rank: int, module, queue) -> None:
    """Run in a spawned process: what arrived of the module's EMA copy (importable by the child, unlike a test)."""
    ema = module.model_ema
    queue.put((rank, sum(p.numel() for p in ema.parameters()), ema._sr_generator.initial_seed()))
