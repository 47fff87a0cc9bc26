"""linvit's speed and memory benchmarks against timm baselines: ``linvit bench`` (:mod:`~linvit.bench.run`, the
multi-process suites: operators, backbones, training step, ``torch.compile``) and the one-process GPU target table
(:mod:`~linvit.bench.gpu`).

Both write their results where they are told (``--out``), by default below ``./bench-results``; a checkout's
``python -m benchmarks.run`` / ``bash benchmarks/run_gpu.sh`` write into its ``benchmarks/results/``. Imports torch,
timm and linvit's models, never Hydra or Lightning (the GPU machines have neither).
"""
