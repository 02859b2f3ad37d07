from django.urls import path

from knowledge import apis

urlpatterns = [
    path("documents", apis.DocumentListCreateApi.as_view(), name="document-list"),
    path("documents/<str:document_id>", apis.DocumentDetailApi.as_view(), name="document-detail"),
    path("documents/<str:document_id>/chunks", apis.DocumentChunksApi.as_view(), name="document-chunks"),
]
