"""Settings for every environment, read from the environment through config.env.

No variables set gives the embedded default: SQLite and blobs under var/, a local-memory cache, the
in-memory channel layer and eager Celery. DATABASE_URL and REDIS_URL switch to PostgreSQL and Redis.
"""

import ipaddress
import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from config.env import BASE_DIR, env, env_bool, env_int, env_json_object, env_str
from retrieval.vectors.config import parse_vector_store

DEBUG = env_bool("DJANGO_DEBUG", default=True)

VAR_DIR = Path(env_str("MNEMO_VAR_DIR") or BASE_DIR / "var").resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    configured = env_str("DJANGO_SECRET_KEY")
    if configured:
        return configured
    if not DEBUG:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG=false.")
    # The embedded default keeps a generated key under var/ so sessions survive restarts.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(secrets.token_urlsafe(50))
        tmp.chmod(0o600)
        os.replace(tmp, path)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# true only behind a TLS-terminating proxy that sets X-Forwarded-Proto itself: then a request it forwarded as
# https is secure to Django. Without a proxy a client could send the header and pass for https.
MNEMO_BEHIND_PROXY = env_bool("MNEMO_BEHIND_PROXY", default=False)
if MNEMO_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_celery_beat",
    "axes",
    "tenants",
    "cold_storage",
    "conversations",
    "summaries",
    "memory",
    "knowledge",
    "retrieval",
    "prefix_cache",
    "context",
]

MIDDLEWARE = [
    # First, so request latency (GET /metrics) includes the rest of the chain.
    "config.ops.RequestMetricsMiddleware",
    # Next, so that whatever fails below it under /api/ answers in JSON with the request id.
    "config.errors.ApiErrorMiddleware",
    "config.lanes.LaneMiddleware",  # context calls first (MNEMO_BACKGROUND_YIELD_MS below)
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a locked-out admin login into its 429 response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"
# Threads per server process that run HTTP requests (config/asgi.py); each holds at most one database
# connection from the pool, and the context calls' retrieval reads beside them take up to
# tenants.statements.BESIDE_THREADS more, so keep the sum at or below MNEMO_DB_POOL_MAX. The views hold the
# GIL most of the time: a few threads serve more appends than many (fewer hand-offs of the GIL;
# bench/append.py).
MNEMO_HTTP_THREADS = env_int("MNEMO_HTTP_THREADS", 4, minimum=1)
# Context calls come first (providers/lanes.py, docs/operations.md): they run on FOREGROUND_THREADS of their
# own (count them in the sum above), and other requests step aside for them for at most BACKGROUND_YIELD_MS
# each in all (0: never).
MNEMO_HTTP_FOREGROUND_THREADS = env_int("MNEMO_HTTP_FOREGROUND_THREADS", 4, minimum=1)
MNEMO_BACKGROUND_YIELD_MS = env_int("MNEMO_BACKGROUND_YIELD_MS", 500, minimum=0)
# glibc malloc arenas a server process may use (config.startup.malloc_arenas_cap; 0: glibc's default, up to
# eight per core): fewer arenas keep a long-running server's resident memory from creeping up.
MNEMO_MALLOC_ARENAS = env_int("MNEMO_MALLOC_ARENAS", 2, minimum=0)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------------------


def _sqlite(name: str | Path) -> dict:
    """The one SQLite configuration, whether the file is the default one under var/ or DATABASE_URL names it:
    without these options concurrent writers fail with "database is locked" instead of waiting their turn."""
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        "OPTIONS": {
            # IMMEDIATE takes the write lock when a transaction starts, so the read-then-write of a sequence
            # number cannot interleave with another writer (a deferred transaction that must upgrade its lock
            # fails at once); WAL lets readers go on meanwhile; the timeout is how long a writer waits.
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


def _postgresql(config: dict) -> dict:
    # Requests, Celery tasks and socket handlers run on threads of their own; psycopg's pool gives them
    # connection reuse without a persistent connection per thread.
    config["CONN_MAX_AGE"] = 0
    config.setdefault("OPTIONS", {})["pool"] = {
        "min_size": env_int("MNEMO_DB_POOL_MIN", 2, minimum=1),
        "max_size": env_int("MNEMO_DB_POOL_MAX", 20, minimum=1),
        "timeout": 10,
    }
    if env_bool("MNEMO_DB_PREPARED_STATEMENTS", True):
        # Parameters bound on the server, and a statement run twice on a connection is prepared: the hot
        # statements (an append's lock, insert and lookups) are parsed and planned once per pooled connection
        # instead of once per request. Set false behind a pooler that cannot carry prepared statements
        # (PgBouncer in transaction mode before 1.21).
        config["OPTIONS"].update(server_side_binding=True, prepare_threshold=2)
    return config


def _database(url: str) -> dict:
    if not url:
        return _sqlite(VAR_DIR / "db.sqlite3")
    config = env.db_url_config(url)
    if config["ENGINE"] == "django.db.backends.postgresql":
        return _postgresql(config)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        return _sqlite(config["NAME"])
    raise ImproperlyConfigured(
        f"DATABASE_URL names {config['ENGINE']}: Mnemo runs on PostgreSQL (postgres://…) or SQLite "
        "(sqlite:////absolute/path/db.sqlite3, or leave DATABASE_URL unset for var/db.sqlite3)."
    )


DATABASE_URL = env_str("DATABASE_URL")
DATABASES = {"default": _database(DATABASE_URL)}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache, channels, Celery -------------------------------------------------------------------------------

REDIS_URL = env_str("REDIS_URL")

if REDIS_URL:
    # A cache that does not answer is a miss, never a request error (providers/redis_cache.py records it as
    # a degradation); short timeouts keep a request from waiting on it.
    CACHES = {
        "default": {
            "BACKEND": "providers.redis_cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "mnemo",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        }
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s timeout, the same as channels_redis's blocking receive, so an idle
            # socket would die with TimeoutError (a known channels_redis behaviour): let the receive block.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}], "prefix": "mnemo:ch"},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "mnemo"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", default=not REDIS_URL)
CELERY_TASK_EAGER_PROPAGATES = True
# A task is acknowledged when it ends, so a worker that dies mid-run leaves its message to the broker, which
# hands it out again once the visibility timeout passes (a pool child that dies is requeued at once by the
# tasks that set reject_on_worker_lost). The timeout must outlast the longest task (hard limits: 1900 s for
# a document, knowledge/tasks.py; 660 s for the others) and the longest countdown (retry backoff: 360 s), or a
# running task would be delivered twice. A compaction does not wait for it: the catch-up sweep redoes a run
# that outlived its hard time limit (summaries.services.compaction_catch_up).
CELERY_TASK_ACKS_LATE = True
MNEMO_CELERY_VISIBILITY_TIMEOUT = env_int("MNEMO_CELERY_VISIBILITY_TIMEOUT", 2000, minimum=5)
# Redis down: a worker waits for it forever and reconnects, instead of exiting after 100 tries; a request
# that queues work gives up after ~0.3 s (providers/background.py logs it; the periodic sweeps re-queue).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": MNEMO_CELERY_VISIBILITY_TIMEOUT,
    "socket_connect_timeout": 2,
    "socket_timeout": 10,
    "retry_on_timeout": True,
    "health_check_interval": 10,
    # Look for messages past their visibility timeout every 10 s (kombu's default scans every 100 s).
    "unacked_restore_throttle": 1,
}
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.1,
    "interval_max": 0.2,
}
# Tasks running when the broker connection drops are redelivered anyway (late acks): stop them.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Periodic work; the database scheduler copies these entries into its tables when beat starts.
CELERY_BEAT_SCHEDULE = {
    "images-purge-expired": {
        "task": "cold_storage.tasks.images_purge_expired",
        "schedule": 24 * 60 * 60,
    },
    "summaries-compaction-catch-up": {
        "task": "summaries.tasks.compaction_catch_up",
        "schedule": env_int("MNEMO_COMPACTION_CATCHUP_SECONDS", 600, minimum=10),
    },
    # Messages still without vectors in conversations active within the catch-up lookback (a lost or
    # never-sent task: the broker was down) are queued again.
    "conversations-vectors-sweep": {
        "task": "conversations.tasks.message_vectors_sweep",
        "schedule": env_int("MNEMO_VECTORS_SWEEP_SECONDS", 600, minimum=10),
    },
    # Conversations the memory agent has not read to the end (a lost run) within the same lookback.
    "memory-agent-sweep": {
        "task": "memory.tasks.memory_agent_sweep",
        "schedule": env_int("MNEMO_MEMORY_AGENT_SWEEP_SECONDS", 600, minimum=10),
    },
    # Documents left pending by a lost processing task.
    "knowledge-pending-sweep": {
        "task": "knowledge.tasks.documents_pending_sweep",
        "schedule": env_int("MNEMO_DOCUMENTS_SWEEP_SECONDS", 600, minimum=10),
    },
    "memory-state-fold": {
        "task": "memory.tasks.state_fold_periodic",
        "schedule": env_int("MNEMO_STATE_FOLD_SECONDS", 60, minimum=5),
    },
    # The dashboard's hourly context-call rollups past their 90 days.
    "prefix-cache-context-stats-prune": {
        "task": "prefix_cache.tasks.context_stats_prune",
        "schedule": 24 * 60 * 60,
    },
}
# Task state: fold a conversation's events into its base once this many are pending or the oldest is this old.
# The memory agent runs this long after the exchange that queued it, for every exchange completed meanwhile.
MNEMO_MEMORY_AGENT_DELAY_SECONDS = env_int("MNEMO_MEMORY_AGENT_DELAY_SECONDS", 10, minimum=0)
MNEMO_STATE_FOLD_MIN_EVENTS = env_int("MNEMO_STATE_FOLD_MIN_EVENTS", 50, minimum=1)
MNEMO_STATE_FOLD_MIN_AGE_SECONDS = env_int("MNEMO_STATE_FOLD_MIN_AGE_SECONDS", 300, minimum=0)
CELERY_TIMEZONE = "UTC"

# --- Auth, i18n, static ----------------------------------------------------------------------------------

# Admin logins are rate limited by django-axes: its backend comes first and refuses a locked-out username+IP
# before the password is even checked. API keys never go through these backends (tenants/authentication.py).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# This many failed logins for one username from one address lock that pair out for the cool-off (a failure
# while locked out starts it again); superusers, and operators for their tenants' members, lift a lockout in
# the admin (Axes → Access attempts). The address is REMOTE_ADDR: behind a proxy, have the server take the
# client's address from the proxy's header (uvicorn --proxy-headers --forwarded-allow-ips).
AXES_FAILURE_LIMIT = env_int("MNEMO_ADMIN_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("MNEMO_ADMIN_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# The admin views are tenants/admin.py's (scoped), not the ones axes registers.
AXES_ENABLE_ADMIN = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
MEDIA_ROOT = VAR_DIR / "blobs"


def _image_storage(variable: str, subdirectory: str) -> dict:
    # Any Django storage backend, as a JSON object {"BACKEND": ..., "OPTIONS": {...}}; by default files under
    # MEDIA_ROOT/<subdirectory>, written to a temporary file and linked into place.
    return env_json_object(variable) or {
        "BACKEND": "cold_storage.storage.AtomicFileSystemStorage",
        "OPTIONS": {"subdirectory": subdirectory},
    }


STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "images_hot": _image_storage("MNEMO_IMAGE_HOT_STORAGE", "images/hot"),
    "images_cold": _image_storage("MNEMO_IMAGE_COLD_STORAGE", "images/cold"),
}
TIKTOKEN_CACHE_DIR = VAR_DIR / "tiktoken"

# --- API -------------------------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.authentication.HasTenant"],
    "DEFAULT_PARSER_CLASSES": ["tenants.api.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "tenants.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Mnemo API",
    "DESCRIPTION": "Context and memory for LLM agents. Authenticate with `Authorization: Bearer <api key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    # The ApiKey security scheme comes from the authentication class (config/schema.py).
    # One name per choice set (a provider's format and a usage report's provider are the same three).
    "ENUM_NAME_OVERRIDES": {
        "ArchivalMemoryKindEnum": "memory.models.ArchivalMemory.Kind",
        "DocumentKindEnum": "knowledge.models.Document.Kind",
        "ProviderEnum": "prefix_cache.rendering.FORMATS",
    },
    # Swagger UI's assets are served from the installed sidecar package, not a CDN: the service works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Request limits. A message over MNEMO_MAX_MESSAGE_BYTES (content, parts and metadata, UTF-8; a context call's
# user message with its attachments too) or a batch of more than MNEMO_MAX_BATCH_MESSAGES is refused with 400
# and nothing is stored. MNEMO_MAX_REQUEST_BYTES holds multipart uploads too (tenants/api.py).
MNEMO_MAX_MESSAGE_BYTES = env_int("MNEMO_MAX_MESSAGE_BYTES", 256 * 1024, minimum=1)
MNEMO_MAX_BATCH_MESSAGES = env_int("MNEMO_MAX_BATCH_MESSAGES", 100, minimum=1)
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MNEMO_MAX_REQUEST_BYTES", 16 * 1024 * 1024, minimum=1024)
MNEMO_DEFAULT_MODEL = env_str("MNEMO_DEFAULT_MODEL", "gpt-4o")
# The LLM query rewrite is on the request path: one attempt, this long at most (memory/rewrite.py).
MNEMO_QUERY_REWRITE_TIMEOUT_MS = env_int("MNEMO_QUERY_REWRITE_TIMEOUT_MS", 2000, minimum=100)
# Kept frames of ended turns (anchor, result, errors) render at OpenAI's low detail ("low") or as sent
# ("keep"); a tenant's settings.history_image_detail wins.
MNEMO_HISTORY_IMAGE_DETAIL = env_str("MNEMO_HISTORY_IMAGE_DETAIL", "low")
if MNEMO_HISTORY_IMAGE_DETAIL not in ("low", "keep"):
    raise ImproperlyConfigured("MNEMO_HISTORY_IMAGE_DETAIL must be low or keep.")
# Token budget of a context call that names none (a tenant's settings.token_budget wins; both are capped by
# the model's window less its maximum output).
MNEMO_DEFAULT_TOKEN_BUDGET = env_int("MNEMO_DEFAULT_TOKEN_BUDGET", 32000, minimum=256)
# Extra or corrected input-token prices, JSON: {"model-prefix": {"input", "cached_input", "cache_write"}}
# in USD per million tokens (see prefix_cache/pricing.py for the defaults).
MNEMO_PRICE_TABLE = env_json_object("MNEMO_PRICE_TABLE")
# A key's last_used_at is written at most this often, so authentication stays a read on the hot path.
MNEMO_API_KEY_TOUCH_SECONDS = env_int("MNEMO_API_KEY_TOUCH_SECONDS", 60, minimum=0)
# A key (with its tenant) is cached this long; revoking or editing it drops the entry at once. 0 turns it off.
MNEMO_API_KEY_CACHE_SECONDS = env_int("MNEMO_API_KEY_CACHE_SECONDS", 300, minimum=0)

# Visual memory (cold_storage): image formats accepted (Pillow names); the pixel limit, checked from the
# header before decoding (decompression bombs); bytes per image; the perceptual hash and the Hamming
# threshold under which an image duplicates the conversation's previous one; days a compacted (cold) image
# is kept unless pinned. A tenant's settings (image_hash_algorithm, image_dedup_threshold, image_dedup,
# image_dedup_grid_threshold, image_retention_days) win.
MNEMO_IMAGE_FORMATS = [
    f.strip().upper() for f in env.list("MNEMO_IMAGE_FORMATS", default=["png", "jpeg", "webp"])
]
if not set(MNEMO_IMAGE_FORMATS) <= {"PNG", "JPEG", "WEBP", "GIF", "BMP"}:
    raise ImproperlyConfigured(f"MNEMO_IMAGE_FORMATS={MNEMO_IMAGE_FORMATS}: use png, jpeg, webp, gif, bmp.")
MNEMO_IMAGE_MAX_PIXELS = env_int("MNEMO_IMAGE_MAX_PIXELS", 4096 * 4096, minimum=1)
MNEMO_IMAGE_MAX_BYTES = env_int("MNEMO_IMAGE_MAX_BYTES", 10 * 1024 * 1024, minimum=1)
MNEMO_IMAGE_HASH_ALGORITHM = env_str("MNEMO_IMAGE_HASH_ALGORITHM", "phash")
if MNEMO_IMAGE_HASH_ALGORITHM not in ("phash", "dhash", "ahash"):
    raise ImproperlyConfigured(
        f"MNEMO_IMAGE_HASH_ALGORITHM={MNEMO_IMAGE_HASH_ALGORITHM!r}: use phash, dhash or ahash."
    )
MNEMO_IMAGE_DEDUP_THRESHOLD = env_int("MNEMO_IMAGE_DEDUP_THRESHOLD", 10, minimum=0)
# The brightness-grid guard of a duplicate (cold_storage/imaging.py): the largest per-cell difference, 0-255,
# still taken as "unchanged"; -1 turns the guard off (the hash alone decides).
MNEMO_IMAGE_DEDUP_GRID_THRESHOLD = (
    None
    if env_int("MNEMO_IMAGE_DEDUP_GRID_THRESHOLD", 2, minimum=-1) < 0
    else env_int("MNEMO_IMAGE_DEDUP_GRID_THRESHOLD", 2, minimum=-1)
)
MNEMO_IMAGE_RETENTION_DAYS = env_int("MNEMO_IMAGE_RETENTION_DAYS", 30, minimum=1)

# --- LLM, summaries and compaction --------------------------------------------------------------------------
# Any OpenAI-compatible endpoint: OpenAI (LLM_API_KEY), vLLM or Ollama (LLM_BASE_URL), a gateway. With neither
# set, summaries come from the offline extractive summariser and responses say so. A tenant's settings
# llm_base_url / llm_api_key / llm_model (and llm_enabled=false) win over these; a tenant's own URL only as
# MNEMO_TENANT_LLM_HOSTS below allows.
LLM_BASE_URL = env_str("LLM_BASE_URL")
LLM_API_KEY = env_str("LLM_API_KEY")
LLM_MODEL = env_str("LLM_MODEL")
# Image descriptions by a vision model (knowledge.vision): auto | on | off, and the model (default LLM_MODEL).
MNEMO_IMAGE_DESCRIPTIONS = env_str("MNEMO_IMAGE_DESCRIPTIONS", "auto")
MNEMO_VISION_MODEL = env_str("MNEMO_VISION_MODEL")
LLM_TIMEOUT_SECONDS = env_int("LLM_TIMEOUT_SECONDS", 30, minimum=1)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 2, minimum=0)
LLM_RETRY_BACKOFF_SECONDS = env_int("LLM_RETRY_BACKOFF_MS", 1000, minimum=0) / 1000
# The chat proxy (/v1, docs/proxy.md): /v1/messages calls an Anthropic-format endpoint (a tenant's
# anthropic_base_url / anthropic_api_key win, under the same egress rules as llm_base_url); no request waits
# on the upstream longer than the deadline (a stream included).
ANTHROPIC_BASE_URL = env_str("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY")
MNEMO_PROXY_DEADLINE_SECONDS = env_int("MNEMO_PROXY_DEADLINE_SECONDS", 300, minimum=1)
# Tokens of background LLM work per tenant and calendar month (tenant setting llm_monthly_token_budget wins);
# once spent, summaries are made offline until the month ends. 0 = no background LLM use.
MNEMO_LLM_MONTHLY_TOKENS = env_int("MNEMO_LLM_MONTHLY_TOKENS", 2_000_000, minimum=0)


def _host_patterns(variable: str) -> list[str]:
    values = [h.strip().lower().strip("[]") for h in env.list(variable, default=[]) if h.strip()]
    for value in values:
        name = value[2:] if value.startswith("*.") else value
        if ":" in name:  # only an IPv6 address may hold one (no ports: the pattern is the host alone)
            try:
                ipaddress.IPv6Address(name)
            except ValueError:
                name = ""
        if value != "*" and (not name or any(c in name for c in "*/ @")):
            raise ImproperlyConfigured(f"{variable}: {value!r} is not a host name or address, *.domain or *.")
    return values


def _networks(variable: str) -> list[str]:
    values = [n.strip() for n in env.list(variable, default=[]) if n.strip()]
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{variable}: {exc}") from None
    return values


# A tenant's own endpoint (settings llm_base_url) is called with the tenant's llm_api_key or no key, never
# LLM_API_KEY, and only when its host is listed here: names, *.example.com (its subdomains) or * (any host).
# Empty (the default): tenants cannot name an endpoint; their calls take the offline path, reported. Every
# address the host resolves to must then be public, or inside MNEMO_TENANT_LLM_PRIVATE_NETWORKS (CIDRs, e.g.
# an in-cluster vLLM), checked on the connection itself (providers/egress.py).
MNEMO_TENANT_LLM_HOSTS = _host_patterns("MNEMO_TENANT_LLM_HOSTS")
MNEMO_TENANT_LLM_PRIVATE_NETWORKS = _networks("MNEMO_TENANT_LLM_PRIVATE_NETWORKS")

# Embeddings for archival memory: auto = the OpenAI-compatible endpoint when MNEMO_EMBEDDINGS_OPENAI_MODEL is
# set (with LLM_API_KEY/LLM_BASE_URL), else the local MiniLM when installed, else lexical only.
MNEMO_EMBEDDINGS = env_str("MNEMO_EMBEDDINGS", "auto")
if MNEMO_EMBEDDINGS not in ("auto", "local", "openai", "none"):
    raise ImproperlyConfigured("MNEMO_EMBEDDINGS must be auto, local, openai or none.")
MNEMO_EMBEDDINGS_OPENAI_MODEL = env_str("MNEMO_EMBEDDINGS_OPENAI_MODEL")
MNEMO_EMBEDDINGS_MODEL_PATH = env_str("MNEMO_EMBEDDINGS_MODEL_PATH")
# The local model with int8 arithmetic, built once into VAR_DIR/models (providers.quantize); off: the shipped
# model as it is (its vectors have another model name, so a switch means embeddings_backfill).
MNEMO_EMBEDDINGS_INT8 = env_bool("MNEMO_EMBEDDINGS_INT8", default=True)
# CPU threads one embedding call may use (a Celery worker with concurrency 1 on a dedicated host: its cores).
MNEMO_EMBEDDINGS_THREADS = env_int("MNEMO_EMBEDDINGS_THREADS", 1, minimum=1)
# Where vectors are searched: numpy, milvus://host:port or milvus:///abs/path.db (docs/operations.md).
MNEMO_VECTOR_STORE = parse_vector_store(env_str("MNEMO_VECTOR_STORE", "numpy"))
# Message vectors are computed in the background after every append (off: only manage.py embeddings_backfill).
MNEMO_EMBED_ON_APPEND = env_bool("MNEMO_EMBED_ON_APPEND", default=True)
# A server process loads the local embedding model in the background as it starts, so that its first context
# call does not wait for it (providers.embeddings.embeddings_warm).
MNEMO_WARM_ON_START = env_bool("MNEMO_WARM_ON_START", default=True)
# In the embedded mode (no broker, so no beat process) a server runs CELERY_BEAT_SCHEDULE's periodic tasks on
# its own (config/startup.py), queued to the worker below.
MNEMO_EMBEDDED_BEAT = env_bool("MNEMO_EMBEDDED_BEAT", default=True)
# Without a broker (eager Celery), tasks a request queues run beside the server (MNEMO_EMBEDDED_WORKER)
# instead of inside the request (the embedded mode's appends and context calls never wait for them).
MNEMO_EAGER_TASKS_IN_THREAD = env_bool("MNEMO_EAGER_TASKS_IN_THREAD", default=True)
# Where those tasks run: "process", a worker process the server starts (providers/embedded_worker.py), so
# their Python work never slows the requests it serves; "thread", a thread of the server process.
MNEMO_EMBEDDED_WORKER = env_str("MNEMO_EMBEDDED_WORKER") or "process"
if MNEMO_EMBEDDED_WORKER not in ("process", "thread"):
    raise ImproperlyConfigured("MNEMO_EMBEDDED_WORKER must be process or thread")
# Background processes (Celery workers, the embedded worker process) lower their CPU priority by this much
# (os.nice; 0: as the server): on cores shared with a server, requests are served first.
MNEMO_BACKGROUND_NICE = env_int("MNEMO_BACKGROUND_NICE", 10, minimum=0)
# Conversations whose whole-history retrieval index a server process keeps in memory (least recently used go).
MNEMO_RECALL_INDEX_CONVERSATIONS = env_int("MNEMO_RECALL_INDEX_CONVERSATIONS", 64, minimum=1)
# With MNEMO_WARM_ON_START, a starting server process builds the indexes of this many of the most recently
# active conversations in the background (at most MNEMO_RECALL_INDEX_CONVERSATIONS; 0: none).
MNEMO_WARM_CONVERSATIONS = env_int("MNEMO_WARM_CONVERSATIONS", 48, minimum=0)
# The dashboard's per-tenant context-call statistics are buffered in each server process and written every
# this many seconds (0: written by each call).
MNEMO_CONTEXT_STATS_FLUSH_SECONDS = env_int("MNEMO_CONTEXT_STATS_FLUSH_SECONDS", 10, minimum=0)
# B6 (history since the last boundary) may grow to MNEMO_HISTORY_TOKEN_BUDGET (tenant: history_token_budget,
# capped at 80 % of the model's window). A background compaction is queued at the BACKGROUND share, the
# request path compacts synchronously at the TRIGGER share (or when the prompt would not fit); a compaction
# keeps the newest KEEP share verbatim, FALLBACK_KEEP when no summary could be made.
MNEMO_HISTORY_TOKEN_BUDGET = env_int("MNEMO_HISTORY_TOKEN_BUDGET", 24000, minimum=256)
MNEMO_COMPACTION_TRIGGER_PERCENT = env_int("MNEMO_COMPACTION_TRIGGER_PERCENT", 80, minimum=1)
MNEMO_COMPACTION_BACKGROUND_PERCENT = env_int("MNEMO_COMPACTION_BACKGROUND_PERCENT", 60, minimum=1)
MNEMO_COMPACTION_KEEP_PERCENT = env_int("MNEMO_COMPACTION_KEEP_PERCENT", 20, minimum=1)
MNEMO_COMPACTION_FALLBACK_KEEP_PERCENT = env_int("MNEMO_COMPACTION_FALLBACK_KEEP_PERCENT", 30, minimum=1)
if not (
    MNEMO_COMPACTION_BACKGROUND_PERCENT <= MNEMO_COMPACTION_TRIGGER_PERCENT <= 100
    and MNEMO_COMPACTION_KEEP_PERCENT < 100
    and MNEMO_COMPACTION_FALLBACK_KEEP_PERCENT < 100
):
    raise ImproperlyConfigured(
        "Compaction shares: BACKGROUND ≤ TRIGGER ≤ 100, and KEEP and FALLBACK_KEEP below 100 (percent)."
    )
# Live B4 segments may use this many tokens before the oldest are rolled up (tenant: summary_token_budget).
MNEMO_SUMMARY_TOKEN_BUDGET = env_int("MNEMO_SUMMARY_TOKEN_BUDGET", 6000, minimum=128)
# A segment aims at RATIO percent of its input, at most SEGMENT_MAX tokens; the summariser reads at most
# MAX_INPUT tokens at once (longer ranges are split into several segments).
MNEMO_SUMMARY_RATIO_PERCENT = env_int("MNEMO_SUMMARY_RATIO_PERCENT", 12, minimum=1)
MNEMO_SEGMENT_MAX_TOKENS = env_int("MNEMO_SEGMENT_MAX_TOKENS", 1500, minimum=64)
MNEMO_SUMMARISER_MAX_INPUT_TOKENS = env_int("MNEMO_SUMMARISER_MAX_INPUT_TOKENS", 24000, minimum=512)
# Seconds an LLM call may take on the request path (no retries there; the offline summariser takes over).
MNEMO_COMPACTION_SYNC_TIMEOUT_SECONDS = env_int("MNEMO_COMPACTION_SYNC_TIMEOUT_SECONDS", 10, minimum=1)
# An incomplete (still streaming) message younger than this stops a compaction's range.
MNEMO_COMPACTION_INCOMPLETE_GRACE_SECONDS = env_int(
    "MNEMO_COMPACTION_INCOMPLETE_GRACE_SECONDS", 600, minimum=0
)
# The background task: Celery soft/hard time limits (seconds) and retries (exponential backoff from 5 s).
MNEMO_COMPACTION_SOFT_TIME_LIMIT = env_int("MNEMO_COMPACTION_SOFT_TIME_LIMIT", 180, minimum=10)
MNEMO_COMPACTION_HARD_TIME_LIMIT = env_int("MNEMO_COMPACTION_HARD_TIME_LIMIT", 240, minimum=20)
MNEMO_COMPACTION_MAX_RETRIES = env_int("MNEMO_COMPACTION_MAX_RETRIES", 5, minimum=0)
# The per-conversation compaction lock lives this long unless its holder's heartbeat renews it (every third
# of it): a killed worker's lock is free again within this many seconds (summaries/locks.py).
MNEMO_COMPACTION_LOCK_TTL_SECONDS = env_int("MNEMO_COMPACTION_LOCK_TTL_SECONDS", 30, minimum=3)
# The periodic catch-up looks at conversations active within LOOKBACK seconds, at most LIMIT per run.
MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS = env_int(
    "MNEMO_COMPACTION_CATCHUP_LOOKBACK_SECONDS", 86400, minimum=60
)
MNEMO_COMPACTION_CATCHUP_LIMIT = env_int("MNEMO_COMPACTION_CATCHUP_LIMIT", 500, minimum=1)

# GET /metrics (config/ops.py) answers callers from these networks (CIDRs, comma-separated; default loopback)
# and, when MNEMO_METRICS_TOKEN is set, only with `Authorization: Bearer <token>`.
try:
    MNEMO_METRICS_ALLOWED_NETWORKS = [
        ipaddress.ip_network(n.strip(), strict=False)
        for n in (env_str("MNEMO_METRICS_ALLOWED_NETWORKS") or "127.0.0.0/8,::1/128").split(",")
        if n.strip()
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"MNEMO_METRICS_ALLOWED_NETWORKS: {exc}") from None
MNEMO_METRICS_TOKEN = env_str("MNEMO_METRICS_TOKEN")

# logging.config.dictConfig's schema: nested sections whose shapes differ (test settings change a level).
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # API keys in a logged URL (a socket's ?api_key=) or header are masked (config/log_redaction.py).
    "filters": {
        "redact_secrets": {"()": "config.log_redaction.RedactSecrets"},
        "request_id": {"()": "config.errors.RequestIdInLog"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact_secrets", "request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("MNEMO_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
