"""Tenant settings: the one list of what a tenant may set (type, bounds, choices, help text), checked when
settings are written (the admin's form, the services) and when they are read: a stored value that does not
fit falls back to the server default and is reported, so one bad value never takes a tenant down."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from tenants.validation import text_problem

INT = "int"
BOOL = "bool"
CHOICE = "choice"
TEXT = "text"
URL = "url"
SECRET = "secret"
LIST = "list"

MAX_TEXT = 100  # a model name fits a conversation's model column
MAX_URL = 2000
MAX_LIST = 200


@dataclass(frozen=True)
class Setting:
    key: str
    kind: str
    help: str
    default: Callable[[], Any]  # the server's value when the tenant sets none (read when asked)
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False  # null is a value of its own (it turns something off), not "unset"
    group: str = ""


def _server(name: str) -> Callable[[], Any]:
    return lambda: getattr(settings, name)


SCHEMA: tuple[Setting, ...] = (
    Setting(
        "default_model", TEXT, "Model of a conversation created without one.", _server("MNEMO_DEFAULT_MODEL"),
        group="Context",
    ),
    Setting(
        "token_budget", INT, "Tokens of a context call that names no budget (capped by the model's window).",
        _server("MNEMO_DEFAULT_TOKEN_BUDGET"), minimum=256, maximum=2_000_000, group="Context",
    ),
    Setting(
        "history_token_budget", INT,
        "Tokens the history since the last compaction may grow to (default: at most ¾ of the token budget).",
        _server("MNEMO_HISTORY_TOKEN_BUDGET"), minimum=256, maximum=2_000_000, group="Compaction",
    ),
    Setting(
        "summary_token_budget", INT, "Tokens of live summary segments before the oldest are rolled up.",
        _server("MNEMO_SUMMARY_TOKEN_BUDGET"), minimum=128, maximum=2_000_000, group="Compaction",
    ),
    Setting(
        "history_image_detail", CHOICE, "Kept frames of ended turns: at low detail, or as sent.",
        _server("MNEMO_HISTORY_IMAGE_DETAIL"), choices=("low", "keep"), group="Images",
    ),
    Setting(
        "image_hash_algorithm", CHOICE, "Perceptual hash that finds duplicate images.",
        _server("MNEMO_IMAGE_HASH_ALGORITHM"), choices=("phash", "dhash", "ahash"), group="Images",
    ),
    Setting(
        "image_dedup", BOOL, "Store a near-identical image once (off: every image is kept as sent).",
        lambda: True, group="Images",
    ),
    Setting(
        "image_dedup_threshold", INT, "Largest hash distance (bits of 64) still taken as a duplicate.",
        _server("MNEMO_IMAGE_DEDUP_THRESHOLD"), minimum=0, maximum=64, group="Images",
    ),
    Setting(
        "image_dedup_grid_threshold", INT,
        "Largest brightness difference per grid cell (0-255) still taken as unchanged; empty (null) turns "
        "the guard off.",
        _server("MNEMO_IMAGE_DEDUP_GRID_THRESHOLD"), minimum=0, maximum=255, nullable=True, group="Images",
    ),
    Setting(
        "image_retention_days", INT, "Days the bytes of cold, unpinned images are kept.",
        _server("MNEMO_IMAGE_RETENTION_DAYS"), minimum=1, maximum=36_500, group="Images",
    ),
    Setting(
        "image_descriptions", CHOICE,
        "Describe stored images with the LLM endpoint: auto (if its model reads images), on, off.",
        lambda: settings.MNEMO_IMAGE_DESCRIPTIONS, choices=("auto", "on", "off"),
        group="Images",
    ),
    Setting(
        "vision_model", TEXT, "Model of the LLM endpoint that describes images (default: the LLM model).",
        lambda: settings.MNEMO_VISION_MODEL, group="Images",
    ),
    Setting(
        "llm_enabled", BOOL, "Background LLM work (summaries, memory agent, query rewrite); off: rules only.",
        lambda: True, group="LLM",
    ),
    Setting("llm_base_url", URL, "The tenant's own OpenAI-compatible endpoint.", lambda: "", group="LLM"),
    Setting("llm_api_key", SECRET, "The key for the tenant's endpoint.", lambda: "", group="LLM"),
    Setting("llm_model", TEXT, "Model for background LLM work.", _server("LLM_MODEL"), group="LLM"),
    Setting(
        "llm_monthly_token_budget", INT, "Tokens of background LLM work a month; past it, rules decide.",
        _server("MNEMO_LLM_MONTHLY_TOKENS"), minimum=0, maximum=10**12, group="LLM",
    ),
    Setting(
        "proxy_models", LIST, "Models the proxy accepts (empty: every model of the model table).",
        lambda: [], group="Proxy",
    ),
    Setting("anthropic_base_url", URL, "The tenant's own Anthropic endpoint for the proxy.", lambda: "",
            group="Proxy"),
    Setting("anthropic_api_key", SECRET, "The key for the tenant's Anthropic endpoint.", lambda: "",
            group="Proxy"),
)  # fmt: skip
SETTINGS: dict[str, Setting] = {s.key: s for s in SCHEMA}

_URL = URLValidator(schemes=["http", "https"])


class SettingsInvalid(Exception):
    """Settings refused: `errors` maps each offending key to a sentence."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{key}: {message}" for key, message in errors.items()))
        self.errors = errors


def _number_problem(setting: Setting, value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"must be a whole number, not {value!r}."
    if setting.minimum is not None and value < setting.minimum:
        return f"must be at least {setting.minimum} (got {value})."
    if setting.maximum is not None and value > setting.maximum:
        return f"must be at most {setting.maximum} (got {value})."
    return None


def _text_problem(setting: Setting, value: Any) -> str | None:
    limit = MAX_URL if setting.kind == URL else MAX_TEXT
    if not isinstance(value, str):
        # A secret is not echoed (problems reach logs and context responses).
        shown = f"a {type(value).__name__}" if setting.kind == SECRET else repr(value)
        return f"must be text, not {shown}."
    if len(value) > limit:
        return f"must be at most {limit} characters."
    found = text_problem(value)
    if found is not None:
        return found[1]
    if setting.kind == URL and value:
        try:
            _URL(value)
        except ValidationError:
            return f"must be an http(s) URL, not {value!r}."
    return None


def _list_problem(setting: Setting, value: Any) -> str | None:
    if not isinstance(value, list):
        return f"must be a list of model names, not {value!r}."
    if len(value) > MAX_LIST:
        return f"must name at most {MAX_LIST} models."
    for item in value:
        problem = _text_problem(setting, item)
        if problem is not None or not item:
            return f"every entry {problem or 'must not be empty.'}"
    return None


def setting_problem(setting: Setting, value: Any) -> str | None:
    """Why `value` cannot be this setting's value (a sentence after the key), else None."""
    if value is None and setting.nullable:
        return None
    if setting.kind == INT:
        return _number_problem(setting, value)
    if setting.kind == BOOL:
        return None if isinstance(value, bool) else f"must be true or false, not {value!r}."
    if setting.kind == CHOICE:
        return (
            None
            if value in setting.choices
            else f"must be one of {', '.join(setting.choices)}, not {value!r}."
        )
    if setting.kind == LIST:
        return _list_problem(setting, value)
    return _text_problem(setting, value)


def settings_validate(data: Any) -> dict[str, Any]:
    """`data` as settings to store, else SettingsInvalid naming every unknown key and every bad value."""
    if not isinstance(data, Mapping):
        raise SettingsInvalid({"settings": "must be an object of setting names and values."})
    errors = {}
    for key, value in data.items():
        setting = SETTINGS.get(key)
        problem = "is not a setting." if setting is None else setting_problem(setting, value)
        if problem is not None:
            errors[str(key)] = problem
    if errors:
        raise SettingsInvalid(errors)
    return dict(data)


def settings_read(stored: Any) -> tuple[dict[str, Any], list[str]]:
    """The stored settings a reader may trust, and a sentence for each known setting whose stored value
    does not fit (left out, so its reader takes the server default). Unknown keys are ignored."""
    if not isinstance(stored, Mapping):
        return {}, (
            [] if stored is None else ["The tenant's settings are not an object: all defaults apply."]
        )
    usable: dict[str, Any] = {}
    problems = []
    for key, value in stored.items():
        setting = SETTINGS.get(key)
        if setting is None:
            continue
        problem = setting_problem(setting, value)
        if problem is None:
            usable[key] = value
        else:
            problems.append(f"Tenant setting {key} {problem} The default ({setting.default()!r}) applies.")
    return usable, problems


def settings_usable(stored: Any) -> dict[str, Any]:
    """What a reader of the settings passes on: the stored values that fit (a bad one is left out, so the
    reader's default applies; the context call reports it)."""
    return settings_read(stored)[0]


def tenant_setting(stored: Any, key: str) -> Any:
    """One setting's stored value when it fits, else the server default."""
    usable, _ = settings_read(stored)
    return usable[key] if key in usable else SETTINGS[key].default()
