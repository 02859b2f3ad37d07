from django.urls import path, re_path

from conversations.consumers import ConversationConsumer, UnknownPathConsumer

websocket_urlpatterns = [
    path("ws/conversations/<str:conversation_id>/", ConversationConsumer.as_asgi()),
    # Without a match the router raises and the server drops the handshake: answer 4404 instead.
    re_path(r"", UnknownPathConsumer.as_asgi()),
]
