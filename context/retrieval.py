"""B5 candidates: what the question finds in the end user's archival memories, in the whole history of this
conversation (memory.history_index: BM25 and local vectors over every passage, fused with RRF) and in the
user's other conversations. Each hit becomes an Item the budget stage can place: a whole message (or, for a
long one, its best passage) labelled with its seq, date and role, scored so the budget keeps the best and a
client can tell a weak hit from a strong one."""

import dataclasses
import re
from datetime import datetime
from itertools import islice
from typing import Any

from context.state import ContextState
from conversations.models import Message
from conversations.tasks import message_vectors_request
from knowledge.retrieval import knowledge_candidates
from memory.archival import archival_search
from memory.history_index import (
    ConversationIndex,
    IndexedMessage,
    PassageHit,
    Preference,
    conversation_index,
    lexical_shares,
    mean_passage_tokens,
    said_by,
    said_in,
    search,
)
from memory.recall import recall_other_conversations
from memory.selectors import archival_exists
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import Item
from providers.dates import Period, annotate, question_period
from providers.embeddings import embed_query
from providers.passages import PASSAGE_WORDS

# How many candidates a question reads follows the room in tokens and the size of what it finds, never a
# fixed count: passages are read PASSAGE_OVERFETCH times the room (at the conversation's mean passage size),
# between MIN_PASSAGES and MAX_PASSAGES (the cost of a call stays bounded), and hits are kept best first until
# they hold HIT_OVERFETCH times the room (the placing skips what the prompt shows already, and what repeats).
PASSAGE_OVERFETCH = 4.0
HIT_OVERFETCH = 2.0
MIN_PASSAGES = 24
MAX_PASSAGES = 2400
MIN_CANDIDATES = 8
ARCHIVAL_CANDIDATES = 8
OTHER_CONVERSATION_CANDIDATES = 8
# A hit's relevance is the larger of its cosine similarity to the question and the share of the question's
# (IDF-weighted) words it holds; below this it is not worth prompt tokens.
MIN_RELEVANCE = 0.15
# A question that speaks of a participant (by name, or of the asker as "I") is answered by what that person
# said: their turns weigh this many times more.
SPEAKER_PRIOR = 2.5
FIRST_PERSON = frozenset({"i", "my", "me", "mine", "i'm", "i've", "i'd", "myself"})
# A question that names a period ("in May 2023") asks about what happened then: messages said in it, or whose
# "yesterday" or "last month" falls in it, weigh this many times more.
PERIOD_PRIOR = 2.0
# Facts about a person the question names are spread over sessions: the n-th hit of one day weighs
# SESSION_DECAY**n, so that several sessions are read before a day's weaker hits. Not for other questions:
# most ask for one fact, whose neighbours in its own session are the next best evidence.
SESSION_DECAY = 0.85
# A turn this short ("Haha yes, same!", "I went there yesterday") says little alone: it brings the turn
# before it (what it answers), and consecutive turns share one label.
SHORT_TURN_TOKENS = 24
# Consecutive hits of a session share one label when each is at most this long (a chat's turns); a longer
# message stands alone, its label small beside it.
GROUP_TURN_TOKENS = 80
# A group takes one place in the ranking, at its best hit's: it stops at this many tokens, so that a long
# run of weak hits cannot ride on one strong one.
GROUP_MAX_TOKENS = 240
# A long message's excerpt shows at least a full passage's words (its passage and what follows it): a short
# passage (a heading, the tail of a reply) alone rarely says enough to be used.
EXCERPT_MIN_WORDS = PASSAGE_WORDS
_WORD = re.compile(r"\S+")
# A hit brings the other half of its exchange, worth this share of its score.
NEIGHBOUR_SHARE = 0.5
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
_NAME_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_POSSESSIVE = re.compile(r"['’]s?$")


def focused(question: str) -> str:
    """The text a question is embedded with: its words, whatever its phrasing (the pipeline embeds it ahead
    of the search)."""
    return " ".join(question.split())


@dataclasses.dataclass(frozen=True)
class Asked:
    """What a question says about whom and when: the participants it names (case-folded), whether it speaks
    of the asker ("I", "my"), the period it names, and its words without the names (for BM25: the speaker
    preference stands for them, and a greeting that names the person matches nothing else)."""

    names: frozenset[str]
    asker: bool
    period: Period | None
    lexical: str


def asked(question: str, participants: dict[str, str]) -> Asked:
    """Read a question against the conversation's named speakers (case-folded -> as written). A participant
    is named when one of the words of their name appears capitalised in the question."""
    named: set[str] = set()
    words = _NAME_WORD.findall(question)
    capitalised = {_POSSESSIVE.sub("", w) for w in words if w[:1].isupper()}
    for key, written in participants.items():
        parts = {p for p in _NAME_WORD.findall(written) if len(p) > 1}
        if parts & capitalised:
            named.add(key)
    lexical = question
    for key in named:
        for part in _NAME_WORD.findall(participants[key]):
            lexical = re.sub(rf"\b{re.escape(part)}(?:'s|’s)?\b", " ", lexical, flags=re.IGNORECASE)
    asker = bool({w.lower() for w in words} & FIRST_PERSON)
    return Asked(frozenset(named), asker, question_period(question), " ".join(lexical.split()))


def date_label(created_at: datetime) -> str:
    """The day a hit was said: the date only (the seq orders a day's messages), so a label costs little
    beside a short turn."""
    return created_at.strftime("%Y-%m-%d")


def relevance(hit: PassageHit) -> float:
    """How well a hit answers, on an absolute scale a client can read (0 to 1): the larger of its cosine
    similarity to the question and the share of the question's weighted words it holds."""
    return max(hit.similarity, hit.lexical)


def _query_vector(state: ContextState, query: str) -> Any:
    vector, reason = embed_query(query)
    if vector is None:
        state.degrade("retrieve", "embeddings_unavailable", f"Lexical search only: {reason}")
    return vector


def _best_per_message(hits: list[PassageHit]) -> dict[str, tuple[PassageHit, float]]:
    """Each message of the hits with its best passage and that passage's score."""
    best: dict[str, tuple[PassageHit, float]] = {}
    for hit in hits:
        if hit.message.id not in best or hit.score > best[hit.message.id][1]:
            best[hit.message.id] = (hit, hit.score)
    return best


def _contents(ids: list[str]) -> dict[str, str]:
    rows = Message.objects.filter(pk__in=ids).values_list("id", "content")
    return {str(pk): content for pk, content in rows}


def speaker(message: IndexedMessage) -> str:
    return message.name or message.role


def _hit_item(state: ContextState, hit: PassageHit, content: str, score: float, **extra: Any) -> Item:
    """A message as B5 shows it: whole when it is one passage, else the hit's passage, labelled with its
    seq, date and speaker; its relative dates resolved ("yesterday (2023-05-07)")."""
    message = hit.message
    whole = len(message.passages) == 1
    start, end = (0, len(content)) if whole else excerpt_span(content, hit.start, hit.end)
    text = annotate(content[start:end], message.created_at.date())
    who = speaker(message) if whole else f"{speaker(message)}, excerpt"
    label = f"[#{message.seq} · {date_label(message.created_at)} · {who}]"
    body = f"{label} {text.strip()}"
    source = {
        "kind": "message",
        "id": message.id,
        "seq": message.seq,
        "created_at": message.created_at.isoformat(),
        "score": round(relevance(hit), 4),
        "rank_score": round(score, 6),
        "lexical": hit.lexical,
        "similarity": hit.similarity,
        **extra,
    }
    if not whole:
        source["span"] = [start, end]
    return Item(text=body, tokens=count_cached(body, model=state.model), source=source, score=score)


def _group_item(
    state: ContextState, turns: list[IndexedMessage], contents: dict[str, str], hit: Item
) -> Item:
    """Consecutive turns under one label (the day's date once), each line "speaker: text": the group of a
    short hit and the turn it answers, or of hits that follow each other. Scored as its best hit."""
    first = turns[0]
    seqs = f"#{first.seq}" if len(turns) == 1 else f"#{first.seq}–{turns[-1].seq}"
    lines = [f"[{seqs} · {date_label(first.created_at)}]"]
    for turn in turns:
        text = annotate(contents.get(turn.id, ""), turn.created_at.date())
        lines.append(f"{speaker(turn)}: {text.strip()}")
    body = "\n".join(lines)
    source = {
        "id": first.id,
        **hit.source,
        "seq": first.seq,
        "seqs": [t.seq for t in turns],
        "ids": [t.id for t in turns],
        "created_at": first.created_at.isoformat(),
    }
    return Item(text=body, tokens=count_cached(body, model=state.model), source=source, score=hit.score)


def excerpt_span(content: str, start: int, end: int) -> tuple[int, int]:
    """A passage of a long message, grown to at least EXCERPT_MIN_WORDS words with the text that follows it
    (or, at the message's end, precedes it): a short passage (a heading, the tail of a reply) alone rarely
    says enough to be used. Reads the words it needs, not the whole message."""
    missing = EXCERPT_MIN_WORDS - len(_WORD.findall(content, start, end))
    if missing <= 0:
        return start, end
    after = list(islice(_WORD.finditer(content, end), missing))
    if after:
        end = after[-1].end()
    missing -= len(after)
    if missing > 0:
        before = _words_before(content, start, missing)
        start = before[-min(missing, len(before))] if before else start
    return start, end


def quoted_trigrams(item: Item) -> set[tuple[str, str, str]]:
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


def _words_before(content: str, start: int, wanted: int) -> list[int]:
    """The starts of the words before `start`, at least the last `wanted` of them (all when there are fewer):
    read from a window before `start` that doubles until it holds them, not from the message's beginning (a
    hit at the end of a long reply read all of it, 4 ms of an 8,000-token call on BEAM-128K)."""
    window = 16 * wanted
    while True:
        low = max(0, start - window)
        starts = [word.start() for word in _WORD.finditer(content, low, start)]
        if low > 0 and starts and starts[0] == low and not content[low - 1].isspace():
            starts = starts[1:]  # the window began inside a word: its start lies further back
        if len(starts) >= wanted or low == 0:
            return starts
        window *= 2


def _partners(
    index: ConversationIndex, best: dict[str, Any], hits: list[PassageHit]
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


def preferences(question: Asked) -> tuple[Preference, ...]:
    """The speaker and period preferences a question's words call for (SPEAKER_PRIOR, PERIOD_PRIOR)."""
    found: list[Preference] = []
    if question.names or question.asker:
        names, asker = question.names, question.asker
        found.append((lambda index: said_by(index, names, user=asker), SPEAKER_PRIOR))
    if question.period is not None:
        period = question.period
        found.append((lambda index: said_in(index, period), PERIOD_PRIOR))
    return tuple(found)


def passage_limit(index: ConversationIndex, room: int) -> int:
    """How many passages to read for `room` tokens of hits (PASSAGE_OVERFETCH at the mean passage size)."""
    wanted = PASSAGE_OVERFETCH * room / max(1.0, mean_passage_tokens(index))
    return int(min(MAX_PASSAGES, max(MIN_PASSAGES, wanted)))


def _this_conversation(state: ContextState, index: ConversationIndex, query: str, *, room: int) -> list[Item]:
    if index.missing_vectors:
        # Vectors still missing (a server restarted mid-backlog, or appends while vectors were off): have
        # them computed; while a run is queued this costs one cache operation.
        message_vectors_request(conversation_id=state.conversation.pk)
    before = state.history_until if state.history_until is not None else index.indexed_seq
    question = asked(query, index.names)
    vector_query = focused(query)
    hits = search(
        index,
        query=vector_query,
        lexical_query=question.lexical,
        query_vector=lambda: _query_vector(state, vector_query),  # embedded meanwhile, waited for after BM25
        before_seq=before,
        limit=passage_limit(index, room),
        preferences=preferences(question),
    )
    hits = [h for h in hits if relevance(h) >= MIN_RELEVANCE]
    best = _best_hits(hits, room=room, spread=bool(question.names))
    partners = _partners(index, best, hits)
    neighbours = _answered_turns(index, best)
    contents = _contents([*best, *(p.message.id for p in partners.values()), *(m.id for m in neighbours)])
    items = [_hit_item(state, hit, contents.get(hit.message.id, ""), score) for hit, score in best.values()]
    items, grouped = _grouped(state, index, items, neighbours, contents)
    partner_items = {
        key: _hit_item(
            state,
            partners[key],
            contents.get(partners[key].message.id, ""),
            item.score * NEIGHBOUR_SHARE,
            neighbour_of=item.source["seq"],
        )
        for item in items
        if (key := str(item.source["id"])) in partners and partners[key].message.id not in grouped
    }
    return with_partners(items, partner_items)


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


def _short(message: IndexedMessage) -> bool:
    return len(message.passages) == 1 and message.token_count <= SHORT_TURN_TOKENS


def _groupable(message: IndexedMessage) -> bool:
    return len(message.passages) == 1 and message.token_count <= GROUP_TURN_TOKENS


def _same_session(a: IndexedMessage, b: IndexedMessage) -> bool:
    return a.created_at.date() == b.created_at.date()


def _answered_turns(index: ConversationIndex, best: dict[str, Any]) -> list[IndexedMessage]:
    """For each short hit (SHORT_TURN_TOKENS), the turn before it in the same session, which it answers."""
    found = []
    for hit, _score in best.values():
        position = index.by_seq.get(hit.message.seq)
        if position and _short(hit.message):
            before = index.messages[position - 1]
            if before.id not in best and len(before.passages) == 1 and _same_session(before, hit.message):
                found.append(before)
    return found


def _grouped(
    state: ContextState,
    index: ConversationIndex,
    items: list[Item],
    neighbours: list[IndexedMessage],
    contents: dict[str, str],
) -> tuple[list[Item], set[str]]:
    """The hits with consecutive whole turns of one session under one label (_group_item), in the hits'
    order (a group takes the place of its best hit), and the ids of the turns grouped."""
    whole = {
        str(i.source["id"]): i
        for i in items
        if "span" not in i.source and _groupable(index.messages[index.by_seq[int(i.source["seq"])]])
    }
    turns = {m.id: m for m in neighbours}
    for item in whole.values():
        turns[str(item.source["id"])] = index.messages[index.by_seq[int(item.source["seq"])]]
    runs = _runs(sorted(turns.values(), key=lambda m: m.seq), index)
    if all(len(run) == 1 for run in runs):
        return items, set()
    run_of = {m.id: n for n, run in enumerate(runs) for m in run}
    placed: set[int] = set()
    grouped_items: list[Item] = []
    grouped: set[str] = set()
    for item in items:
        key = str(item.source["id"])
        run = run_of.get(key) if key in whole else None
        if run is None or len(runs[run]) == 1:
            grouped_items.append(item)
        elif run not in placed:
            placed.add(run)
            grouped_items.append(_group_item(state, runs[run], contents, item))
            grouped.update(m.id for m in runs[run])
    return grouped_items, grouped


def _runs(turns: list[IndexedMessage], index: ConversationIndex) -> list[list[IndexedMessage]]:
    """`turns` (in seq order) cut into runs of turns that follow each other in one session."""
    runs: list[list[IndexedMessage]] = []
    for turn in turns:
        previous = runs[-1][-1] if runs else None
        follows = previous is not None and index.by_seq[turn.seq] == index.by_seq[previous.seq] + 1
        room = runs and sum(t.token_count for t in runs[-1]) + turn.token_count <= GROUP_MAX_TOKENS
        if follows and room and previous is not None and _same_session(previous, turn):
            runs[-1].append(turn)
        else:
            runs.append([turn])
    return runs


def with_partners(items: list[Item], partners: dict[str, Item]) -> list[Item]:
    """The hits and their exchange partners (by the hit's message id): each right after its hit when it is
    short beside its hit (SHORT_PARTNER_SHARE), the others after all the hits, in the hits' order."""
    placed: list[Item] = []
    after: list[Item] = []
    for item in items:
        placed.append(item)
        partner = partners.get(str(item.source["id"]))
        if partner is not None:
            short = partner.tokens <= SHORT_PARTNER_SHARE * item.tokens
            (placed if short else after).append(partner)
    return placed + after


def _archival(state: ContextState, index: ConversationIndex, query: str, expansion: str) -> list[Item]:
    """The end user's archival memories the question finds, each scored on the history's scale (relevance:
    the larger of its cosine similarity with what the question is about and its lexical share in this
    conversation), so that the placing can rank it among the message hits (by_relevance)."""
    conversation = state.conversation
    if conversation.end_user_id is None or not archival_exists(end_user_id=conversation.end_user_id):
        return []
    assert conversation.end_user is not None  # end_user_id was checked above
    focus = focused(query)
    outcome = archival_search(
        end_user=conversation.end_user, query=focus, limit=ARCHIVAL_CANDIDATES, expansion=expansion
    )
    for degradation in outcome.degradations:
        state.degrade("retrieve", degradation["code"], degradation["message"])
    lexical = lexical_shares(index, focus, [hit.memory.content for hit in outcome.hits])
    said_on = _source_days([str(i) for hit in outcome.hits for i in hit.memory.source_message_ids or []])
    items = []
    for hit, lexical_share in zip(outcome.hits, lexical, strict=True):
        memory = hit.memory
        days = sorted({said_on[str(i)] for i in memory.source_message_ids or [] if str(i) in said_on})
        text = f"[memory, {', '.join([memory.kind, *days])}] {memory.content}"
        source = {
            "kind": "archival",
            "id": str(memory.id),
            "score": max(hit.similarity, lexical_share),
            "rank_score": hit.score,
            "lexical": lexical_share,
            "similarity": hit.similarity,
            "source_message_ids": [str(i) for i in memory.source_message_ids or []],
        }
        items.append(
            Item(text=text, tokens=count_cached(text, model=state.model), source=source, score=hit.score)
        )
    return items


def _source_days(ids: list[str]) -> dict[str, str]:
    """The day each of these messages was said: a memory carries the date of what it was taken from."""
    if not ids:
        return {}
    rows = Message.objects.filter(pk__in=ids).values_list("id", "created_at")
    return {str(pk): created.date().isoformat() for pk, created in rows}


def by_relevance(messages: list[Item], memories: list[Item]) -> list[Item]:
    """The memories placed among this conversation's hits on one scale: each, most relevant first, right
    before the first hit (not an exchange partner) that is less relevant than it. Interleaved by rank
    instead, the eight best memories took the first places whatever they matched: on BEAM-128K (all 20,
    in-process on a copy of one load) ER 0.739 -> 0.745 at 2,000 tokens (information extraction +0.017,
    preference following +0.026), 0.887 -> 0.886 at 8,000."""
    pending = sorted(memories, key=lambda m: -float(m.source["score"]))
    placed: list[Item] = []
    for item in messages:
        if "neighbour_of" not in item.source:
            while pending and float(pending[0].source["score"]) > float(item.source["score"]):
                placed.append(pending.pop(0))
        placed.append(item)
    return placed + pending


def _other_conversations(state: ContextState, query: str, expansion: str) -> list[Item]:
    hits = recall_other_conversations(
        conversation=state.conversation, query=query, limit=OTHER_CONVERSATION_CANDIDATES, expansion=expansion
    )
    items = []
    for hit in hits:
        text = f'[conversation "{hit.conversation_title}", message #{hit.seq}, {hit.role}] {hit.excerpt}'
        source = {
            "kind": "message",
            "id": hit.id,
            "seq": hit.seq,
            "conversation_id": hit.conversation_id,
            "score": hit.score,
        }
        items.append(
            Item(text=text, tokens=count_cached(text, model=state.model), source=source, score=hit.score)
        )
    return items


def _knowledge(state: ContextState, query: str) -> list[Item]:
    """Documents and code in the conversation's scope, each cited (knowledge.retrieval)."""
    found = knowledge_candidates(conversation=state.conversation, query=query, min_relevance=MIN_RELEVANCE)
    return [
        Item(text=c.text, tokens=count_cached(c.text, model=state.model), source=c.source, score=c.score)
        for c in found
    ]


def stand_ins(messages: list[Item], memories: list[Item]) -> tuple[list[Item], list[Item]]:
    """A memory taken from messages that are hits themselves (the memory agent's rules keep a statement
    verbatim) is placed right after the last of them, as its shorter stand-in, instead of by its own rank: the
    budget stage shows it only when the message did not fit (context.pipeline._place_retrieval). Returns the
    messages with their stand-ins, and the other memories."""
    position = {
        str(key): n for n, item in enumerate(messages) for key in item.source.get("ids", [item.source["id"]])
    }
    after: dict[int, list[Item]] = {}
    others: list[Item] = []
    for memory in memories:
        sources = memory.source.get("source_message_ids") or []
        if sources and all(s in position for s in sources):
            after.setdefault(max(position[s] for s in sources), []).append(memory)
        else:
            others.append(memory)
    merged = [x for n, item in enumerate(messages) for x in (item, *after.get(n, []))]
    return merged, others


def load_retrieval(state: ContextState, *, room: int) -> None:
    """The retrieve stage: every candidate for B5, best first, in state.candidates. Memories are placed
    among this conversation's hits by relevance (by_relevance); other conversations' hits and knowledge are
    ranked by their own RRF scores and interleave with those by rank, since the scales differ."""
    rewrite = state.rewrite
    if rewrite is None:
        return
    found = len(state.candidates)
    # A rules rewrite appends terms of the recent history: they weigh less than the user's own words.
    expansion = " ".join(rewrite.terms) if rewrite.method == "rules" else ""
    query = rewrite.query if rewrite.method != "rules" else state.layout.user_message
    # Read first: the other conversations (the database's full-text index), knowledge (its index's
    # freshness, the images, BM25 before its wait for the vector) and the archival memories' lexical ranking
    # then run while the question is still being embedded on another thread, instead of after this
    # conversation's search has waited for it.
    others = _other_conversations(state, query, expansion)
    knowledge = _knowledge(state, query)
    index = conversation_index(state.conversation.pk)
    memories = _archival(state, index, query, expansion)
    messages, memories = stand_ins(_this_conversation(state, index, query, room=room), memories)
    sources = [by_relevance(messages, memories), others, knowledge]
    # Each source's items come in its placing order (this conversation's best first, spread over sessions
    # for a question naming a participant, then the hits' exchange partners): kept, not re-sorted.
    ranked: list[tuple[int, int, Item]] = []
    for order, items in enumerate(sources):
        ranked += [(rank, order, item) for rank, item in enumerate(items)]
    merged = [item for _, _, item in sorted(ranked, key=lambda r: (r[0], r[1]))]
    top_k = (state.request.retrieval or {}).get("top_k")
    state.candidates += merged[:top_k] if top_k else merged
    for item in state.candidates[found:]:
        item.source["query"] = rewrite.method  # which query found it: the user's words, rules or an LLM
