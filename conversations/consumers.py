"""The conversation socket: /ws/conversations/{id}/ streams the conversation's events to its tenant.

The key comes as `Authorization: Bearer <key>`, as the subprotocol `mnemo.bearer.<key>` (offered beside
`mnemo`, which the server answers with) or as `?api_key=<key>`. A refused socket is accepted and then closed
with 4401 (no valid key) or 4404 (no such conversation for this tenant): a close before the handshake
completes reaches the client as a bare HTTP 403, without the code."""

import contextlib
import logging
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
CLOSE_TRY_AGAIN = 1013  # the channel layer (Redis) is down
# Browsers cannot set headers on a WebSocket; a subprotocol is sent as a header and, unlike the query
# string, is not part of the path servers log. The answer names "mnemo", never the offered token.
SUBPROTOCOL = "mnemo"
BEARER_SUBPROTOCOL = "mnemo.bearer."

logger = logging.getLogger(__name__)


async def refuse(consumer: AsyncJsonWebsocketConsumer, code: int) -> None:
    """Complete the handshake, then close with `code`, so the client receives it."""
    await consumer.accept(chosen_subprotocol(consumer.scope))
    await consumer.close(code=code)


def chosen_subprotocol(scope: dict[str, Any]) -> str | None:
    # A browser that offered subprotocols fails a handshake whose answer names none of them.
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or []) else None


class ConversationConsumer(AsyncJsonWebsocketConsumer):
    api_key: ApiKey | None = None
    group: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except Exception as exc:
            # The channel layer lost Redis while the socket was open (its receive loop fails): close with
            # "try again later" rather than an internal error; the client reconnects when Redis is back.
            if not (isinstance(exc, OSError) or type(exc).__module__.startswith("redis")):
                raise
            logger.warning("socket closed, the channel layer did not answer: %s", exc)
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN})

    async def connect(self) -> None:
        raw_key = self._raw_key()
        api_key = await database_sync_to_async(authenticate_raw_key)(raw_key)
        if api_key is None:
            await refuse(self, CLOSE_UNAUTHORIZED)
            return
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        try:
            conversation = await database_sync_to_async(access_conversation)(
                tenant=api_key.tenant, conversation_id=conversation_id
            )
        except Http404:
            await refuse(self, CLOSE_NOT_FOUND)
            return
        self.api_key = api_key
        group = conversation_group(tenant_id=api_key.tenant_id, conversation_id=conversation.id)
        try:
            await self.channel_layer.group_add(group, self.channel_name)
        except Exception as exc:
            # The channel layer (Redis) does not answer: no event could reach this socket. Say so with the
            # standard "try again later" instead of failing the handshake.
            logger.warning("socket refused, the channel layer did not answer: %s", exc)
            await refuse(self, CLOSE_TRY_AGAIN)
            return
        self.group = group
        await self.accept(chosen_subprotocol(self.scope))

    def _raw_key(self) -> str | None:
        for name, value in self.scope.get("headers", []):
            if name == b"authorization":
                return bearer_token(value)
        for protocol in self.scope.get("subprotocols") or []:
            if protocol.startswith(BEARER_SUBPROTOCOL):
                return protocol[len(BEARER_SUBPROTOCOL) :] or None
        # Browsers cannot set headers on a WebSocket, so the key may also come as ?api_key= (servers log it:
        # config/log_redaction.py masks it in the lines Mnemo's loggers write).
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


class UnknownPathConsumer(AsyncJsonWebsocketConsumer):
    """Any other socket path: closed with 4404, as an unknown conversation is."""

    async def connect(self) -> None:
        await refuse(self, CLOSE_NOT_FOUND)
