import os

# Benchmarks and tests share small multi-op kernels; a spinning OpenMP wait policy makes them crawl on shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
