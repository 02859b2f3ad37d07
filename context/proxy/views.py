"""The /v1 endpoints: async Django views, served by Django's ASGI handler (config/asgi.py), so a reply
streams from the upstream to the client chunk by chunk while the worker thread only does the database
work before and after. Errors answer in the calling SDK's own shape."""

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from context.proxy import upstream as calls
from context.proxy.errors import ProxyError, error_event, error_response
from context.proxy.services import (
    Prepared,
    deadline_seconds,
    proxy_finish,
    proxy_prepare,
    proxy_usage,
    tenant_models,
)
from context.proxy.upstream import Reply
from context.proxy.wire import ANTHROPIC, OPENAI, ProxyRequest, anthropic_request, openai_request
from providers.lanes import foreground
from tenants.authentication import authenticate_raw_key, bearer_token
from tenants.models import Tenant

logger = logging.getLogger(__name__)

CONVERSATION_HEADER = "X-Mnemo-Conversation"
USER_HEADER = "X-Mnemo-User"


def _raw_key(request: HttpRequest) -> str | None:
    """The Mnemo API key as the SDK sends it: `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic)."""
    raw = bearer_token(request.headers.get("Authorization")) or request.headers.get("x-api-key")
    return raw.strip() if raw else None


def _tenant(raw_key: str | None) -> Tenant:
    api_key = authenticate_raw_key(raw_key)
    if api_key is None:
        raise ProxyError("Unknown, revoked or missing Mnemo API key.", code="invalid_api_key", status=401)
    return api_key.tenant


def _prepare(request: HttpRequest, parse: Callable[..., ProxyRequest]) -> Prepared:
    """Everything before the upstream call, in one trip to the worker thread: the key, the body, the
    conversation, the new messages and the context. The client is blocked on it, as on a context call: the
    process's other requests step aside while it runs (providers.lanes)."""
    with foreground():
        tenant = _tenant(_raw_key(request))
        proxy_request = parse(_json(request), header_user=request.headers.get(USER_HEADER) or None)
        return proxy_prepare(
            tenant=tenant,
            request=proxy_request,
            conversation_id=request.headers.get(CONVERSATION_HEADER) or None,
        )


# A \uD800-\uDFFF escape: JSON lets one stand alone, which decodes to a str that cannot be stored or hashed.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _json(request: HttpRequest) -> Any:
    try:
        raw = request.body or b"null"
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # the API's words for it (tenants/api.py)
        raise ProxyError(
            f"The request body is larger than {limit} bytes.", code="request_too_large", status=413
        ) from None
    try:
        body = json.loads(raw)
    except ValueError:
        raise ProxyError("The request body is not valid JSON.", code="malformed_json", status=400) from None
    # Only a body with such an escape pays for the check (a pair, an emoji escaped, decodes to one character).
    if _ESCAPED_SURROGATE.search(raw):
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ProxyError(
                "The request body's text is not valid Unicode (an escaped UTF-16 surrogate, unpaired).",
                code="invalid_request",
                status=400,
            ) from None
    return body


async def _proxy(request: HttpRequest, parse: Callable[..., ProxyRequest], fmt: str) -> HttpResponseBase:
    if request.method != "POST":
        return error_response(ProxyError("Use POST.", code="method_not_allowed", status=405), fmt)
    try:
        prepared = await sync_to_async(_prepare)(request, parse)
        proxy_request = prepared.request
        loop = asyncio.get_running_loop()
        called = loop.time()
        deadline_at = called + deadline_seconds()
        if not proxy_request.stream:
            payload = await _whole(prepared, deadline_at)
            return JsonResponse(payload, headers=_headers(prepared))
        opened = await _within(calls.open_stream(prepared.upstream, prepared.body), prepared, deadline_at)
        # Until the upstream's status and headers arrived: its own time to answer, and the proxy's call.
        prepared.timings["upstream"] = round((loop.time() - called) * 1000, 2)
    except ProxyError as exc:
        return error_response(exc, fmt)
    reply = Reply()
    response = _Stream(_relay(prepared, opened, reply, deadline_at), prepared=prepared, reply=reply)
    for name, value in {**_headers(prepared), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}.items():
        response[name] = value
    return response


def _headers(prepared: Prepared) -> dict[str, str]:
    return {
        CONVERSATION_HEADER: str(prepared.conversation.pk),
        "Server-Timing": ", ".join(f"mnemo-{k};dur={v}" for k, v in prepared.timings.items()),
    }


async def _within(awaitable: Any, prepared: Prepared, deadline_at: float) -> Any:
    try:
        async with asyncio.timeout_at(deadline_at):
            return await awaitable
    except TimeoutError:
        raise calls.timeout_error(prepared.upstream) from None


async def _whole(prepared: Prepared, deadline_at: float) -> Any:
    payload = await _within(calls.post(prepared.upstream, prepared.body), prepared, deadline_at)
    reply = Reply()
    if prepared.request.fmt == ANTHROPIC:
        reply.add_anthropic_message(payload)
    else:
        reply.add_openai_chunk(payload)
    await sync_to_async(proxy_finish)(prepared=prepared, reply=reply, completed=True)
    return payload


def _relayed(prepared: Prepared, reply: Reply, event: str | None, data: str) -> tuple[bytes | None, bool]:
    """(the bytes to send on, whether the upstream said it is done) for one upstream event, which also
    feeds the reply."""
    if prepared.request.fmt == ANTHROPIC:
        payload = json.loads(data)
        if payload.get("type") == "error":
            raise _StreamFailed(f"event: error\ndata: {data}\n\n".encode())
        reply.add_anthropic_event(payload)
        return f"event: {event or payload.get('type')}\ndata: {data}\n\n".encode(), payload.get(
            "type"
        ) == "message_stop"
    if data.strip() == "[DONE]":
        return b"data: [DONE]\n\n", True
    payload = json.loads(data)
    if payload.get("error"):
        raise _StreamFailed(f"data: {data}\n\n".encode())
    reply.add_openai_chunk(payload)
    if not payload.get("choices") and payload.get("usage") and not prepared.request.include_usage:
        return None, False  # usage the client did not ask for: recorded, not relayed
    return f"data: {data}\n\n".encode(), False


class _StreamFailed(Exception):
    def __init__(self, event: bytes) -> None:
        self.event = event


class _Stream(StreamingHttpResponse):
    """The relayed events. The reply is stored before the last byte (a client's next turn must find it
    there), its usage only in close(), which Django's ASGI handler calls once the last byte was sent: not on
    the client's clock. A stream the client left records its usage when it stops (_close), in case the
    handler does not close it."""

    def __init__(self, events: AsyncIterator[bytes], *, prepared: Prepared, reply: Reply) -> None:
        super().__init__(events, content_type="text/event-stream")
        self._prepared, self._reply = prepared, reply

    def close(self) -> None:
        try:
            proxy_usage(prepared=self._prepared, reply=self._reply)
        finally:
            super().close()


async def _relay(
    prepared: Prepared, opened: calls.Opened, reply: Reply, deadline_at: float
) -> AsyncIterator[bytes]:
    """The upstream's events as they arrive, each also fed to `reply`. However the stream ends (done,
    upstream failure, deadline, the client gone), what was said is stored: completed only when the upstream
    finished. A finished reply is stored before its last event is sent on: the SDKs stop reading there, and
    a client sending only its next turn right away must not have that turn stored ahead of the reply."""
    done = closed = False
    failure = None
    events = opened.events.__aiter__()
    try:
        while not done:
            try:
                async with asyncio.timeout_at(deadline_at):
                    event, data = await events.__anext__()
            except StopAsyncIteration:
                break
            out, done = _relayed(prepared, reply, event, data)
            if done:
                closed = True
                await asyncio.shield(_close(prepared, opened, reply, True, None))
            if out:
                yield out
        if not done:
            failure = "upstream_ended"
            yield error_event(
                ProxyError("The upstream ended the stream early.", code="upstream_ended", status=502),
                prepared.request.fmt,
            )
    except _StreamFailed as exc:
        failure = "upstream_error"
        yield exc.event
    except TimeoutError:
        failure = "timeout"
        yield error_event(calls.timeout_error(prepared.upstream), prepared.request.fmt)
    except (asyncio.CancelledError, GeneratorExit):
        failure = "client_disconnected"
        raise
    except Exception as exc:  # the connection broke, or an event that is not JSON
        failure = "upstream_error"
        logger.warning("proxy stream from %s failed: %s", prepared.upstream.label(), type(exc).__name__)
        yield error_event(calls.unreachable_error(prepared.upstream, exc), prepared.request.fmt)
    finally:
        if not closed:
            await asyncio.shield(_close(prepared, opened, reply, done, failure))


async def _close(
    prepared: Prepared, opened: calls.Opened, reply: Reply, done: bool, failure: str | None
) -> None:
    with contextlib.suppress(Exception):  # the connection is going anyway
        await opened.response.aclose()
    await sync_to_async(proxy_finish)(
        prepared=prepared,
        reply=reply,
        completed=done,
        failure=failure,
        usage=failure == "client_disconnected",
    )


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    return await _proxy(request, openai_request, OPENAI)


@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponseBase:
    return await _proxy(request, anthropic_request, ANTHROPIC)


async def models(request: HttpRequest) -> HttpResponse:
    """The models the tenant may use, in a shape both SDKs read (OpenAI's list, Anthropic's page)."""
    fmt = ANTHROPIC if request.headers.get("anthropic-version") else OPENAI
    try:
        names = await sync_to_async(lambda: tenant_models(_tenant(_raw_key(request))))()
    except ProxyError as exc:
        return error_response(exc, fmt)
    data = [
        {
            "id": name,
            "object": "model",
            "type": "model",
            "created": 0,
            "created_at": "1970-01-01T00:00:00Z",
            "display_name": name,
            "owned_by": "mnemo",
        }
        for name in names
    ]
    return JsonResponse(
        {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }
    )
