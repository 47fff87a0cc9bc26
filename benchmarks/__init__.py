"""Reproducible speed and memory benchmarks of linvit against timm baselines (``python -m benchmarks.run``)."""
