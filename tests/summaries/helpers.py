"""Helpers for the summaries tests: stored history with facts in it, tenant budgets, the context call."""

from typing import Any

from conversations.models import Conversation, Message
from conversations.services import message_append_batch
from tenants.models import Tenant

FILLER = [
    "That sounds reasonable to me, let us keep going with the plan as discussed.",
    "I had a look and everything seems to be in order for the moment.",
    "Thanks for the quick answer, this helps me a lot with the next steps.",
    "Let me think about it for a second before we continue with the rest.",
]


def append(conversation: Conversation, *items: dict[str, Any]) -> list[Message]:
    return [r.message for r in message_append_batch(conversation=conversation, items=list(items))]


def exchange_texts(n: int) -> tuple[str, str]:
    """A user/assistant pair; every fifth carries a fact (a path, a number with context, a name)."""
    filler = FILLER[n % len(FILLER)]
    if n % 5 == 0:
        return (
            f"Please update services/module_{n}/handler.py to listen on port {8000 + n}. {filler}",
            f"Done: services/module_{n}/handler.py now listens on port {8000 + n}, "
            f"reviewed by Dana Whitfield. {filler}",
        )
    return (f"Question {n}: {filler}", f"Answer {n}: {filler} {FILLER[(n + 1) % len(FILLER)]}")


def history(conversation: Conversation, exchanges: int, *, start: int = 0) -> list[Message]:
    items: list[dict[str, Any]] = []
    for n in range(start, start + exchanges):
        user, assistant = exchange_texts(n)
        items += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    out: list[Message] = []
    for i in range(0, len(items), 100):
        out += append(conversation, *items[i : i + 100])
    return out


def budgets(tenant: Tenant, *, history: int | None = None, summary: int | None = None, **extra: Any) -> None:
    tenant.settings = {
        **(tenant.settings or {}),
        **({"history_token_budget": history} if history is not None else {}),
        **({"summary_token_budget": summary} if summary is not None else {}),
        **extra,
    }
    tenant.save(update_fields=["settings"])


def b6_tokens(conversation: Conversation, after_seq: int) -> int:
    return sum(
        Message.objects.filter(conversation=conversation, kind="message", seq__gt=after_seq).values_list(
            "token_count", flat=True
        )
    )


def context(actor: Any, conversation: Conversation, **body: Any) -> dict[str, Any]:
    body.setdefault("user_message", "What next?")
    response = actor.client.post(f"/api/v1/conversations/{conversation.id}/context", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()
