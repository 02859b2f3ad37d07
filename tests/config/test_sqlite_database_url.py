"""A SQLite file named in DATABASE_URL gets the same configuration as the default one under var/ (write
lock taken when a transaction starts, WAL, a busy timeout), so concurrent clients of a real server wait
their turn instead of failing with "database is locked"; a database Mnemo does not run on is refused at
start with a sentence that says what to set."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.providers.test_embedded_worker import ROOT, embedded_server_running

PRINT_DATABASE = (
    "from django.conf import settings; import json; "
    "print(json.dumps(settings.DATABASES['default'], default=str))"
)


def _database(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(DJANGO_SETTINGS_MODULE="config.django.local", **env)
    code = f"import django; django.setup(); {PRINT_DATABASE}"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60
    )


def test_a_sqlite_database_url_gets_the_default_configuration(tmp_path):
    default = json.loads(_database(MNEMO_VAR_DIR=str(tmp_path)).stdout)
    named = json.loads(_database(DATABASE_URL=f"sqlite:///{tmp_path}/other.sqlite3").stdout)

    assert named["NAME"] == f"{tmp_path}/other.sqlite3"
    assert named["OPTIONS"] == default["OPTIONS"]
    assert named["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_a_database_mnemo_does_not_run_on_is_refused_at_start():
    done = _database(DATABASE_URL="mysql://root@127.0.0.1/mnemo")

    assert done.returncode != 0
    assert "Mnemo runs on PostgreSQL" in done.stderr


def _request(url: str, key: str, method: str = "GET", body: dict | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _client(url: str, key: str, conversation: str, n: int) -> list[tuple[int, str]]:
    """One client: appends and context calls, one after the other, as an agent loop makes them."""
    out = []
    for i in range(6):
        message = {
            "role": "user",
            "content": f"Client {n} says: the deploy of build {i} finished at 10:{i:02d}.",
        }
        out.append(_request(f"{url}/api/v1/conversations/{conversation}/messages", key, "POST", message))
        body = {"user_message": f"When did build {i} finish?", "token_budget": 2000}
        out.append(_request(f"{url}/api/v1/conversations/{conversation}/context", key, "POST", body))
    return out


def test_a_server_on_a_sqlite_database_url_serves_concurrent_clients(tmp_path):
    database = tmp_path / "named" / "db.sqlite3"
    database.parent.mkdir()
    with embedded_server_running(tmp_path, DATABASE_URL=f"sqlite:///{database}") as (_server, url, key):
        conversations = [
            json.loads(_request(f"{url}/api/v1/conversations", key, "POST", {"end_user": f"u{n}"})[1])["id"]
            for n in range(4)
        ]
        with ThreadPoolExecutor(8) as pool:
            results = pool.map(lambda n: _client(url, key, conversations[n % 4], n), range(8))
            answered = [status for client in results for status, _body in client]

    assert Path(database).exists()
    assert len(answered) == 96
    assert [status for status in answered if status >= 300] == []
