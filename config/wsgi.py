"""WSGI entry point, for a WSGI server serving the HTTP API alone: in production granian's WSGI workers
(`granian --interface wsgi config.wsgi:application`, README "Deploying"), beside a uvicorn on the ASGI
entry point (config/asgi.py) for the WebSockets. Events raised here reach those sockets through the
Redis channel layer (conversations/events.py)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.local")

application = get_wsgi_application()
