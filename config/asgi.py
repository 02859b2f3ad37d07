"""ASGI entry point: HTTP through Django, WebSockets through Channels under /ws/."""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.local")

# Django must be set up before anything imports models (the WebSocket routes do).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from conversations.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files (the admin's, Swagger UI's) are answered before Django's middleware: a sync-only
        # static middleware in the chain made every API request switch between async and sync twice.
        "http": ASGIStaticFilesHandler(django_asgi_app),
        # No Origin check: sockets authenticate with an API key, not a cookie, so a foreign page cannot
        # ride on a user's session; non-browser clients send no Origin at all.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
