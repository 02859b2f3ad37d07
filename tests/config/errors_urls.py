"""The root URLs plus a plain Django view under /api/ that refuses methods as Django does (an empty 405)."""

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.http import require_POST

from config.urls import handler400, handler404, handler500, urlpatterns  # noqa: F401


@require_POST
def post_only(request: HttpRequest) -> HttpResponse:
    return HttpResponse("done")


urlpatterns = [path("api/v1/test/post-only", post_only), *urlpatterns]
