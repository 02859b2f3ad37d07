from django.urls import path

from prefix_cache import apis

urlpatterns = [
    path("conversations/<str:conversation_id>/usage", apis.UsageApi.as_view(), name="usage"),
    path("prefix-cache/stats", apis.CacheStatsApi.as_view(), name="prefix-cache-stats"),
]
