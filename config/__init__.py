"""Project configuration: settings, root URLs, the ASGI application and the Celery app."""

import os

# numpy's OpenBLAS starts a thread per core for a matrix-vector product as small as a retrieval search
# (10,000 x 384), and those threads spin waiting for more: a context call spent twice its wall time in CPU,
# stolen from the requests beside it. One thread: 10k-message call p50 23.0 -> 19.1 ms, CPU per call
# 43.9 -> 20.3 ms (bench/context_latency.py). Read when numpy loads, so it is set before anything imports
# it; a deployment may still set its own.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from config.celery import app as celery_app

__all__ = ["celery_app"]
