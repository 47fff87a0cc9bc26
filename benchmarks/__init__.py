"""linvit's benchmark results and the checkout's entry points to the suite, which lives in :mod:`linvit.bench`.

``python -m benchmarks.run``, ``python -m benchmarks.gpu`` and ``bash benchmarks/run_gpu.sh`` run it with the results
in ``benchmarks/results/``; ``linvit bench`` runs the same suite from any install (results in ``./bench-results``).
"""
