"""The chat proxy's routes, mounted at /v1/ (outside /api/v1: not part of the REST API's schema)."""

from django.urls import path

from context.proxy import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="proxy-chat-completions"),
    path("messages", views.messages, name="proxy-messages"),
    path("models", views.models, name="proxy-models"),
]
