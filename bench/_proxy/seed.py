"""The long conversation the proxy benchmark talks on, written with bulk_create as the write path would."""

from __future__ import annotations

import random

from django.db import connection

from context.proxy.history import chain_keys
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from providers.tokens import count_message
from tenants.services import tenant_create

WORDS = [
    "export", "batch", "timeout", "storage", "retry", "worker", "queue", "invoice", "billing", "deploy",
    "config", "schema", "migration", "index", "latency", "cache", "token", "budget", "summary", "memory",
    "the", "a", "of", "to", "and", "in", "for", "with", "on", "at", "by", "from", "after", "before",
]  # fmt: skip


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def seed(count: int, rng: random.Random) -> tuple[str, str]:
    """A tenant and its conversation of `count` messages written with bulk_create (token counts as the write
    path stores them) and the proxy's chain keys, so each round is a new turn on a long conversation. The
    tenant's own background LLM work is off (llm_enabled false): the upstream then sees only the proxy's
    calls. Returns (api key, conversation id)."""
    tenant, raw_key = tenant_create(slug="bench-proxy", name="Bench proxy")
    tenant.settings = {**(tenant.settings or {}), "llm_enabled": False}
    tenant.save()
    conversation = conversation_create(tenant=tenant, end_user_external_id="bench", model="gpt-4o")
    items = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": sentence(rng, rng.randint(12, 60)),
            "parts": [],
        }
        for i in range(count)
    ]
    rows = [
        Message(
            conversation=conversation,
            seq=index + 1,
            role=item["role"],
            content=item["content"],
            token_count=count_message(role=item["role"], content=item["content"], model="gpt-4o"),
            idempotency_key=key,
        )
        for index, (item, key) in enumerate(zip(items, chain_keys(items), strict=True))
    ]
    Message.objects.bulk_create(rows, batch_size=1000)
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=count)
    return raw_key, str(conversation.id)


def analyze() -> None:
    """Fresh planner statistics, as autovacuum gathers them on a table that grew this way (and as
    bench/context_latency.py does). Without them (autovacuum is off on some servers, this machine's
    included) PostgreSQL still takes the seeded table for empty: the proxy's read of the conversation's
    newest message became a bitmap scan and sort of all the seeded rows on every append."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
