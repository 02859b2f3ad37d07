from django.urls import path

from conversations import apis

urlpatterns = [
    path("conversations", apis.ConversationListCreateApi.as_view(), name="conversation-list"),
    path("conversations/import", apis.TranscriptImportApi.as_view(), name="conversation-import"),
    path(
        "conversations/<str:conversation_id>",
        apis.ConversationDetailApi.as_view(),
        name="conversation-detail",
    ),
    path(
        "conversations/<str:conversation_id>/messages",
        apis.MessageListCreateApi.as_view(),
        name="message-list",
    ),
    path(
        "conversations/<str:conversation_id>/messages/<str:message_id>",
        apis.MessageDetailApi.as_view(),
        name="message-detail",
    ),
    path("conversations/<str:conversation_id>/turns", apis.TurnStartApi.as_view(), name="turn-start"),
    path(
        "conversations/<str:conversation_id>/turns/<str:turn_id>/end",
        apis.TurnEndApi.as_view(),
        name="turn-end",
    ),
    path(
        "conversations/<str:conversation_id>/transcript.jsonl",
        apis.TranscriptExportApi.as_view(),
        name="transcript-export",
    ),
]
