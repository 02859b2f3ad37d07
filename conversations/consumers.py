"""The conversation socket: /ws/conversations/{id}/ streams the conversation's events to its tenant."""

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from conversations.events import conversation_group
from conversations.selectors import access_conversation
from tenants.authentication import authenticate_raw_key, bearer_token
from tenants.models import ApiKey

CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404


class ConversationConsumer(AsyncJsonWebsocketConsumer):
    api_key: ApiKey | None = None
    group: str | None = None

    async def connect(self) -> None:
        raw_key = self._raw_key()
        api_key = await database_sync_to_async(authenticate_raw_key)(raw_key)
        if api_key is None:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        try:
            conversation = await database_sync_to_async(access_conversation)(
                tenant=api_key.tenant, conversation_id=conversation_id
            )
        except Http404:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.api_key = api_key
        self.group = conversation_group(tenant_id=api_key.tenant_id, conversation_id=conversation.id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    def _raw_key(self) -> str | None:
        for name, value in self.scope.get("headers", []):
            if name == b"authorization":
                return bearer_token(value)
        # Browsers cannot set headers on a WebSocket, so the key may also come as ?api_key=.
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        keys = query.get("api_key")
        return keys[0] if keys else None

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The socket only pushes; writes go through the REST API where they are validated and stored.
        await self.send_json(
            {"type": "error", "data": {"code": "read_only", "message": "This socket only sends events."}}
        )

    async def conversation_event(self, event: dict[str, Any]) -> None:
        if not await self._still_allowed(event):
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        await self.send_json(
            {"type": event["event"], "conversation_id": event["conversation_id"], "data": event["data"]}
        )

    @database_sync_to_async
    def _still_allowed(self, event: dict[str, Any]) -> bool:
        """A revoked key stops receiving at the next event, not at the next reconnect."""
        if self.api_key is None or event.get("tenant_id") != str(self.api_key.tenant_id):
            return False
        return ApiKey.objects.active().filter(pk=self.api_key.pk).exists()
