"""Production, the settings every server entry point loads by default (config/asgi.py, config/wsgi.py,
config/celery.py): debug off, a real secret key and the allowed hosts from the environment, secure cookies.
It refuses to start without DJANGO_SECRET_KEY or DJANGO_ALLOWED_HOSTS, or with DJANGO_DEBUG=true."""

import os

from django.core.exceptions import ImproperlyConfigured

from config.env import env_str  # reads .env first, so a DJANGO_DEBUG there counts as set

# Debug is off unless the environment says otherwise (and then start-up stops, below): base.py reads it.
if not os.environ.get("DJANGO_DEBUG", "").strip():
    os.environ["DJANGO_DEBUG"] = "false"

from config.django.base import *  # noqa: F403
from config.django.base import DEBUG
from config.env import env_bool

if DEBUG:
    raise ImproperlyConfigured(
        "config.django.production runs with debug off: unset DJANGO_DEBUG (or set it to false), or use "
        "DJANGO_SETTINGS_MODULE=config.django.local for development."
    )
# base.py already stops without DJANGO_SECRET_KEY when debug is off; its host default is for development.
if not env_str("DJANGO_ALLOWED_HOSTS"):
    raise ImproperlyConfigured(
        "DJANGO_ALLOWED_HOSTS must be set in production (comma-separated host names this server answers to)."
    )

SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", default=True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# X-Forwarded-Proto is trusted only with MNEMO_BEHIND_PROXY=true (base.py).
