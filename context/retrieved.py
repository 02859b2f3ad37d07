"""B5 placement: what retrieval found (retrieval.find) turned into Items the budget stage can place. A hit is
a whole message (or, for a long one, its excerpt) labelled with its seq, date and speaker; consecutive short
turns of a session share one label; a hit's exchange partner and the memories taken from it are placed
beside it; every source is merged by rank. Scores travel in each Item's source, so that a client can tell a
weak hit from a strong one."""

import re
from collections.abc import Sequence
from datetime import datetime
from itertools import pairwise

from context.state import ContextState
from conversations.tasks import message_vectors_request
from prefix_cache.accounting import count_cached, count_cached_parts
from prefix_cache.provenance import (
    ArchivalSource,
    ChunkSource,
    ImageDescriptionSource,
    MessageHitSource,
    MessageSource,
    OtherConversationSource,
    RetrievedSource,
    TurnGroupSource,
)
from prefix_cache.rendering import Item
from retrieval.candidates import (
    ChunkHit,
    Found,
    HistoryHit,
    HistoryTurn,
    ImageHit,
    MemoryHit,
    OtherConversationHit,
    Scope,
)
from retrieval.find import candidates_find

# Consecutive hits of a session share one label when each is at most this long (a chat's turns); a longer
# message stands alone, its label small beside it.
GROUP_TURN_TOKENS = 80
# A group takes one place in the ranking, at its best hit's: it stops at this many tokens, so that a long
# run of weak hits cannot ride on one strong one.
GROUP_MAX_TOKENS = 240
# A partner at most this share of its hit's tokens (the question that prompted a long answer, mostly) comes
# right after its hit, not after all the hits: it costs little beside the hit and says what the hit answers.
SHORT_PARTNER_SHARE = 0.5
# A message hit whose words mostly repeat what B5 already quotes (a file pasted again with one line changed)
# tells a model little for its tokens: at least this share of its word trigrams already quoted, it gives its
# room to the next hit (listed in `dropped`, reason "repeats"). A hit of fewer than REPEAT_MIN_TRIGRAMS
# never repeats: it costs little, and the one word it changes may be the fact.
REPEAT_SHARE = 0.7
REPEAT_MIN_TRIGRAMS = 30
_WORD_CHARACTERS = re.compile(r"\w+")


def date_label(created_at: datetime) -> str:
    """The day a hit was said: the date only (the seq orders a day's messages), so a label costs little
    beside a short turn. (ISO format: strftime costs more, once per hit, and messages are dated from 1970.)"""
    return created_at.date().isoformat()


Candidate = Item[RetrievedSource]
MessageItem = Item[MessageSource]


def _found_by(state: ContextState) -> str | None:
    """Which query found this call's candidates (the user's words, rules or an LLM), in each one's source."""
    return state.rewrite.method if state.rewrite is not None else None


def _item(state: ContextState, text: str, source: RetrievedSource, score: float) -> Candidate:
    return Item(text=text, tokens=count_cached(text, model=state.model), source=source, score=score)


def _hit_item(
    state: ContextState, hit: HistoryHit, *, neighbour_of: int | None = None
) -> Item[MessageHitSource]:
    """A message as B5 shows it: whole, or the hit's excerpt, labelled with its seq, date and speaker."""
    turn = hit.turn
    who = turn.speaker if hit.span is None else f"{turn.speaker}, excerpt"
    label, text = f"[#{turn.seq} · {date_label(turn.created_at)} · {who}]", f" {turn.text.strip()}"
    source = MessageHitSource(
        id=turn.id,
        seq=turn.seq,
        created_at=turn.created_at.isoformat(),
        score=round(hit.relevance, 4),
        rank_score=round(hit.rank_score, 6),
        lexical=hit.lexical,
        similarity=hit.similarity,
        neighbour_of=neighbour_of,
        span=hit.span,
        query=_found_by(state),
    )
    tokens = count_cached_parts([label, text], model=state.model)
    return Item(text=label + text, tokens=tokens, source=source, score=hit.rank_score)


def _group_item(state: ContextState, turns: list[HistoryTurn], hit: Item[MessageHitSource]) -> MessageItem:
    """Consecutive turns under one label (the day's date once), each line "speaker: text": the group of a
    short hit and the turn it answers, or of hits that follow each other. Scored as its best hit."""
    first = turns[0]
    seqs = f"#{first.seq}" if len(turns) == 1 else f"#{first.seq}–{turns[-1].seq}"
    # Cut before each turn's text ("speaker:" | " text"): the parts recur from call to call and are
    # counted once (count_cached_parts).
    parts = [f"[{seqs} · {date_label(first.created_at)}]\n{first.speaker}:"]
    parts += [f" {turn.text.strip()}\n{after.speaker}:" for turn, after in pairwise(turns)]
    parts.append(f" {turns[-1].text.strip()}")
    best = hit.source
    source = TurnGroupSource(
        id=best.id,
        score=best.score,
        seq=first.seq,
        created_at=first.created_at.isoformat(),
        rank_score=best.rank_score,
        lexical=best.lexical,
        similarity=best.similarity,
        seqs=tuple(t.seq for t in turns),
        ids=tuple(t.id for t in turns),
        query=best.query,
    )
    tokens = count_cached_parts(parts, model=state.model)
    return Item(text="".join(parts), tokens=tokens, source=source, score=hit.score)


def quoted_trigrams(item: Item[RetrievedSource]) -> set[tuple[str, str, str]]:
    """The lower-cased word trigrams of what a message hit quotes, its label (_hit_item) left out. A hit of
    fewer tokens than REPEAT_MIN_TRIGRAMS has fewer trigrams, so it never repeats: not read (none)."""
    if item.tokens < REPEAT_MIN_TRIGRAMS:
        return set()
    words = _WORD_CHARACTERS.findall(item.text.partition("] ")[2].lower())
    return set(zip(words, words[1:], words[2:], strict=False))


def repeats(trigrams: set[tuple[str, str, str]], quoted: set[tuple[str, str, str]]) -> bool:
    """Whether a hit with these trigrams says mostly what is already quoted (REPEAT_SHARE); a short one never
    does (REPEAT_MIN_TRIGRAMS)."""
    return len(trigrams) >= REPEAT_MIN_TRIGRAMS and len(trigrams & quoted) >= REPEAT_SHARE * len(trigrams)


def _this_conversation(state: ContextState, found: Found) -> list[MessageItem]:
    """This conversation's hits, grouped into runs of turns, each followed by its exchange partner."""
    items, grouped = _grouped(state, found, [_hit_item(state, hit) for hit in found.history])
    hits = {hit.turn.id: hit for hit in found.history}
    partner_items: dict[str, MessageItem] = {}
    for item in items:
        partner = hits[item.source.id].partner
        if partner is not None and partner.turn.id not in grouped:
            partner_items[item.source.id] = _hit_item(state, partner, neighbour_of=item.source.seq)
    return with_partners(items, partner_items)


def _groupable(turn: HistoryTurn) -> bool:
    return turn.whole and turn.token_count <= GROUP_TURN_TOKENS


def _same_session(a: HistoryTurn, b: HistoryTurn) -> bool:
    return a.created_at.date() == b.created_at.date()


def _grouped(
    state: ContextState, found: Found, items: list[Item[MessageHitSource]]
) -> tuple[list[MessageItem], set[str]]:
    """The hits with consecutive whole turns of one session under one label (_group_item), in the hits'
    order (a group takes the place of its best hit), and the ids of the turns grouped."""
    hit_turns = {hit.turn.id: hit.turn for hit in found.history}
    whole = {i.source.id: i for i in items if i.source.span is None and _groupable(hit_turns[i.source.id])}
    turns = {t.id: t for t in found.answered}
    for key in whole:
        turns[key] = hit_turns[key]
    runs = _runs(sorted(turns.values(), key=lambda t: t.seq))
    if all(len(run) == 1 for run in runs):
        return list(items), set()
    run_of = {t.id: n for n, run in enumerate(runs) for t in run}
    placed: set[int] = set()
    grouped_items: list[MessageItem] = []
    grouped: set[str] = set()
    for item in items:
        key = item.source.id
        run = run_of.get(key) if key in whole else None
        if run is None or len(runs[run]) == 1:
            grouped_items.append(item)
        elif run not in placed:
            placed.add(run)
            grouped_items.append(_group_item(state, runs[run], item))
            grouped.update(t.id for t in runs[run])
    return grouped_items, grouped


def _runs(turns: list[HistoryTurn]) -> list[list[HistoryTurn]]:
    """`turns` (in seq order) cut into runs of turns that follow each other in one session."""
    runs: list[list[HistoryTurn]] = []
    for turn in turns:
        previous = runs[-1][-1] if runs else None
        follows = previous is not None and turn.position == previous.position + 1
        room = runs and sum(t.token_count for t in runs[-1]) + turn.token_count <= GROUP_MAX_TOKENS
        if follows and room and previous is not None and _same_session(previous, turn):
            runs[-1].append(turn)
        else:
            runs.append([turn])
    return runs


def with_partners(items: list[MessageItem], partners: dict[str, MessageItem]) -> list[MessageItem]:
    """The hits and their exchange partners (by the hit's message id): each right after its hit when it is
    short beside its hit (SHORT_PARTNER_SHARE), the others after all the hits, in the hits' order."""
    placed: list[MessageItem] = []
    after: list[MessageItem] = []
    for item in items:
        placed.append(item)
        partner = partners.get(item.source.id)
        if partner is not None:
            short = partner.tokens <= SHORT_PARTNER_SHARE * item.tokens
            (placed if short else after).append(partner)
    return placed + after


def _memory_item(state: ContextState, memory: MemoryHit) -> Item[ArchivalSource]:
    text = f"[memory, {', '.join([memory.kind, *memory.days])}] {memory.content}"
    source = ArchivalSource(
        id=memory.id,
        score=memory.relevance,
        rank_score=memory.rank_score,
        lexical=memory.lexical,
        similarity=memory.similarity,
        source_message_ids=memory.source_message_ids,
        query=_found_by(state),
    )
    return Item(
        text=text, tokens=count_cached(text, model=state.model), source=source, score=memory.rank_score
    )


def is_partner(source: RetrievedSource) -> bool:
    """Whether it is shown as the exchange partner of a hit (not found for itself)."""
    return isinstance(source, MessageHitSource) and source.neighbour_of is not None


def by_relevance(messages: Sequence[Candidate], memories: Sequence[Candidate]) -> list[Candidate]:
    """The memories placed among this conversation's hits on one scale: each, most relevant first, right
    before the first hit (not an exchange partner) that is less relevant than it. Interleaved by rank
    instead, the best memories took the first places whatever they matched."""
    pending = sorted(memories, key=lambda m: -m.source.score)
    placed: list[Candidate] = []
    for item in messages:
        if not is_partner(item.source):
            while pending and pending[0].source.score > item.source.score:
                placed.append(pending.pop(0))
        placed.append(item)
    return placed + pending


def _other_conversation_item(state: ContextState, hit: OtherConversationHit) -> Candidate:
    label = f'[conversation "{hit.conversation_title}", #{hit.seq} · {hit.day} · {hit.speaker}]'
    text = f"{label} {hit.excerpt}"
    source = OtherConversationSource(
        id=hit.id, seq=hit.seq, conversation_id=hit.conversation_id, score=hit.score, query=_found_by(state)
    )
    return _item(state, text, source, hit.score)


def _knowledge_item(state: ContextState, hit: ChunkHit | ImageHit) -> Candidate:
    """A chunk or an image description, cited."""
    if isinstance(hit, ChunkHit):
        chunk = ChunkSource(
            id=f"chunk:{hit.chunk_id}",
            document=hit.document_id,
            citation=hit.citation,
            score=round(hit.relevance, 4),
            rank_score=hit.rank_score,
            query=_found_by(state),
        )
        return _item(state, f"[{hit.citation}] {hit.content.strip()}", chunk, hit.relevance)
    image = ImageDescriptionSource(
        id=f"image:{hit.image_id}",
        image=hit.image_id,
        citation=hit.citation,
        score=round(hit.relevance, 4),
        query=_found_by(state),
    )
    return _item(state, f"[{hit.citation}] {hit.description.strip()}", image, hit.relevance)


def stand_ins(
    messages: Sequence[MessageItem], memories: Sequence[Item[ArchivalSource]]
) -> tuple[list[Candidate], list[Item[ArchivalSource]]]:
    """A memory taken from messages that are hits themselves (the memory agent's rules keep a statement
    verbatim) is placed right after the last of them, as its shorter stand-in, instead of by its own rank: the
    budget stage shows it only when the message did not fit (context.pipeline._place_retrieval). Returns the
    messages with their stand-ins, and the other memories."""
    position = {key: n for n, item in enumerate(messages) for key in _message_ids(item.source)}
    after: dict[int, list[Item[ArchivalSource]]] = {}
    others: list[Item[ArchivalSource]] = []
    for memory in memories:
        sources = memory.source.source_message_ids
        if sources and all(s in position for s in sources):
            after.setdefault(max(position[s] for s in sources), []).append(memory)
        else:
            others.append(memory)
    merged: list[Candidate] = [x for n, item in enumerate(messages) for x in (item, *after.get(n, []))]
    return merged, others


def _message_ids(source: MessageSource) -> tuple[str, ...]:
    """The messages a message item shows: a group's turns, else the message itself."""
    return source.ids if isinstance(source, TurnGroupSource) else (source.id,)


def load_retrieval(state: ContextState, *, room: int) -> None:
    """The retrieve stage: every candidate for B5, best first, in state.candidates. Memories are placed
    among this conversation's hits by relevance (by_relevance); other conversations' hits and knowledge are
    ranked by their own RRF scores and interleave with those by rank, since the scales differ."""
    rewrite = state.rewrite
    if rewrite is None:
        return
    # A rules rewrite appends terms of the recent history: they weigh less than the user's own words.
    expansion = " ".join(rewrite.terms) if rewrite.method == "rules" else ""
    query = rewrite.query if rewrite.method != "rules" else state.layout.user_message
    scope = Scope(conversation=state.conversation, before_seq=state.history_until)
    found = candidates_find(question=query, expansion=expansion, scope=scope, room=room)
    if found.vectors_missing:
        # Have them computed (a write of the call: a dry run queues nothing); while a run is queued this costs
        # one cache operation.
        conversation_id = state.conversation.pk
        state.writes.append(lambda: message_vectors_request(conversation_id=conversation_id))
    for degradation in found.degradations:
        state.degrade("retrieve", degradation.code, degradation.message)
    memories = [_memory_item(state, m) for m in found.memories]
    messages, memories = stand_ins(_this_conversation(state, found), memories)
    others = [_other_conversation_item(state, hit) for hit in found.other_conversations]
    knowledge = [_knowledge_item(state, hit) for hit in found.knowledge]
    sources = [by_relevance(messages, memories), others, knowledge]
    # Each source's items come in its placing order (this conversation's best first, spread over sessions
    # for a question naming a participant, then the hits' exchange partners): kept, not re-sorted.
    ranked: list[tuple[int, int, Candidate]] = []
    for order, items in enumerate(sources):
        ranked += [(rank, order, item) for rank, item in enumerate(items)]
    merged = [item for _, _, item in sorted(ranked, key=lambda r: (r[0], r[1]))]
    top_k = (state.request.retrieval or {}).get("top_k")
    state.candidates += merged[:top_k] if top_k else merged
