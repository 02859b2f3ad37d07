"""This conversation's candidates: the messages the question finds in its whole history (retrieval.history:
BM25 and local vectors over every passage, fused with RRF), best first, each with the other half of its
exchange, and the turns its short hits answer. How many are read follows the room in tokens and the size of
what they hold, never a fixed count."""

from collections.abc import Callable
from typing import Any

from conversations.models import Message
from providers.dates import annotate
from retrieval.candidates import HistoryHit, HistoryTurn
from retrieval.excerpts import EXCERPT_MIN_WORDS, excerpt_span
from retrieval.history import ConversationIndex, IndexedMessage, PassageHit, mean_passage_tokens, search
from retrieval.questions import asked, focused, preferences
from tenants.statements import column_by_pk

# Passages are read PASSAGE_OVERFETCH times the room (at the conversation's mean passage size), between
# MIN_PASSAGES and MAX_PASSAGES (the cost of a call stays bounded), and hits are kept best first until they
# hold HIT_OVERFETCH times the room (the placing skips what the prompt shows already, and what repeats).
PASSAGE_OVERFETCH = 4.0
HIT_OVERFETCH = 2.0
MIN_PASSAGES = 24
MAX_PASSAGES = 2400
MIN_CANDIDATES = 8
# A hit's relevance is the larger of its cosine similarity to the question and the share of the question's
# (IDF-weighted) words it holds; below this it is not worth prompt tokens.
MIN_RELEVANCE = 0.15
# Facts about a person the question names are spread over sessions: the n-th hit of one day weighs
# SESSION_DECAY**n, so that several sessions are read before a day's weaker hits. Not for other questions:
# most ask for one fact, whose neighbours in its own session are the next best evidence.
SESSION_DECAY = 0.85
# A turn this short ("Haha yes, same!", "I went there yesterday") says little alone: it brings the turn
# before it (what it answers).
SHORT_TURN_TOKENS = 24
# A hit brings the other half of its exchange, ranked at this share of its score.
NEIGHBOUR_SHARE = 0.5

QueryVector = Callable[[str], Any]


def relevance(hit: PassageHit) -> float:
    """How well a hit answers, on an absolute scale a client can read (0 to 1): the larger of its cosine
    similarity to the question and the share of the question's weighted words it holds."""
    return max(hit.similarity, hit.lexical)


def passage_limit(index: ConversationIndex, room: int) -> int:
    """How many passages to read for `room` tokens of hits (PASSAGE_OVERFETCH at the mean passage size)."""
    wanted = PASSAGE_OVERFETCH * room / max(1.0, mean_passage_tokens(index))
    return int(min(MAX_PASSAGES, max(MIN_PASSAGES, wanted)))


def history_hits(
    index: ConversationIndex, query: str, query_vector: QueryVector, *, before_seq: int | None, room: int
) -> tuple[list[HistoryHit], list[HistoryTurn]]:
    """The best messages for the question, best first, each with its exchange partner, and the turns that
    short hits answer. `query_vector` embeds the question (called once BM25 has scored the passages)."""
    question = asked(query, index.names)
    vector_query = focused(query)
    hits = search(
        index,
        query=vector_query,
        lexical_query=question.lexical,
        query_vector=lambda: query_vector(vector_query),  # embedded meanwhile, waited for after BM25
        before_seq=before_seq if before_seq is not None else index.indexed_seq,
        limit=passage_limit(index, room),
        preferences=preferences(question),
    )
    hits = [h for h in hits if relevance(h) >= MIN_RELEVANCE]
    best = _best_hits(hits, room=room, spread=bool(question.names))
    partners = _partners(index, best, hits)
    neighbours = _answered_turns(index, best)
    contents = _contents([*best, *(p.message.id for p in partners.values()), *(m.id for m in neighbours)])
    found = []
    for message_id, (hit, score) in best.items():
        partner = partners.get(message_id)
        paired = None
        if partner is not None:
            paired = _history_hit(index, partner, contents, score * NEIGHBOUR_SHARE)
        found.append(_history_hit(index, hit, contents, score, paired))
    answered = [_turn(index, m, contents.get(m.id, ""), whole_text=True) for m in neighbours]
    return found, answered


def _history_hit(
    index: ConversationIndex,
    hit: PassageHit,
    contents: dict[str, str],
    rank_score: float,
    partner: HistoryHit | None = None,
) -> HistoryHit:
    """A message as B5 would show it: whole when it is one passage, else the hit's passage as an excerpt."""
    message = hit.message
    content = contents.get(message.id, "")
    span = None if len(message.passages) == 1 else excerpt_span(content, hit.start, hit.end)
    shown = content if span is None else content[span[0] : span[1]]
    return HistoryHit(
        turn=_turn(index, message, shown, whole_text=span is None),
        span=span,
        relevance=relevance(hit),
        rank_score=rank_score,
        lexical=hit.lexical,
        similarity=hit.similarity,
        partner=partner,
    )


def _turn(index: ConversationIndex, message: IndexedMessage, shown: str, *, whole_text: bool) -> HistoryTurn:
    """`shown` with its relative dates resolved. The index read the whole text of a completed message and
    found its relative dates (`periods`): one shown whole without any is shown as it is, unread again."""
    plain = whole_text and message.completed and not message.periods
    return HistoryTurn(
        id=message.id,
        seq=message.seq,
        position=index.by_seq[message.seq],
        role=message.role,
        speaker=message.name or message.role,
        created_at=message.created_at,
        token_count=message.token_count,
        whole=len(message.passages) == 1,
        text=shown if plain else annotate(shown, message.created_at.date()),
    )


def _best_per_message(hits: list[PassageHit]) -> dict[str, tuple[PassageHit, float]]:
    """Each message of the hits with its best passage and that passage's score."""
    best: dict[str, tuple[PassageHit, float]] = {}
    for hit in hits:
        if hit.message.id not in best or hit.score > best[hit.message.id][1]:
            best[hit.message.id] = (hit, hit.score)
    return best


def _contents(ids: list[str]) -> dict[str, str]:
    return column_by_pk(Message, "content", ids)


def _best_hits(hits: list[PassageHit], *, room: int, spread: bool) -> dict[str, tuple[PassageHit, float]]:
    """The best messages, best first, each with its best passage and its score, until they hold
    HIT_OVERFETCH times the room (at least MIN_CANDIDATES). With `spread`, each day's n-th message weighs
    SESSION_DECAY**n in that order (a person's facts are spread over sessions); the scores reported stay
    their own."""
    decay = SESSION_DECAY if spread else 1.0
    per_day: dict[object, int] = {}
    ranked = []
    for message_id, (hit, score) in sorted(_best_per_message(hits).items(), key=lambda e: -e[1][1]):
        day = hit.message.created_at.date()
        ranked.append((score * decay ** per_day.get(day, 0), message_id, hit, score))
        per_day[day] = per_day.get(day, 0) + 1
    ranked.sort(key=lambda r: -r[0])
    best: dict[str, tuple[PassageHit, float]] = {}
    tokens, wanted = 0, HIT_OVERFETCH * room
    for _weighed, message_id, hit, score in ranked:
        if tokens >= wanted and len(best) >= MIN_CANDIDATES:
            break
        best[message_id] = (hit, score)
        whole = len(hit.message.passages) == 1
        tokens += hit.message.token_count if whole else int(EXCERPT_MIN_WORDS * 4 / 3)
    return best


def _partners(
    index: ConversationIndex, best: dict[str, tuple[PassageHit, float]], hits: list[PassageHit]
) -> dict[str, PassageHit]:
    """A question and its answer belong together: for each hit, the other half of its exchange (the answer
    after a user message, the question before an assistant's) with its passage that matched best (else its
    first), by the hit's message id. A partner that is itself a hit is left to its own rank."""
    best_passage: dict[str, PassageHit] = {}
    for hit in hits:
        best_passage.setdefault(hit.message.id, hit)
    taken = set(best)
    partners: dict[str, PassageHit] = {}
    for message_id, (hit, _score) in best.items():
        other = _exchange_partner(index, hit.message.seq)
        if other is None or other.id in taken:
            continue
        taken.add(other.id)
        partners[message_id] = best_passage.get(other.id) or _first_passage(index, other)
    return partners


def _exchange_partner(index: ConversationIndex, seq: int) -> IndexedMessage | None:
    """The other half of a hit's exchange: the reply after a user message, the question before an
    assistant's reply; between named people of one role, the other speaker's turn before it, in the same
    session (what it answers)."""
    position = index.by_seq.get(seq)
    if position is None:
        return None
    message = index.messages[position]
    named = message.name and message.role == Message.Role.USER
    step = -1 if named or message.role != Message.Role.USER else 1
    if not 0 <= position + step < len(index.messages):
        return None
    other = index.messages[position + step]
    if named:
        return other if other.name and other.name != message.name and _same_session(other, message) else None
    wanted = Message.Role.ASSISTANT if step == 1 else Message.Role.USER
    return other if other.role == wanted else None


def _first_passage(index: ConversationIndex, message: IndexedMessage) -> PassageHit:
    passage = index.passages[message.passages[0]]
    return PassageHit(
        message=message, start=passage.start, end=passage.end, score=0.0, lexical=0.0, similarity=0.0
    )


def _short(message: IndexedMessage) -> bool:
    return len(message.passages) == 1 and message.token_count <= SHORT_TURN_TOKENS


def _same_session(a: IndexedMessage, b: IndexedMessage) -> bool:
    return a.created_at.date() == b.created_at.date()


def _answered_turns(
    index: ConversationIndex, best: dict[str, tuple[PassageHit, float]]
) -> list[IndexedMessage]:
    """For each short hit (SHORT_TURN_TOKENS), the turn before it in the same session, which it answers."""
    found = []
    for hit, _score in best.values():
        position = index.by_seq.get(hit.message.seq)
        if position and _short(hit.message):
            before = index.messages[position - 1]
            if before.id not in best and len(before.passages) == 1 and _same_session(before, hit.message):
                found.append(before)
    return found
