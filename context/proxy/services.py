"""The proxy's writes, run on the request's worker thread: resolve the conversation, append what the client
sent that Mnemo has not seen, assemble the context and build the upstream request (before the call); store
the reply and its usage (after). Appending the completed reply is what runs the memory agent and lets
compaction follow, as for any exchange."""

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import Http404

from context.pipeline import context_assemble
from context.proxy import history
from context.proxy.errors import ProxyError
from context.proxy.upstream import Reply, Upstream, upstream_for
from context.proxy.wire import ANTHROPIC, ProxyRequest
from context.state import ContextRequest
from conversations.models import Conversation, Message
from conversations.selectors import access_conversation
from conversations.services import conversation_create, message_append_batch
from prefix_cache.services import cache_usage_report, context_call_note
from providers.embeddings import embed_query_ahead
from providers.model_table import MODELS
from retrieval.questions import focused
from tenants.errors import ApplicationError
from tenants.models import Tenant

logger = logging.getLogger(__name__)


@dataclass
class Prepared:
    conversation: Conversation
    request: ProxyRequest
    synced: history.Synced
    upstream: Upstream
    body: dict[str, Any]
    context_id: str | None
    # Milliseconds spent appending the client's new messages and assembling the context (Server-Timing).
    timings: dict[str, float]
    usage_recorded: bool = False


def tenant_models(tenant: Tenant) -> list[str]:
    """The models a tenant may name: its `proxy_models` setting, else every model of the model table."""
    configured = (tenant.settings or {}).get("proxy_models")
    if isinstance(configured, list) and configured:
        return [str(m) for m in configured]
    return list(MODELS)


def _conversation(*, tenant: Tenant, request: ProxyRequest, conversation_id: str | None) -> Conversation:
    if conversation_id:
        try:
            return access_conversation(tenant=tenant, conversation_id=conversation_id)
        except Http404:
            raise ProxyError(
                "No such conversation.",
                code="conversation_not_found",
                status=404,
                param="X-Mnemo-Conversation",
            ) from None
    return conversation_create(tenant=tenant, end_user_external_id=request.end_user, model=request.model)


def _current(conversation: Conversation, synced: history.Synced) -> ContextRequest:
    """The newest stored message is the question when it is a plain user message; otherwise (an agent loop
    after a tool result, or a message with images, which the current-message slot cannot carry) the whole
    history is shown and there is no separate question. The message this request just stored is that newest
    one; only a request that stored nothing (a retry) reads it."""
    newest = synced.last or (
        Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE)
        .order_by("-seq")
        .only("id", "role", "parts")
        .first()
    )
    if newest is not None and newest.role == Message.Role.USER and not newest.parts:
        row = newest if newest is synced.last else None  # a whole row, which the load stage need not read
        return ContextRequest(user_message="", user_message_id=newest.id, user_message_row=row)
    return ContextRequest(user_message="")


def _embed_question_ahead(request: ProxyRequest) -> None:
    """The question is the client's last message when it is plain user text (_current): its vector is
    started before the append, so the local model runs while the append waits on the database, not only
    while the load stage does. The load stage asks for the same text and finds it under way
    (providers.embeddings.embed_query_ahead)."""
    last = request.messages[-1]
    if last["role"] == Message.Role.USER and not last["parts"] and isinstance(last["content"], str):
        embed_query_ahead(focused(last["content"]))


def upstream_body(*, request: ProxyRequest, rendered: Any) -> dict[str, Any]:
    """The assembled context in the upstream's format, the client's own system text ahead of Mnemo's
    system message (both stable, so the prefix cache still hits), and the client's other options."""
    body = dict(request.options)
    body["model"] = request.model
    if request.fmt == ANTHROPIC:
        system = list(rendered.system or [])
        if request.system:
            block: dict[str, Any] = {"type": "text", "text": request.system}
            if not system:
                block["cache_control"] = {"type": "ephemeral"}
            system.insert(0, block)
        if system:
            body["system"] = system
        body["messages"] = rendered.messages
    else:
        messages = list(rendered.messages)
        if request.system:
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{request.system}\n\n{messages[0]['content']}"}
            else:
                messages.insert(0, {"role": "system", "content": request.system})
        body["messages"] = messages
    if request.stream:
        body["stream"] = True
        if request.fmt != ANTHROPIC:
            # Usage is recorded whether or not the client asked for it (its chunk is not relayed then).
            body["stream_options"] = {**(request.options.get("stream_options") or {}), "include_usage": True}
    return body


def proxy_prepare(*, tenant: Tenant, request: ProxyRequest, conversation_id: str | None) -> Prepared:
    if not request.messages:
        raise ProxyError(
            "messages holds no user, assistant or tool message.", code="invalid_request", status=400
        )
    allowed = (tenant.settings or {}).get("proxy_models")
    if isinstance(allowed, list) and allowed and request.model not in allowed:
        raise ProxyError(
            f"The model {request.model!r} is not available to this tenant.",
            code="model_not_found",
            status=404,
            param="model",
        )
    upstream = upstream_for(fmt=request.fmt, tenant_settings=tenant.settings or {})
    conversation = _conversation(tenant=tenant, request=request, conversation_id=conversation_id)
    started = time.perf_counter()
    _embed_question_ahead(request)
    try:
        synced = history.history_sync(conversation=conversation, items=request.messages)
        appended = time.perf_counter()
        context = _current(conversation, synced)
        context.model, context.format = request.model, request.fmt
        state = context_assemble(conversation=conversation, request=context)
        # The dashboard's latency and degradation charts count proxied context assembly too.
        context_call_note(
            tenant_id=tenant.pk,
            milliseconds=(time.perf_counter() - appended) * 1000,
            degradation_codes=[d.code for d in state.degradations],
        )
    except ApplicationError as exc:
        raise ProxyError(exc.message, code=exc.code, status=exc.status_code) from None
    return Prepared(
        conversation=conversation,
        request=request,
        synced=synced,
        upstream=upstream,
        body=upstream_body(request=request, rendered=state.rendered),
        context_id=state.context_id,
        timings={
            "append": round((appended - started) * 1000, 2),
            "context": round((time.perf_counter() - appended) * 1000, 2),
        },
    )


def proxy_finish(
    *, prepared: Prepared, reply: Reply, completed: bool, failure: str | None = None, usage: bool = True
) -> None:
    """Store the reply (completed, or the partial text of a stream cut short) and, unless `usage` is False
    (the caller records it later with proxy_usage), its usage. A failure here is logged: the client has its
    answer already."""
    item = reply.item(prepared.request.fmt)
    metadata: dict[str, Any] = {"source": "proxy", "model": prepared.request.model}
    if reply.finish:
        metadata["finish_reason"] = reply.finish
    if failure:
        metadata["interrupted"] = failure
    try:
        if item["content"] or item["parts"] or completed:
            message_append_batch(
                conversation=prepared.conversation,
                items=[
                    {
                        **item,
                        "completed": completed,
                        "metadata": metadata,
                        "idempotency_key": history.reply_key(prepared.synced, item),
                    }
                ],
            )
    except Exception:
        logger.exception("proxy: storing the reply of conversation %s failed", prepared.conversation.pk)
    if usage:
        proxy_usage(prepared=prepared, reply=reply)


def proxy_usage(*, prepared: Prepared, reply: Reply) -> None:
    """Record the reply's usage against the context call's predicted prefix, once per request (a failure is
    logged). Unlike the reply, nothing later depends on it, so a stream records it after its last byte."""
    if prepared.usage_recorded or not reply.usage:
        return
    prepared.usage_recorded = True
    try:
        cache_usage_report(
            conversation=prepared.conversation,
            usage=reply.usage,
            provider=prepared.request.fmt,
            context_id=prepared.context_id,
        )
    except Exception:
        logger.exception("proxy: recording the usage of conversation %s failed", prepared.conversation.pk)


def deadline_seconds() -> float:
    return float(settings.MNEMO_PROXY_DEADLINE_SECONDS)
