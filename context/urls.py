from django.urls import path

from context import apis

urlpatterns = [
    path("conversations/<str:conversation_id>/context", apis.ContextApi.as_view(), name="context"),
    path(
        "conversations/<str:conversation_id>/agent-profile",
        apis.ConversationAgentProfileApi.as_view(),
        name="conversation-agent-profile",
    ),
    path("agent-profiles", apis.AgentProfileListCreateApi.as_view(), name="agent-profile-list"),
    path(
        "agent-profiles/<str:profile_id>", apis.AgentProfileDetailApi.as_view(), name="agent-profile-detail"
    ),
]
