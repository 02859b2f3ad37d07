"""Which of the client's messages Mnemo has not seen, appended once.

Each message the proxy stores carries the idempotency key `px:<position>:<chain>`, where the chain hash covers
the message and every message before it in the client's list. A client that sends the whole list (as SDKs
do) finds its longest already-stored prefix by key; one that sends only the new turn matches no key at
position 0 and its messages continue the stored chain. A retried request appends nothing twice (its keys
exist), and a concurrent duplicate meets the unique key."""

import functools
import hashlib
import uuid
from dataclasses import dataclass
from json.encoder import encode_basestring  # the C escaper json.dumps uses (ensure_ascii=False)
from typing import Any

from conversations.models import Conversation, Message
from conversations.services import message_append_batch
from prefix_cache.rendering import canonical_json
from tenants.statements import FixedQuery

KEY_PREFIX = "px:"
_ROOT = "mnemo-proxy"


def message_hash(item: dict[str, Any]) -> str:
    """sha256 of canonical_json({"r": role, "c": content, "p": parts}). A text message's JSON is spelled out
    (sorted keys, no spaces: the same bytes) rather than built by json.dumps, whose per-call encoder set-up
    was half the time of hashing a whole list of short messages. The keys stored from these hashes must never
    change: a conversation's stored prefix would stop matching and its history be appended again. That is
    why the speaker's name stays out: histories stored before names were kept carry keys without them, and
    a client resending such a list with its names must still find it stored."""
    content, role = item["content"], item["role"]
    if not item["parts"] and isinstance(content, str) and isinstance(role, str):
        text = f'{{"c":{encode_basestring(content)},"p":[],"r":{encode_basestring(role)}}}'
    else:
        text = canonical_json({"r": role, "c": content, "p": item["parts"]})
    return hashlib.sha256(text.encode()).hexdigest()


def chain_keys(items: list[dict[str, Any]], *, start: int = 0, chain: str = _ROOT) -> list[str]:
    keys = []
    for offset, item in enumerate(items):
        # 48 hex digits (192 bits) carried on, so a chain continues from any stored key.
        chain = hashlib.sha256(f"{chain}\x00{message_hash(item)}".encode()).hexdigest()[:48]
        keys.append(f"{KEY_PREFIX}{start + offset}:{chain}")
    return keys


def key_chain(key: str) -> tuple[int, str]:
    """(position, chain hash) of a proxy key."""
    _, position, chain = key.split(":", 2)
    return int(position), chain


# Every proxied turn looks up keys and the newest messages: fixed statements (tenants.statements), whose SQL
# Django would otherwise build and compile anew each time. values_list(pk)[:1] is what exists() asks.
_KEY = FixedQuery(
    lambda conversation_id, key: (
        Message.objects.filter(conversation_id=conversation_id, idempotency_key=key)
        .order_by()
        .values_list("pk", flat=True)[:1]
    ),
    conversation_id=uuid.uuid4(),
    key=f"{KEY_PREFIX}sample:{uuid.uuid4().hex}",
)


def _exists(conversation: Conversation, key: str) -> bool:
    return bool(_KEY.run(conversation_id=conversation.pk, key=key))


def _seen_prefix(conversation: Conversation, keys: list[str]) -> int:
    """How many leading messages of the client's list are stored (their keys exist; if one does, all
    before it do). The whole list and all but the new turn are tried first, then a bisection."""
    if not keys:
        return 0
    if _exists(conversation, keys[-1]):
        return len(keys)
    if len(keys) > 1 and _exists(conversation, keys[-2]):
        return len(keys) - 1
    low, high = 0, len(keys) - 2  # keys[:low] seen; keys[high:] not
    while low < high:
        middle = (low + high + 1) // 2
        if _exists(conversation, keys[middle - 1]):
            low = middle
        else:
            high = middle - 1
    return low


@functools.lru_cache(maxsize=4)
def _newest_query(count: int) -> FixedQuery:
    return FixedQuery(
        lambda conversation_id: (
            Message.objects.filter(conversation_id=conversation_id, kind=Message.Kind.MESSAGE)
            .order_by("-seq")
            .values_list("id", "idempotency_key")[:count]
        ),
        conversation_id=uuid.uuid4(),
    )


def _newest(conversation: Conversation, count: int) -> list[tuple[Any, str | None]]:
    """(id, idempotency key) of the newest `count` messages, newest first."""
    rows: list[tuple[Any, str | None]] = _newest_query(count).run(conversation_id=conversation.pk)
    return rows


def _continuation(conversation: Conversation) -> tuple[int, str]:
    """Where a new-turn-only list continues: after the newest stored message, from its chain."""
    newest = _newest(conversation, 1)
    if not newest:
        return 0, _ROOT
    last_id, key = newest[0]
    if (key or "").startswith(KEY_PREFIX):
        position, chain = key_chain(key or "")
        return position + 1, chain
    count = Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE).count()
    return count, hashlib.sha256(f"{_ROOT}\x00{last_id}".encode()).hexdigest()[:48]


@dataclass(frozen=True)
class Synced:
    appended: int
    # The key the assistant's reply gets (it continues the client's chain).
    next_position: int
    chain: str
    # The last message this request stored (None when it stored none): the newest of the conversation, as far
    # as this request knows, without reading it back.
    last: Message | None = None


def _stored_prefix(conversation: Conversation, items: list[dict[str, Any]]) -> int:
    """For a conversation whose history came through the REST API (its messages carry no proxy keys): how
    many leading messages of a whole list match the stored messages in order, by role and text. Reads at
    most as many rows as the client sent; 0 for a single message (a new turn)."""
    if len(items) < 2:
        return 0
    stored = (
        Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE)
        .exclude(role=Message.Role.SYSTEM)
        .order_by("seq")
        .values_list("role", "content", "idempotency_key")[: len(items)]
    )
    matched = 0
    for item, (role, content, key) in zip(items, stored, strict=False):
        if (key or "").startswith(KEY_PREFIX) or (role, content) != (item["role"], item["content"]):
            break
        matched += 1
    return matched if matched < len(items) else 0


def history_sync(*, conversation: Conversation, items: list[dict[str, Any]]) -> Synced:
    keys = chain_keys(items)
    seen = _seen_prefix(conversation, keys) or _stored_prefix(conversation, items)
    # The same request again (a retry, or a regenerate): its last message is the newest stored one, or the
    # one the stored reply answers.
    if seen == len(items) and keys[-1] in {key for _, key in _newest(conversation, 2)}:
        new, new_keys = [], []
    elif seen > 0 and seen == len(items):
        # The client's whole list is an older prefix, not the latest request: a new turn that happens to
        # repeat the conversation's first message(s).
        position, chain = _continuation(conversation)
        new, new_keys = items, chain_keys(items, start=position, chain=chain)
    elif seen > 0:
        new, new_keys = items[seen:], keys[seen:]
    else:
        position, chain = _continuation(conversation)
        new, new_keys = items, chain_keys(items, start=position, chain=chain)
    last = None
    if new:
        batch = [{**item, "idempotency_key": key} for item, key in zip(new, new_keys, strict=True)]
        last = message_append_batch(conversation=conversation, items=batch)[-1].message
    last_key = new_keys[-1] if new_keys else (keys[-1] if keys else None)
    if last_key is None:
        return Synced(appended=0, next_position=0, chain=_ROOT)
    position, chain = key_chain(last_key)
    return Synced(appended=len(new), next_position=position + 1, chain=chain, last=last)


def reply_key(synced: Synced, item: dict[str, Any]) -> str:
    return chain_keys([item], start=synced.next_position, chain=synced.chain)[0]
