from django.urls import path

from retrieval import apis

urlpatterns = [
    path("knowledge/search", apis.KnowledgeSearchApi.as_view(), name="knowledge-search"),
    path(
        "users/<str:external_id>/memories/search",
        apis.ArchivalMemorySearchApi.as_view(),
        name="memory-search",
    ),
]
