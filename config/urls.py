"""Root URLs: the versioned API, its schema and docs, the admin, and the operations endpoints."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.defaults import page_not_found
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from config import errors, ops, schema  # noqa: F401  (schema registers the OpenAPI extensions)

# The schema and its viewer are public: they describe the API, they expose no tenant data.
_public = {"authentication_classes": [], "permission_classes": [AllowAny]}

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(**_public), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema", **_public), name="docs"),
    path("api/v1/", include("conversations.urls")),
    path("api/v1/", include("cold_storage.urls")),
    path("api/v1/", include("summaries.urls")),
    # Before memory's: users/<id>/memories/search must match ahead of users/<id>/memories/<memory_id>.
    path("api/v1/", include("retrieval.urls")),
    path("api/v1/", include("memory.urls")),
    path("api/v1/", include("knowledge.urls")),
    path("api/v1/", include("prefix_cache.urls")),
    path("api/v1/", include("context.urls")),
    # The chat proxy (OpenAI- and Anthropic-compatible): served by Django's ASGI handler (config/asgi.py).
    path("v1/", include("context.proxy.urls")),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
]


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    """An unknown URL under /api/ (or the proxy's /v1/) answers in the API's error shape; elsewhere Django's
    page."""
    if errors.is_api(request):
        return errors.api_error(request, 404)
    return page_not_found(request, exception)


handler400 = errors.handler400
handler500 = errors.handler500
