"""Train an image classifier (or any LightningModule/LightningDataModule pair) from Hydra configs.

    python train.py                                   # linvit_nano on scikit-learn's digits, on the CPU
    python train.py experiment=fashion_mnist_linvit_nano
    python train.py model=linvit_tiny data=imagefolder data.root=/data/imagenet trainer=ddp trainer.devices=8
    python train.py run_name=my_run                   # rerunning the same run_name resumes from its last.ckpt
    python train.py ckpt_path=outputs/.../checkpoints/last.ckpt

Objects are built by ``_target_`` (``cfg.data``, ``cfg.model``, ``cfg.trainer``, ``cfg.callbacks.*``,
``cfg.logger.*``); the data -> model contract is described in :mod:`linvit.train`. Every knob is in ``configs/``.
"""

import logging
import os

import hydra
from omegaconf import DictConfig

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

log = logging.getLogger("linvit.train")


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from linvit.train.run import summarize, train

    metrics = train(cfg)
    log.info(summarize(cfg, metrics))
    # a sweeper (hydra -m with optuna, ...) optimises the returned value
    return metrics.get(str(cfg.get("optimized_metric", "test/acc1")))


if __name__ == "__main__":
    main()
