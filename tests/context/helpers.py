"""Helpers shared by the context and prefix-cache tests: the context call, stored history with known token
counts, and fake blocks for tests of the layout and the budget that need blocks of known sizes."""

import json
from typing import Any

from context import sources
from conversations.models import Conversation, Message
from conversations.services import message_append_batch
from prefix_cache.provenance import (
    ArchivalSource,
    ChunkSource,
    CoreMemorySource,
    ItemSource,
    MemoryUpdateSource,
    MessageHitSource,
    SessionProfileSource,
    SummarySegmentSource,
    TaskStateSource,
)
from prefix_cache.rendering import Item
from providers.tokens import count_message, count_text

MODEL = "gpt-4o"


def context_url(conversation: Conversation | str) -> str:
    return f"/api/v1/conversations/{getattr(conversation, 'id', conversation)}/context"


def context_call(actor: Any, conversation: Conversation, **body: Any) -> Any:
    return actor.client.post(context_url(conversation), body, format="json")


def context(actor: Any, conversation: Conversation, **body: Any) -> dict[str, Any]:
    """The context response body; the call must succeed."""
    response = context_call(actor, conversation, **body)
    assert response.status_code == 200, response.content
    return response.json()


def error_code(response: Any) -> str:
    return response.json()["error"]["code"]


def dumps(value: Any) -> str:
    """The bytes a client would send on: key order kept, nothing normalised."""
    return json.dumps(value, ensure_ascii=False)


def append(conversation: Conversation, *items: dict[str, Any]) -> list[Message]:
    """Store messages through the service (token counts computed on write, as in production)."""
    return [r.message for r in message_append_batch(conversation=conversation, items=list(items))]


def exchanges(
    conversation: Conversation, count: int, *, tokens: int | None = None, label: str = "exchange"
) -> list[Message]:
    """`count` user/assistant exchanges. With `tokens`, each message's stored token_count is set to it:
    the pipeline must budget with the stored count, never re-tokenise history."""
    items: list[dict[str, Any]] = []
    for n in range(1, count + 1):
        items.append({"role": "user", "content": f"{label} {n} question"})
        items.append({"role": "assistant", "content": f"{label} {n} answer"})
    messages = append(conversation, *items)
    if tokens is not None:
        Message.objects.filter(pk__in=[m.pk for m in messages]).update(token_count=tokens)
        for m in messages:
            m.token_count = tokens
    return messages


# Fake sources by kind, the fields a test does not name filled with neutral values.
FAKE_SOURCES: dict[str, tuple[type[ItemSource], dict[str, Any]]] = {
    "core_memory": (CoreMemorySource, {"label": "persona", "version": 1}),
    "memory_update": (MemoryUpdateSource, {"label": "persona", "version": 2}),
    "summary": (SummarySegmentSource, {"id": "s", "start_seq": 1, "end_seq": 1, "level": 0, "source": "llm"}),
    "task_state": (TaskStateSource, {"epoch": 1, "events": 0}),
    "session_profile": (SessionProfileSource, {"epoch": 1}),
    "message": (
        MessageHitSource,
        {
            "id": "m",
            "seq": 0,
            "created_at": "",
            "score": 0.0,
            "rank_score": 0.0,
            "lexical": 0.0,
            "similarity": 0.0,
        },
    ),
    "archival": (
        ArchivalSource,
        {
            "id": "a",
            "score": 0.0,
            "rank_score": 0.0,
            "lexical": 0.0,
            "similarity": 0.0,
            "source_message_ids": (),
        },
    ),
    "chunk": (ChunkSource, {"id": "c", "document": "d", "citation": "doc", "score": 0.0, "rank_score": 0.0}),
}


def fake_source(kind: str, **fields: Any) -> Any:
    """A source of this kind (FAKE_SOURCES) with these fields."""
    cls, defaults = FAKE_SOURCES[kind]
    return cls(**{**defaults, **fields})


def item(text: str, *, score: float = 0.0, kind: str, **source: Any) -> Item[Any]:
    return Item(
        text=text, tokens=count_text(text, model=MODEL), source=fake_source(kind, **source), score=score
    )


def install_blocks(monkeypatch: Any, **blocks: Any) -> None:
    """Fill layout blocks (core_memory, summaries, retrieved, task_state, session_profile, memory_updates)
    on every call, in the load stage after the real block sources and before the history is read.
    monkeypatch restores the source after the test. Lists are copied per call: the budget stage pops from
    them."""
    load_core_memory = sources.load_core_memory

    def loader(state: Any) -> None:
        for name, value in blocks.items():
            if name == "retrieved":  # retrieval hits are candidates the budget stage places, best first
                state.candidates = sorted(value, key=lambda i: -i.score)
                continue
            setattr(state.layout, name, list(value) if isinstance(value, list) else value)

    def core_memory_then_fake_blocks(state: Any) -> None:
        load_core_memory(state)
        loader(state)

    monkeypatch.setattr(sources, "load_core_memory", core_memory_then_fake_blocks)


def user_tokens(text: str) -> int:
    """What the current user message costs in an OpenAI prompt."""
    return count_message(role="user", content=text, model=MODEL)


def section(title: str, *texts: str) -> str:
    return title + "\n" + "\n\n".join(texts)
