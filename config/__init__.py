"""Project configuration: settings, root URLs, the ASGI application and the Celery app."""

import os

# numpy's OpenBLAS starts a thread per core for a matrix-vector product as small as a retrieval search
# (a long conversation's vectors), and those threads spin waiting for more: a context call spent much of
# its CPU there, stolen from the requests beside it. One thread is faster and takes less CPU
# (bench/context_latency.py; docs/benchmarks.md). Read when numpy loads, so it is set before anything
# imports it; a deployment may still set its own.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from config.celery import app as celery_app

__all__ = ["celery_app"]
