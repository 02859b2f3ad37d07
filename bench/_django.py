"""Django in the benchmark's own process: the set-up every in-process benchmark runs before it imports an app,
its scratch var dir, and a throwaway PostgreSQL database it closes its connections to before dropping.

Not a benchmark itself; nothing here runs on import.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import django
from django.core.management import call_command
from django.db import connection

from bench._server import throwaway_database


def django_setup(*, var_dir: Path, database_url: str = "") -> None:
    """Configure and start Django in this process, then migrate. Must run before any app import.

    The embedded defaults (local-memory cache, in-memory channel layer) are forced even if the shell or a
    .env file names Redis: these benchmarks measure the pipeline and its database, nothing else.
    """
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.django.local"
    os.environ["MNEMO_VAR_DIR"] = str(var_dir)
    # DEBUG would keep every SQL statement in memory and add its bookkeeping to each query.
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    # An empty value counts as unset in config/env.py, and it also stops .env from filling these in.
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = ""
    os.environ.setdefault("MNEMO_LOG_LEVEL", "WARNING")
    # Tasks a call queues (a compaction, the memory agent, message vectors) run when it commits, in this
    # process, as the benchmarks describe; not on the server's background thread.
    os.environ.setdefault("MNEMO_EAGER_TASKS_IN_THREAD", "false")
    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def buffered_statistics_flush() -> None:
    """Write what the calls buffered (context-call statistics, prefix-hint hits) while the benchmark's
    database is still there; otherwise the buffer's exit flush meets a removed one and logs a traceback."""
    with contextlib.suppress(Exception):
        # Imported here: the app is importable only once django_setup() has run, and this may run without it.
        from prefix_cache.services import context_calls_flush

        context_calls_flush()


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A throwaway var dir for an in-process benchmark, its buffered statistics flushed before removal."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        try:
            yield Path(scratch)
        finally:
            buffered_statistics_flush()


def _close_connections() -> None:
    buffered_statistics_flush()  # while the database is there, not at exit into a dropped one
    with contextlib.suppress(Exception):
        connection.close()
        connection.close_pool()  # the psycopg pool would otherwise keep sessions on the database


@contextlib.contextmanager
def django_database(admin_url: str, name: str = "") -> Iterator[str]:
    """throwaway_database() for a benchmark whose own Django connects to it."""
    with throwaway_database(admin_url, name, before_drop=_close_connections) as url:
        yield url
