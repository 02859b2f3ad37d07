import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("False", False), ("1", True), ("off", False)])
def test_env_bool_accepts_booleans(monkeypatch, raw, expected):
    monkeypatch.setenv("MNEMO_FLAG", raw)
    assert env_bool("MNEMO_FLAG", default=not expected) is expected


@pytest.mark.parametrize("raw", ["maybe", "treu", "2", "yes please"])
def test_env_bool_refuses_anything_else(monkeypatch, raw):
    monkeypatch.setenv("MNEMO_FLAG", raw)
    with pytest.raises(ImproperlyConfigured, match="MNEMO_FLAG"):
        env_bool("MNEMO_FLAG", default=True)


def test_env_int_refuses_garbage_and_too_small(monkeypatch):
    monkeypatch.setenv("MNEMO_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env_int("MNEMO_N", 5)
    monkeypatch.setenv("MNEMO_N", "0")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_int("MNEMO_N", 5, minimum=1)


DEFAULT_PRINT = (
    "s.DATABASES['default']['ENGINE'], s.CELERY_TASK_ALWAYS_EAGER, s.CHANNEL_LAYERS['default']['BACKEND']"
)


def _start(
    env_overrides: dict[str, str], tmp_path: Path, printed: str = DEFAULT_PRINT
) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "MNEMO_DB_PREPARED_STATEMENTS"}
    }
    env.update(
        {"MNEMO_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.django.local"}, **env_overrides
    )
    code = f"import django; django.setup(); from django.conf import settings as s; print({printed})"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_bad_boolean_stops_start_up_with_a_clear_message(tmp_path):
    result = _start({"DJANGO_DEBUG": "perhaps"}, tmp_path)
    assert result.returncode != 0
    assert "DJANGO_DEBUG='perhaps' is not a boolean" in result.stderr


def test_no_variables_give_the_embedded_default(tmp_path):
    result = _start({}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.sqlite3",
        "True",
        "channels.layers.InMemoryChannelLayer",
    ]
    assert (tmp_path / "secret_key").exists()


def test_service_urls_switch_to_postgres_and_redis(tmp_path):
    result = _start(
        {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test", "REDIS_URL": "redis://127.0.0.1:6379/0"},
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.postgresql",
        "False",
        "channels_redis.core.RedisChannelLayer",
    ]


@pytest.mark.parametrize(("flag", "expected"), [(None, ["True", "2"]), ("false", ["None", "None"])])
def test_postgres_prepares_statements_unless_turned_off(tmp_path, flag, expected):
    overrides = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test"}
    if flag is not None:
        overrides["MNEMO_DB_PREPARED_STATEMENTS"] = flag
    options = "s.DATABASES['default']['OPTIONS']"
    printed = f"{options}.get('server_side_binding'), {options}.get('prepare_threshold')"
    result = _start(overrides, tmp_path, printed)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == expected


def test_production_needs_a_secret_key(tmp_path):
    result = _start({"DJANGO_DEBUG": "false", "DJANGO_SETTINGS_MODULE": "config.django.production"}, tmp_path)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr


# --- which settings the servers run with -------------------------------------------------------------------

SERVER_ENV = {"DJANGO_SECRET_KEY": "x" * 50, "DJANGO_ALLOWED_HOSTS": "mnemo.example"}
# What a shell may hold that would decide the outcome for these tests.
_DECIDING = {
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_DEBUG",
    "DJANGO_SECRET_KEY",
    "DJANGO_ALLOWED_HOSTS",
    "MNEMO_BEHIND_PROXY",
    "DATABASE_URL",
    "REDIS_URL",
    "MNEMO_DB_PREPARED_STATEMENTS",
}


def _python(
    code: str, env_overrides: dict[str, str], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess:
    """`code` (or a script, with args) in a fresh interpreter with no settings module named. Nothing is
    warmed (MNEMO_WARM_ON_START): an interpreter that imported a server's entry point exits only once the
    warming it started (the embedding model, the `openai` package) is done, and these probes ask only for
    settings."""
    env = {k: v for k, v in os.environ.items() if k not in _DECIDING}
    env.update({"MNEMO_VAR_DIR": str(tmp_path), "MNEMO_WARM_ON_START": "false"}, **env_overrides)
    command = [sys.executable, *args] if args else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


SETTINGS_PRINT = "from django.conf import settings as s; print(s.SETTINGS_MODULE, s.DEBUG)"


@pytest.mark.parametrize("entry_point", ["config.asgi", "config.wsgi", "config.celery"])
def test_every_server_entry_point_defaults_to_production_settings(tmp_path, entry_point):
    result = _python(f"import {entry_point}; {SETTINGS_PRINT}", SERVER_ENV, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["config.django.production", "False"]


def test_manage_py_opts_into_development_settings(tmp_path):
    result = _python("", {}, tmp_path, "manage.py", "shell", "--no-imports", "-c", SETTINGS_PRINT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["config.django.local", "True"]


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY must be set"),
        ("DJANGO_ALLOWED_HOSTS", "DJANGO_ALLOWED_HOSTS must be set in production"),
    ],
)
def test_a_server_refuses_to_start_without_a_secret_key_or_allowed_hosts(tmp_path, missing, message):
    env = {k: v for k, v in SERVER_ENV.items() if k != missing}
    result = _python(f"import config.wsgi; {SETTINGS_PRINT}", env, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr
    assert not (tmp_path / "secret_key").exists()  # no development key was generated either


def test_production_refuses_debug(tmp_path):
    result = _python(
        f"import config.asgi; {SETTINGS_PRINT}", {**SERVER_ENV, "DJANGO_DEBUG": "true"}, tmp_path
    )
    assert result.returncode != 0
    assert "config.django.production runs with debug off" in result.stderr


@pytest.mark.parametrize(
    ("flag", "expected"), [(None, "None"), ("false", "None"), ("true", "X-Forwarded-Proto")]
)
def test_x_forwarded_proto_is_trusted_only_behind_a_declared_proxy(tmp_path, flag, expected):
    # Named explicitly (and debug off explicitly) so the check is about production.py, whatever the default.
    env = {
        **SERVER_ENV,
        "DJANGO_SETTINGS_MODULE": "config.django.production",
        "DJANGO_DEBUG": "false",
        **({"MNEMO_BEHIND_PROXY": flag} if flag else {}),
    }
    printed = (
        "from django.conf import settings as s; h = s.SECURE_PROXY_SSL_HEADER; "
        "print('X-Forwarded-Proto' if h == ('HTTP_X_FORWARDED_PROTO', 'https') else h)"
    )
    result = _python(f"import config.wsgi; {printed}", env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MNEMO_TENANT_LLM_HOSTS", "llm.example.com:8443"),
        ("MNEMO_TENANT_LLM_HOSTS", "https://llm.example.com"),
        ("MNEMO_TENANT_LLM_HOSTS", "llm.*.example.com"),
        ("MNEMO_TENANT_LLM_PRIVATE_NETWORKS", "10.0.0.0/33"),
    ],
)
def test_tenant_llm_egress_settings_are_parsed_strictly(tmp_path, variable, value):
    result = _start({variable: value}, tmp_path)
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {variable}" in result.stderr
