"""Reads the environment once, strictly: a malformed value stops start-up with a clear message."""

import json
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# A .env file (see .env.example) fills in what the real environment does not set.
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def env_bool(name: str, default: bool) -> bool:
    """A boolean is true/false (or 1/0, yes/no, on/off); anything else is a configuration error."""
    raw = env.str(name, default=None)
    # An empty value (NAME= in a .env file) means "not set", as for every other variable.
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use true or false.")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = env.str(name, default=None)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}.")
    return value


def env_str(name: str, default: str = "") -> str:
    return env.str(name, default=default).strip()


def env_json_object(name: str) -> dict:
    raw = env.str(name, default="").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object.")
    return value
