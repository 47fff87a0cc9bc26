"""Train an image classifier (or any LightningModule/LightningDataModule pair) from Hydra configs, in a checkout.

    python train.py                                   # linvit_nano on scikit-learn's digits, on the CPU
    python train.py experiment=fashion_mnist_linvit_nano
    python train.py model=linvit_tiny data=imagefolder data.root=/data/imagenet trainer=ddp trainer.devices=8
    python train.py run_name=my_run                   # rerunning the same run_name resumes from its last.ckpt
    python train.py ckpt_path=outputs/.../checkpoints/last.ckpt
    python train.py --config-dir ~/my_configs experiment=mine   # your own configs first in the search path

``linvit train ...`` is the same command for any install (a wheel has no train.py); both run
:mod:`linvit.train.runs.hydra_app` on the configs in ``configs/`` (which the package ships as ``linvit/configs``).
Objects are built by ``_target_`` (``cfg.data``, ``cfg.model``, ``cfg.trainer``, ``cfg.callbacks.*``,
``cfg.logger.*``); the data -> model contract is described in :mod:`linvit.train`.
"""

from pathlib import Path

from linvit.train.runs.hydra_app import main

if __name__ == "__main__":
    main(configs=Path(__file__).resolve().parent / "configs")
