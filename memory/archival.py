"""Archival memory: facts and episodes of an end user with embeddings. Insert merges near-duplicates instead
of piling them up; a fact about the same subject as an older one invalidates it (kept, marked, left out of
search): the same subject key ("my X is …", or given), or another specific value for the same thing
(memory.facts: "the ledger DB is on port 23456 now" after "the ledger DB listens on port 5433"). The search
is retrieval's (retrieval.archival); its types and the hook the memory agent calls it through are here."""

import datetime
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from conversations.models import Conversation
from memory.facts import fact_signature, supersedes
from memory.models import Actor, ArchivalMemory, MemoryOperation
from memory.services import operation_log
from providers.embeddings import embed, from_bytes, to_bytes
from providers.text import jaccard
from tenants.errors import ApplicationError
from tenants.models import EndUser

NEAR_DUPLICATE_COSINE = 0.92
NEAR_DUPLICATE_JACCARD = 0.85
# Search reads at most this many of the user's memories (newest first): exact search, no index to drift.
SEARCH_SCAN_LIMIT = 20_000
# "my favourite colour is green", "the user's timezone is CET": the subject stands before the verb.
_SUBJECT = re.compile(
    r"^\s*(?:my|our|the user'?s|user'?s|his|her|their)\s+"
    r"(?P<subject>[\w\s'-]{2,60}?)\s+(?:is|are|was|=|:)\s+",
    re.I,
)


def subject_key(content: str, explicit: str = "") -> str:
    """The subject a fact is about: given explicitly, or read from 'my X is …' (else none)."""
    raw = explicit or ((m := _SUBJECT.match(content)) and m.group("subject")) or ""
    return re.sub(r"\s+", "_", raw.strip().lower())[:200]


def memory_data(memory: ArchivalMemory) -> dict[str, Any]:
    return {
        "id": str(memory.id),
        "content": memory.content,
        "kind": memory.kind,
        "subject": memory.subject,
        "importance": memory.importance,
        "mentions": memory.mentions,
        "conversation_id": str(memory.conversation_id) if memory.conversation_id else None,
        "source_message_ids": memory.source_message_ids,
        "embedding_model": memory.embedding_model or None,
        "created_at": memory.created_at,
        "updated_at": memory.updated_at,
        "invalidated_at": memory.invalidated_at,
        "invalidated_by": str(memory.invalidated_by_id) if memory.invalidated_by_id else None,
    }


@dataclass
class InsertOutcome:
    memory: ArchivalMemory
    action: str  # inserted | merged
    invalidated: list[ArchivalMemory] = field(default_factory=list)
    degradations: list[dict[str, str]] = field(default_factory=list)


def live_memories(end_user: EndUser) -> QuerySet[ArchivalMemory]:
    """The end user's memories that no newer statement replaced."""
    return ArchivalMemory.objects.filter(end_user=end_user, invalidated_at__isnull=True)


@dataclass(frozen=True)
class Embedding:
    """A memory's vector as archival_insert stores it."""

    vector: Any  # np.ndarray, or None when there is no embedder
    model: str  # the model's name, or why there is no vector
    degradations: list[dict[str, str]]


def archival_embed(content: str) -> Embedding:
    """The content's vector; without one (no embedder, a failed call) the memory is stored without and the
    outcome says so."""
    vectors, model = embed([content.strip()])
    if vectors is None:
        return Embedding(
            None, model, [{"code": "embeddings_unavailable", "message": f"Stored without a vector: {model}"}]
        )
    return Embedding(vectors[0], model, [])


def archival_insert(
    *,
    end_user: EndUser,
    content: str,
    kind: str = ArchivalMemory.Kind.FACT,
    importance: float = 0.5,
    subject: str = "",
    conversation: Conversation | None = None,
    source_message_ids: list[str] | None = None,
    actor: str = Actor.API,
    actor_name: str = "",
    trigger: str = "",
    replace_older: bool = True,
    embedding: Embedding | None = None,
) -> InsertOutcome:
    """Store a memory, or merge it into a near duplicate. A new statement replaces the older live ones it
    contradicts (same subject, or another value for the same thing) unless replace_older is False: a
    restored memory (the revert of a delete) is an old statement and must not replace what came after it.

    The embedding is computed first, with no lock held (a model or a remote call can be slow); then the end
    user's row is locked and the merge, insert and invalidations are written in one transaction. A caller
    that writes under a lock of its own passes `embedding` (archival_embed), computed before it took it."""
    content = content.strip()
    if not content:
        raise ApplicationError("An archival memory needs content.", code="empty_content")
    embedded = embedding if embedding is not None else archival_embed(content)
    explicit = bool(subject.strip())
    logged = _Logged(end_user=end_user, actor=actor, actor_name=actor_name, conversation=conversation)
    with transaction.atomic():
        # Lock the user's row: concurrent inserts of the same fact merge instead of both inserting.
        EndUser.objects.select_for_update().filter(pk=end_user.pk).first()
        candidates = list(live_memories(end_user).order_by("-created_at")[:SEARCH_SCAN_LIMIT])
        duplicate = _near_duplicate(candidates, content, embedded.vector, embedded.model)
        if duplicate is not None:
            _merge(duplicate, content, importance, source_message_ids, logged=logged, trigger=trigger)
            return InsertOutcome(duplicate, "merged", degradations=embedded.degradations)
        memory = ArchivalMemory.objects.create(
            tenant_id=end_user.tenant_id,
            end_user=end_user,
            conversation=conversation,
            content=content,
            kind=kind,
            subject=subject_key(content, subject),
            importance=importance,
            embedding=to_bytes(embedded.vector) if embedded.vector is not None else None,
            embedding_model=embedded.model if embedded.vector is not None else "",
            source_message_ids=source_message_ids or [],
        )
        logged.write(MemoryOperation.Op.ARCHIVAL_INSERT, memory, new_value=content, trigger=trigger)
        replaced = _contradicted(memory, candidates, explicit=explicit) if replace_older else []
        invalidated = [_invalidate(older, memory, reason, logged=logged) for older, reason in replaced]
    return InsertOutcome(memory, "inserted", invalidated, embedded.degradations)


@dataclass(frozen=True)
class _Logged:
    """Who an archival change's MemoryOperations are by, and in which conversation."""

    end_user: EndUser
    actor: str
    actor_name: str
    conversation: Conversation | None

    def write(
        self, op: str, memory: ArchivalMemory, *, old_value: str = "", new_value: str = "", trigger: str
    ) -> MemoryOperation:
        return operation_log(
            end_user=self.end_user,
            op=op,
            target=f"archival:{memory.id}",
            old_value=old_value,
            new_value=new_value,
            trigger=trigger,
            actor=self.actor,
            actor_name=self.actor_name,
            conversation=self.conversation,
        )


def _merge(
    duplicate: ArchivalMemory,
    content: str,
    importance: float,
    source_message_ids: list[str] | None,
    *,
    logged: _Logged,
    trigger: str,
) -> None:
    """Fold a restatement into its near duplicate: one more mention, the higher importance, both sources."""
    old = duplicate.content
    duplicate.mentions += 1
    duplicate.importance = max(duplicate.importance, importance)
    duplicate.source_message_ids = sorted({*duplicate.source_message_ids, *(source_message_ids or [])})
    duplicate.updated_at = timezone.now()
    duplicate.save(update_fields=["mentions", "importance", "source_message_ids", "updated_at"])
    logged.write(
        MemoryOperation.Op.ARCHIVAL_MERGE,
        duplicate,
        old_value=old,
        new_value=content,
        trigger=trigger or "near-duplicate of an existing memory",
    )


def _invalidate(
    older: ArchivalMemory, memory: ArchivalMemory, reason: str, *, logged: _Logged
) -> ArchivalMemory:
    """Mark an older memory as replaced by the new one (kept, left out of search)."""
    older.invalidated_at = timezone.now()
    older.invalidated_by = memory
    older.save(update_fields=["invalidated_at", "invalidated_by"])
    logged.write(
        MemoryOperation.Op.ARCHIVAL_INVALIDATE,
        older,
        old_value=older.content,
        new_value=memory.content,
        trigger=reason,
    )
    return older


# Kinds whose content states a value that a newer statement can replace.
_VALUED_KINDS = (ArchivalMemory.Kind.FACT, ArchivalMemory.Kind.DECISION)


def _contradicted(
    memory: ArchivalMemory, candidates: list[ArchivalMemory], *, explicit: bool
) -> list[tuple[ArchivalMemory, str]]:
    """The older live memories the new one replaces, each with the reason: the same subject key, or (when no
    subject was given) a different specific value for the same thing (memory.facts.supersedes)."""
    out: list[tuple[ArchivalMemory, str]] = []
    if memory.subject:
        reason = f"contradicted by a newer fact about {memory.subject!r}"
        out = [(c, reason) for c in candidates if c.subject == memory.subject]
    if explicit or memory.kind not in _VALUED_KINDS:
        return out
    signature = fact_signature(memory.content)
    if not signature.values:
        return out
    chosen = {c.pk for c, _ in out}
    for candidate in candidates:
        if candidate.pk in chosen or candidate.kind not in _VALUED_KINDS:
            continue
        shared = supersedes(signature, fact_signature(candidate.content))
        if shared:
            out.append((candidate, f"a newer fact gives another value for {' '.join(shared)!r}"))
    return out


def _near_duplicate(
    candidates: list[ArchivalMemory], content: str, vector: Any, model: str
) -> ArchivalMemory | None:
    normalised = " ".join(content.lower().split())
    for candidate in candidates:
        if " ".join(candidate.content.lower().split()) == normalised:
            return candidate
    if vector is not None:
        with_vectors = [c for c in candidates if c.embedding is not None and c.embedding_model == model]
        if with_vectors:
            matrix = np.stack([from_bytes(c.embedding) for c in with_vectors if c.embedding is not None])
            sims = matrix @ vector
            best = int(np.argmax(sims))
            if sims[best] >= NEAR_DUPLICATE_COSINE and _same_particulars(with_vectors[best].content, content):
                return with_vectors[best]
    for candidate in candidates:
        if jaccard(candidate.content, content) >= NEAR_DUPLICATE_JACCARD and _same_particulars(
            candidate.content, content
        ):
            return candidate
    return None


_PARTICULAR = re.compile(r"[\w./-]*\d[\w./-]*|(?<!^)(?<![.!?]\s)\b[A-Z][\w-]+")


def _same_particulars(a: str, b: str) -> bool:
    """Two sentences a vector finds alike are the same fact only when their numbers, identifiers and names
    agree ("the key for billing is KX-1" and "… for search is JK-2" embed close but are two facts)."""
    return {m.lower() for m in _PARTICULAR.findall(a)} == {m.lower() for m in _PARTICULAR.findall(b)}


@transaction.atomic
def archival_delete(
    *, memory: ArchivalMemory, actor: str = Actor.API, actor_name: str = "", trigger: str = ""
) -> None:
    operation_log(
        end_user=memory.end_user,
        op=MemoryOperation.Op.ARCHIVAL_DELETE,
        target=f"archival:{memory.id}",
        old_value=memory.content,
        trigger=trigger,
        actor=actor,
        actor_name=actor_name,
        details={
            "conversation_id": str(memory.conversation_id) if memory.conversation_id else None,
            "kind": memory.kind,
            "subject": memory.subject,
            "importance": memory.importance,
            "source_message_ids": memory.source_message_ids,
        },
    )
    memory.delete()


@dataclass
class SearchHit:
    memory: ArchivalMemory
    score: float
    lexical_rank: int | None
    vector_rank: int | None
    similarity: float = 0.0  # cosine with the query (0: no vector)


@dataclass
class SearchOutcome:
    hits: list[SearchHit]
    mode: str  # hybrid | lexical
    degradations: list[dict[str, str]] = field(default_factory=list)


class ArchivalSearch(Protocol):
    def __call__(
        self, *, end_user: EndUser, query: str, limit: int = 10, candidates: int = 50, expansion: str = ""
    ) -> SearchOutcome: ...


# The search over archival memories is retrieval's (retrieval.archival), and retrieval sits above memory:
# memory cannot import it, yet the memory agent's search tool calls it. So memory declares its type here and
# retrieval installs it when the apps are ready (retrieval.apps.RetrievalConfig.ready).
_installed: list[ArchivalSearch] = []


def archival_search_install(search: ArchivalSearch) -> None:
    _installed[:] = [search]


def archival_search(
    *, end_user: EndUser, query: str, limit: int = 10, candidates: int = 50, expansion: str = ""
) -> SearchOutcome:
    """Hybrid search over the user's live memories (retrieval.archival.archival_search, installed there)."""
    if not _installed:
        raise ImproperlyConfigured(
            "No archival search is installed: the retrieval app is not in INSTALLED_APPS."
        )
    return _installed[0](
        end_user=end_user, query=query, limit=limit, candidates=candidates, expansion=expansion
    )


@transaction.atomic
def archival_revert(
    *, operation: MemoryOperation, actor: str, actor_name: str = "", trigger: str = ""
) -> MemoryOperation | None:
    """Undo an archival operation: an insert is invalidated (kept, marked), an invalidation lifted, a delete
    re-inserted. A merge is not undone (the merged facts were the same)."""
    memory_id = operation.target.partition(":")[2]
    memory = ArchivalMemory.objects.filter(end_user=operation.end_user, pk=memory_id).first()
    logged = _Logged(end_user=operation.end_user, actor=actor, actor_name=actor_name, conversation=None)
    revert = MemoryOperation.Op.ARCHIVAL_REVERT
    if (
        operation.op == MemoryOperation.Op.ARCHIVAL_INSERT
        and memory is not None
        and memory.invalidated_at is None
    ):
        memory.invalidated_at = timezone.now()
        memory.save(update_fields=["invalidated_at"])
        return logged.write(revert, memory, old_value=memory.content, trigger=trigger)
    if operation.op == MemoryOperation.Op.ARCHIVAL_INVALIDATE and memory is not None:
        memory.invalidated_at = None
        memory.invalidated_by = None
        memory.save(update_fields=["invalidated_at", "invalidated_by"])
        return logged.write(revert, memory, new_value=memory.content, trigger=trigger)
    if operation.op == MemoryOperation.Op.ARCHIVAL_DELETE and memory is None:
        restored = _restore_deleted(operation, logged=logged, trigger=trigger)
        return MemoryOperation.objects.filter(target=f"archival:{restored.id}").first()
    raise ApplicationError(
        "This operation cannot be reverted (or its target changed).", code="target_changed", status_code=409
    )


def _restore_deleted(operation: MemoryOperation, *, logged: _Logged, trigger: str) -> ArchivalMemory:
    """Insert a deleted memory again as it was (kind, subject, importance, conversation and sources, kept in
    the delete's details), as an old statement: it replaces nothing learnt after it."""
    end_user = operation.end_user
    kept = operation.details or {}  # deletes logged before memory 0005 kept the content only
    conversation_id = kept.get("conversation_id")
    conversation = (
        Conversation.objects.filter(pk=conversation_id, tenant_id=end_user.tenant_id).first()
        if conversation_id
        else None  # or purged since
    )
    outcome = archival_insert(
        end_user=end_user,
        content=operation.old_value,
        kind=kept.get("kind", ArchivalMemory.Kind.FACT),
        importance=kept.get("importance", 0.5),
        subject=kept.get("subject", ""),
        conversation=conversation,
        source_message_ids=kept.get("source_message_ids"),
        actor=logged.actor,
        actor_name=logged.actor_name,
        trigger=trigger,
        replace_older=False,
    )
    return outcome.memory


@transaction.atomic
def archival_update(
    *,
    memory: ArchivalMemory,
    content: str,
    kind: str | None = None,
    importance: float | None = None,
    expected_updated_at: datetime.datetime | None = None,
    actor: str,
    actor_name: str = "",
    trigger: str = "",
) -> ArchivalMemory:
    """Correct a memory (support staff): re-embedded, logged; refused when it changed since it was read."""
    current = ArchivalMemory.objects.select_for_update().get(pk=memory.pk)
    if expected_updated_at is not None and current.updated_at != expected_updated_at:
        raise ApplicationError(
            "This memory changed since it was read.", code="version_mismatch", status_code=412
        )
    content = content.strip()
    if not content:
        raise ApplicationError("An archival memory needs content.", code="empty_content")
    old = current.content
    if content != old:
        vectors, model = embed([content])
        current.embedding = to_bytes(vectors[0]) if vectors is not None else None
        current.embedding_model = model if vectors is not None else ""
        current.subject = subject_key(content, current.subject)
    current.content = content
    if kind is not None:
        current.kind = kind
    if importance is not None:
        current.importance = importance
    current.updated_at = timezone.now()
    current.save()
    operation_log(
        end_user=current.end_user,
        op=MemoryOperation.Op.ARCHIVAL_UPDATE,
        target=f"archival:{current.id}",
        old_value=old,
        new_value=content,
        trigger=trigger,
        actor=actor,
        actor_name=actor_name,
    )
    return current
