"""WSGI entry point, for a WSGI server serving the HTTP API alone: in production granian's WSGI workers
(`granian --interface wsgi config.wsgi:application`, docs/operations.md "Deploying"), beside a uvicorn on
the ASGI entry point (config/asgi.py) for the WebSockets. Events raised here reach those sockets through the
Redis channel layer (conversations/events.py). The chat proxy's async views (/v1/) run on an event loop of
their own (context/proxy/wsgi.py), so a reply streams as it does under config.asgi."""

import os
from typing import Any

from django.core.wsgi import get_wsgi_application

# Production settings unless told otherwise (config/asgi.py says why).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")

django_wsgi_app = get_wsgi_application()

from config.log_redaction import redact_server_logs  # noqa: E402

redact_server_logs()

from config.startup import server_started  # noqa: E402

server_started()  # the embedding model loads in the background; the embedded mode runs its own beat

from context.proxy.asgi import PROXY_PREFIX, ProxyASGIHandler  # noqa: E402
from context.proxy.wsgi import ProxyOnWSGI  # noqa: E402

proxy_app = ProxyOnWSGI(ProxyASGIHandler())


def application(environ: dict[str, Any], start_response: Any) -> Any:
    if environ.get("PATH_INFO", "").startswith(PROXY_PREFIX):
        return proxy_app(environ, start_response)
    return django_wsgi_app(environ, start_response)
