"""Production: debug off, a real secret key, secure cookies behind TLS."""

from config.django.base import *  # noqa: F403
from config.django.base import DEBUG
from config.env import env_bool

if DEBUG:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("config.django.production needs DJANGO_DEBUG=false.")

SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", default=True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
