from django.urls import path

from memory import apis

urlpatterns = [
    path("users/<str:external_id>", apis.EndUserDetailApi.as_view(), name="end-user"),
    path("users/<str:external_id>/export", apis.EndUserExportApi.as_view(), name="end-user-export"),
    path(
        "users/<str:external_id>/memory/blocks", apis.CoreMemoryBlockListApi.as_view(), name="memory-blocks"
    ),
    path(
        "users/<str:external_id>/memory/blocks/<str:label>",
        apis.CoreMemoryBlockDetailApi.as_view(),
        name="memory-block",
    ),
    path(
        "users/<str:external_id>/memory/operations",
        apis.MemoryOperationListApi.as_view(),
        name="memory-operations",
    ),
    path("users/<str:external_id>/memories", apis.ArchivalMemoryListCreateApi.as_view(), name="memories"),
    path(
        "users/<str:external_id>/memories/<str:memory_id>",
        apis.ArchivalMemoryDetailApi.as_view(),
        name="memory-detail",
    ),
    path("conversations/<str:conversation_id>/state", apis.TaskStateApi.as_view(), name="task-state"),
    path(
        "conversations/<str:conversation_id>/memory-agent",
        apis.MemoryAgentProgressApi.as_view(),
        name="memory-agent-progress",
    ),
    path(
        "conversations/<str:conversation_id>/state/events",
        apis.StateEventCreateApi.as_view(),
        name="task-state-events",
    ),
    path(
        "conversations/<str:conversation_id>/state/fold", apis.StateFoldApi.as_view(), name="task-state-fold"
    ),
]
