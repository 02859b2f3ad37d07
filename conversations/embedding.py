"""Retrieval vectors of messages, computed after the append has answered: one vector per passage
(providers.passages) with the local embedding model (providers.embeddings), stored as a MessageVector.

A Celery task does the work (conversations.tasks queues it; providers.background: a worker with a broker,
the server's own worker process in the embedded mode, so `make run` appends never wait for the model). Every
run fills what is missing, oldest first, so it is idempotent and resumable whatever stopped the last one;
`manage.py embeddings_backfill` runs the same fill over existing conversations."""

import hashlib
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import CharField, Exists, Min, OuterRef
from django.db.models.functions import Cast

from conversations.models import Conversation, Message, MessageVector
from conversations.signals import vectors_written
from providers.embeddings import embed_by_length, embedder_status, to_bytes
from providers.passages import passage_spans

logger = logging.getLogger(__name__)

# Messages read per round (the model takes their passages providers.embeddings.EMBED_BATCH at a time).
FILL_BATCH = 64


def content_sha256(model: str, content: str) -> str:
    return hashlib.sha256(f"{model}\x00{content}".encode()).hexdigest()


def _next_missing(conversation_id: Any, model: str, *, after: int, size: int) -> list[Any]:
    """The next `size` messages after seq `after` without vectors of `model`, in seq order. Only those are
    read: a conversation whose older messages all have vectors (the usual case, an append at its end) is not
    read again from its first message, whose content a long conversation would otherwise load on every run
    for a few new ones)."""
    has_vectors = MessageVector.objects.filter(message_id=OuterRef("pk"), model=model)
    return list(
        Message.objects.filter(conversation_id=conversation_id, kind=Message.Kind.MESSAGE, seq__gt=after)
        .exclude(Exists(has_vectors))
        .order_by("seq")
        .only("id", "seq", "content", "conversation_id")[:size]
    )


def _reusable(tenant_id: Any, hashes: list[str]) -> dict[str, MessageVector]:
    """Vectors this tenant already has for the same text under the same model: one row per text, however
    often it was said (a greeting repeated ten thousand times is read once)."""
    firsts = (
        MessageVector.objects.filter(content_sha256__in=set(hashes), conversation__tenant_id=tenant_id)
        .order_by()
        .values("content_sha256")
        # PostgreSQL has no min() of a uuid: the smallest id as text picks one row per text.
        .annotate(first=Min(Cast("message_id", CharField())))
        .values_list("first", flat=True)
    )
    rows = MessageVector.objects.filter(message_id__in=[uuid.UUID(pk) for pk in firsts]).only(
        "content_sha256", "model", "dimension", "spans", "vectors"
    )
    return {row.content_sha256: row for row in rows}


def _vectors_for(
    messages: list[Message], *, tenant_id: Any, embedder: Any, known: dict[str, MessageVector]
) -> list[MessageVector]:
    """The rows for `messages`; `known` (text hash -> a row with its vectors) is what this run has seen or
    written, and grows with what it looks up and computes."""
    hashes = [content_sha256(embedder.name, m.content) for m in messages]
    known.update(_reusable(tenant_id, [h for h in set(hashes) if h not in known]))
    spans = {m.pk: passage_spans(m.content) for m in messages}
    texts = [
        m.content[a:b]
        for m, h in zip(messages, hashes, strict=True)
        if h not in known
        for a, b in spans[m.pk]
    ]
    rows = embed_by_length(embedder, texts)
    out, position = [], 0
    for message, digest in zip(messages, hashes, strict=True):
        if digest in known:
            same = known[digest]
            blob, dimension, message_spans = bytes(same.vectors), same.dimension, same.spans
        else:
            count = len(spans[message.pk])
            blob = b"".join(to_bytes(v) for v in rows[position : position + count])
            position += count
            dimension, message_spans = embedder.dimension, [list(s) for s in spans[message.pk]]
        out.append(
            MessageVector(
                message_id=message.pk,
                conversation_id=message.conversation_id,
                seq=message.seq,
                model=embedder.name,
                dimension=dimension,
                spans=message_spans,
                vectors=blob,
                content_sha256=digest,
            )
        )
    for row in out:  # after the loop: positions in `rows` follow what was unknown when it started
        known.setdefault(row.content_sha256, row)
    return out


def message_vectors_fill(*, conversation_id: Any, limit: int | None = None) -> int:
    """Embed the conversation's messages that have no vectors yet (at most `limit`); returns how many were
    written. Without a model it writes nothing (retrieval stays lexical and says so)."""
    embedder = embedder_status().embedder
    conversation = Conversation.objects.filter(pk=conversation_id).only("id", "tenant_id").first()
    if embedder is None or conversation is None:
        return 0
    written, after = 0, 0
    written_ids: list[Any] = []
    known: dict[str, MessageVector] = {}
    while limit is None or written < limit:
        size = FILL_BATCH if limit is None else min(FILL_BATCH, limit - written)
        batch = _next_missing(conversation.pk, embedder.name, after=after, size=size)
        if not batch:
            break
        after = batch[-1].seq
        rows = _vectors_for(batch, tenant_id=conversation.tenant_id, embedder=embedder, known=known)
        with transaction.atomic():
            # A message deleted meanwhile takes its row's foreign key with it: ignore_conflicts covers a
            # second worker that wrote the same message first.
            MessageVector.objects.filter(message_id__in=[m.pk for m in batch]).exclude(
                model=embedder.name
            ).delete()
            MessageVector.objects.bulk_create(rows, ignore_conflicts=True)
        written += len(batch)
        written_ids += [m.pk for m in batch]
        if len(batch) < size:
            break  # the last of them: no second read to find none
    if written:
        vectors_written.send(sender=MessageVector, conversation_id=conversation.pk, message_ids=written_ids)
    return written


def retrieval_index_status(conversation: Conversation) -> dict[str, Any]:
    """What a client can wait on: the conversation's messages and how many have vectors of the current
    model (`model` is null when there is no model: retrieval is lexical only)."""
    embedder = embedder_status().embedder
    messages = Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE).count()
    embedded = (
        MessageVector.objects.filter(conversation=conversation, model=embedder.name).count()
        if embedder
        else 0
    )
    return {"messages": messages, "embedded": embedded, "model": embedder.name if embedder else None}


def message_vectors_due(*, since: Any, limit: int) -> list[Any]:
    """Conversations updated since `since` with messages that lack vectors of the current model (newest
    first, at most `limit`): what a lost or never-sent task left undone. Empty without a model."""
    embedder = embedder_status().embedder
    if embedder is None:
        return []
    missing = Message.objects.filter(conversation=OuterRef("pk"), kind=Message.Kind.MESSAGE).exclude(
        vector__model=embedder.name
    )
    return list(
        Conversation.objects.filter(updated_at__gte=since)
        .filter(Exists(missing))
        .order_by("-updated_at")
        .values_list("pk", flat=True)[:limit]
    )


def vectors_on_append() -> bool:
    """Whether written messages have their vectors computed in the background: configured, and a model to
    compute them with."""
    return bool(settings.MNEMO_EMBED_ON_APPEND) and embedder_status().embedder is not None
