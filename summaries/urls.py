from django.urls import path

from summaries import apis

urlpatterns = [
    path(
        "conversations/<str:conversation_id>/compact", apis.CompactApi.as_view(), name="conversation-compact"
    ),
    path(
        "conversations/<str:conversation_id>/summaries",
        apis.SummarySegmentListApi.as_view(),
        name="conversation-summaries",
    ),
]
