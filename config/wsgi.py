"""WSGI entry point, for a WSGI server (gunicorn, uWSGI) serving the HTTP API alone; WebSockets need the
ASGI entry point (config/asgi.py), which serves both."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.local")

application = get_wsgi_application()
