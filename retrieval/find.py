"""The one entry point of retrieval: a question (and what a rewrite added to it), a scope and a room in tokens
in; every candidate for B5 out, typed (retrieval.candidates), with the degradations met and the background
work wanted. It writes nothing: the caller applies what it asks for."""

from collections.abc import Callable
from datetime import date
from typing import Any

from conversations.models import Conversation, Message
from memory.selectors import archival_exists, archival_exists_reads
from providers.dates import annotate
from providers.embeddings import embed_query
from retrieval.archival import archival_search
from retrieval.candidates import (
    ChunkHit,
    Degradation,
    Found,
    ImageHit,
    MemoryHit,
    OtherConversationHit,
    Scope,
)
from retrieval.history import ConversationIndex, conversation_index, index_catch_up_reads, lexical_shares
from retrieval.knowledge import knowledge_reads
from retrieval.knowledge_candidates import image_reads, knowledge_candidates
from retrieval.other_conversations import other_conversations_reads, recall_other_conversations
from retrieval.questions import focused
from retrieval.this_conversation import MIN_RELEVANCE, history_hits
from tenants.statements import Read, beside

ARCHIVAL_CANDIDATES = 8
OTHER_CONVERSATION_CANDIDATES = 8


def retrieval_reads(conversation: Conversation) -> list[Read]:
    """The fixed reads candidates_find makes whatever the question, for reading them ahead
    (tenants.statements): the other conversations' list, the knowledge index's freshness, the images, whether
    any archival memory exists, and what this conversation's index has to catch up on."""
    reads = [*other_conversations_reads(conversation), *knowledge_reads(conversation.tenant_id)]
    reads += index_catch_up_reads(conversation.pk)
    reads += image_reads(conversation)
    if conversation.end_user_id is not None:
        reads += archival_exists_reads(conversation.end_user_id)
    return reads


def candidates_find(*, question: str, expansion: str, scope: Scope, room: int) -> Found:
    """Every source's candidates for `question` within `room` tokens of B5. `expansion`: words a rules
    rewrite added, which weigh less than the question's own."""
    conversation = scope.conversation
    # The sources read independently of each other: the other conversations (the database's full-text
    # index), knowledge and the archival memories each run beside this conversation's search
    # (tenants.statements.beside), their round trips waiting at the same time; started first, they also run
    # while the question is still being embedded on another thread.
    others = beside(lambda: _other_conversations(conversation, question, expansion))
    knowledge = beside(lambda: _knowledge(conversation, question))
    index = conversation_index(conversation.pk)
    memories = _archival_beside(index, question, expansion, conversation)
    # Vectors still missing (a server restarted mid-backlog, or appends while vectors were off): the caller
    # has them computed.
    vectors_missing = bool(index.missing_vectors)
    degradations: list[Degradation] = []
    history, answered = history_hits(
        index,
        question,
        lambda text: _query_vector(degradations, text),
        before_seq=scope.before_seq,
        room=room,
    )
    (chunks, knowledge_degraded), (memory_hits, memories_degraded) = knowledge(), memories()
    return Found(
        history=tuple(history),
        answered=tuple(answered),
        memories=tuple(memory_hits),
        other_conversations=tuple(others()),
        knowledge=tuple(chunks),
        degradations=(*knowledge_degraded, *memories_degraded, *degradations),
        vectors_missing=vectors_missing,
    )


def _query_vector(degradations: list[Degradation], query: str) -> Any:
    vector, reason = embed_query(query)
    if vector is None:
        degradations.append(Degradation("embeddings_unavailable", f"Lexical search only: {reason}"))
    return vector


def _archival_beside(
    index: ConversationIndex, query: str, expansion: str, conversation: Conversation
) -> Callable[[], tuple[list[MemoryHit], list[Degradation]]]:
    """_archival beside the call; for an end user without archival memories (read ahead) nothing to start:
    no thread to hand over to and back for an empty answer."""
    if conversation.end_user_id is None or not archival_exists(end_user_id=conversation.end_user_id):
        return lambda: ([], [])
    return beside(lambda: _archival(index, query, expansion, conversation))


def _archival(
    index: ConversationIndex, query: str, expansion: str, conversation: Conversation
) -> tuple[list[MemoryHit], list[Degradation]]:
    """The end user's archival memories the question finds, each scored on the history's scale (relevance:
    the larger of its cosine similarity with what the question is about and its lexical share in this
    conversation), so that the placing can rank it among the message hits."""
    assert conversation.end_user is not None  # _archival_beside checked end_user_id
    focus = focused(query)
    outcome = archival_search(
        end_user=conversation.end_user, query=focus, limit=ARCHIVAL_CANDIDATES, expansion=expansion
    )
    degradations = [Degradation(d["code"], d["message"]) for d in outcome.degradations]
    lexical = lexical_shares(index, focus, [hit.memory.content for hit in outcome.hits])
    said_on = _source_days([str(i) for hit in outcome.hits for i in hit.memory.source_message_ids or []])
    found = []
    for hit, lexical_share in zip(outcome.hits, lexical, strict=True):
        memory = hit.memory
        sources = tuple(str(i) for i in memory.source_message_ids or [])
        found.append(
            MemoryHit(
                id=str(memory.id),
                kind=memory.kind,
                content=memory.content,
                days=tuple(sorted({said_on[s] for s in sources if s in said_on})),
                relevance=max(hit.similarity, lexical_share),
                rank_score=hit.score,
                lexical=lexical_share,
                similarity=hit.similarity,
                source_message_ids=sources,
            )
        )
    return found, degradations


def _source_days(ids: list[str]) -> dict[str, str]:
    """The day each of these messages was said: a memory carries the date of what it was taken from."""
    if not ids:
        return {}
    rows = Message.objects.filter(pk__in=ids).values_list("id", "created_at")
    return {str(pk): created.date().isoformat() for pk, created in rows}


def _other_conversations(
    conversation: Conversation, query: str, expansion: str
) -> list[OtherConversationHit]:
    hits = recall_other_conversations(
        conversation=conversation, query=query, limit=OTHER_CONVERSATION_CANDIDATES, expansion=expansion
    )
    return [
        OtherConversationHit(
            id=hit.id,
            seq=hit.seq,
            role=hit.role,
            conversation_id=hit.conversation_id,
            conversation_title=hit.conversation_title,
            excerpt=annotate(hit.excerpt, date.fromisoformat(hit.day)) if hit.day else hit.excerpt,
            score=hit.score,
            speaker=hit.name or hit.role,
            day=hit.day,
        )
        for hit in hits
    ]


def _knowledge(conversation: Conversation, query: str) -> tuple[list[ChunkHit | ImageHit], list[Degradation]]:
    """Documents and code in the conversation's scope, each cited (retrieval.knowledge_candidates)."""
    degradations: list[Degradation] = []
    found = knowledge_candidates(
        conversation=conversation, query=query, min_relevance=MIN_RELEVANCE, degradations=degradations
    )
    return found, degradations
