"""Reads of conversations, turns and messages, always inside one tenant."""

from typing import Any

from django.db.models import Count, QuerySet

from conversations.models import Conversation, Message, Turn
from tenants.models import Tenant
from tenants.scoping import ScopedRowLookup, access_object

# Every conversation endpoint (appends and context calls above all) starts with this lookup.
_conversation_lookup = ScopedRowLookup(Conversation, scope="tenant", related="end_user")


def access_conversation(*, tenant: Tenant, conversation_id: object) -> Conversation:
    """The tenant's conversation with its end user loaded, else Http404."""
    conversation = _conversation_lookup.get(pk=conversation_id, scope_value=tenant.pk)
    conversation.tenant = tenant  # the caller's object: no join, no second query
    return conversation


def access_message(*, conversation: Conversation, message_id: object) -> Message:
    return access_object(Message.objects.all(), pk=message_id, conversation=conversation)


def access_turn(*, conversation: Conversation, turn_id: object) -> Turn:
    return access_object(Turn.objects.all(), pk=turn_id, conversation=conversation)


def conversation_list(*, tenant: Tenant, end_user_external_id: str | None = None) -> QuerySet[Conversation]:
    qs = Conversation.objects.filter(tenant=tenant).select_related("end_user")
    if end_user_external_id is not None:
        qs = qs.filter(end_user__external_id=end_user_external_id)
    return qs


def message_list(*, conversation: Conversation, after_seq: int = 0, limit: int = 100) -> list[Message]:
    return list(Message.objects.filter(conversation=conversation, seq__gt=after_seq).order_by("seq")[:limit])


def conversation_participants(*, conversation: Conversation) -> list[dict[str, Any]]:
    """Who took part: one entry per (role, name) of the conversation's messages (boundaries and summaries
    are not anyone's words), the name null when the messages carry none, most messages first. One
    aggregate query, whatever the length of the history."""
    rows = (
        Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE)
        .values("role", "name")
        .annotate(messages=Count("pk"))
        # Replaces Meta.ordering, whose columns would otherwise join the GROUP BY.
        .order_by("-messages", "role", "name")
    )
    return [{"name": row["name"] or None, "role": row["role"], "messages": row["messages"]} for row in rows]
