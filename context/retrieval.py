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
from conversations.embedding import message_vectors_request
from conversations.models import Message
from knowledge.retrieval import knowledge_candidates
from memory.archival import archival_search
from memory.history_index import (
    ConversationIndex,
    IndexedMessage,
    PassageHit,
    conversation_index,
    lexical_shares,
    search,
)
from memory.recall import recall_other_conversations
from memory.selectors import archival_exists
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import Item
from providers.embeddings import embed_query

# Hits of this conversation considered per question (the budget takes what fits, best first): one per
# CANDIDATE_TOKENS of the room B5 may take, between MIN_CANDIDATES and MESSAGE_CANDIDATES. A large budget,
# whose B5 is held to a few hundred tokens, does not read and count sixty messages to place three.
MESSAGE_CANDIDATES = 60
# Asked what the user said, the answer is in the user's own messages, which are short (a BEAM-128K user
# message is 81 tokens on average, a reply 977): twice as many fit, and the relevance floor does not apply.
# BEAM-128K, all 20, in-process on a copy of one load, with the user's messages ranked apart: ER 0.859 ->
# 0.886 at 8,000 tokens (event ordering 0.725 -> 0.924), 0.733 -> 0.734 at 2,000; three times as many:
# 0.875; without partners for these questions: no change.
SAID_CANDIDATES = 120
MIN_CANDIDATES = 8
CANDIDATE_TOKENS = 50
ARCHIVAL_CANDIDATES = 8
OTHER_CONVERSATION_CANDIDATES = 8
# A hit's relevance is the larger of its cosine similarity to the question and the share of the question's
# (IDF-weighted) words it holds; below this it is not worth prompt tokens.
MIN_RELEVANCE = 0.15
# Said with "I", "my", "me": the user's own messages are what the question is about.
SELF_REFERENCE = frozenset({"i", "my", "me", "mine", "i'm", "i've", "i'd", "myself"})
USER_PRIOR = 2.5
# Asked about what the user said ("the order in which I brought up…", "the scores I mentioned"): their own
# messages are the answer, so they weigh SAID_PRIOR times more. On BEAM-128K (all 20, in-process on a copy of
# one load): ER 0.723 -> 0.727 at 2,000 tokens and 0.832 -> 0.845 at 8,000 (event ordering 0.330 -> 0.376
# and 0.506 -> 0.607); a prior of 1,000 (their messages only) gave the same, and past tenses only ("I
# mentioned", not "did I mention") 0.729 / 0.845.
SAID_BY_USER = re.compile(
    r"\bI (?:br(?:ought|ing) up|mention(?:ed)?|ask(?:ed)?|sa(?:id|y)|t(?:old|ell) you|shared?|discuss(?:ed)?|"
    r"raised?|talk(?:ed)? about|described?|wr(?:ote|ite))\b",
    re.IGNORECASE,
)
SAID_PRIOR = 10.0
# And ranked among themselves (memory.history_index.search, user_apart): in one ranking of both sides, the
# assistant's replies (five passages each on BEAM) pushed many of the user's messages past the fusion depth,
# where no prior reaches them. BEAM-128K, all 20, in-process on a copy of one load: ER 0.727 -> 0.733 at
# 2,000 tokens and 0.844 -> 0.859 at 8,000 (event ordering 0.594 -> 0.725), no category down by more than
# 0.002. Ranking each side apart for every question the user prior touches: 0.731 / 0.860, but information
# extraction 0.675 -> 0.629 at 2,000 (the assistant's answers lost their place).
# Questions about the whole history rather than one fact in it.
BROAD_QUESTION = re.compile(
    r"\b(?:summar\w*|overview|recap|chronolog\w*|in (?:what|which) order|order in which|"
    r"(?:throughout|across|over) (?:all )?(?:our|my|the|these|those) "
    r"(?:conversations?|sessions?|discussions?|chats?|messages?|questions?|requests?|talks?)|"
    r"across all|over time|so far|progressed|evolv\w*|"
    r"all the (?:times|ways|things|steps)|every time|each time|how has|how have|how did .* change)\b",
    re.IGNORECASE,
)
# Asked for a summary, the answer is made of exchanges: each hit brings the other half of its exchange right
# after it, not after all the hits. BEAM-128K, all 20, in-process on a copy of one load: summarisation 0.107
# -> 0.118 at 2,000 tokens and 0.435 -> 0.449 at 8,000, no other category moved (ER 0.745 / 0.886 ->
# 0.746 / 0.887); with twice the candidates as well, summarisation 0.411 at 8,000.
SUMMARY_QUESTION = re.compile(r"\b(?:summar\w*|overview|recap)\b", re.IGNORECASE)
# And ranked by exchange: a message's score adds EXCHANGE_WEIGHT times the best score of the other half of
# its exchange, so an exchange whose question and answer both match comes before one whose single half
# matches a little better. BEAM-128K, all 20, in-process on a copy of one load: summarisation 0.440 ->
# 0.490 at 8,000 tokens (0.117 -> 0.110 at 2,000), no other category moved; 1.0 gave 0.480, 0.3 0.444;
# for every broad question, event ordering at 8,000 fell 0.888 -> 0.752.
EXCHANGE_WEIGHT = 0.5
# A long message's excerpt shows at least this many words (its passage and what follows it).
EXCERPT_MIN_WORDS = 140
_WORD = re.compile(r"\S+")
# A hit brings the other half of its exchange, worth this share of its score.
NEIGHBOUR_SHARE = 0.5
# A partner at most this share of its hit's tokens (the question that prompted a long answer, mostly) comes
# right after its hit, not after all the hits: it costs little beside the hit and says what the hit
# answers. A partner as long as its hit (turns of a chat) still waits for all the hits. BEAM-128K, all 20,
# in-process on a copy of one load: ER 0.896 -> 0.899 at 8,000 tokens against a fixed 100-token limit
# (0.4 the same, 0.3 0.895, 0.7 0.896, 1.0 0.897; 2,000 level); the fixed limit had given 0.879 -> 0.883
# against none.
SHORT_PARTNER_SHARE = 0.5
# Without dates that tell sessions apart, a broad question's hits are spread over this many stretches.
SEQ_SESSIONS = 6
# A message hit whose words mostly repeat what B5 already quotes (a file pasted again with one line changed, a
# question asked again in other words around the same paste) tells a model little for its tokens: at least
# this share of its word trigrams already quoted, it gives its room to the next hit (listed in `dropped`,
# reason "repeats"). BEAM-128K, all 20, in-process on a copy of one load (Intel Xeon, 2026-11-27): 452 of
# an 8,000 prompt's 6,721 B5 tokens went to such hits (a share of 0.5); ER 0.7505 / 0.8992 -> 0.7516 /
# 0.9008 at 0.7 (no category lower), 0.7516 / 0.9013 at 0.5 (information extraction at 8,000 0.875 ->
# 0.854), 0.7516 / 0.8997 at 0.85. Left out before the candidates are cut to their count, then the freed
# candidate places refilled: no better (0.7520 / 0.8992). A hit of fewer than REPEAT_MIN_TRIGRAMS never
# repeats: it costs little, and the one word it changes ("my rent is $1,500 now") may be the fact; the same
# ER with 20 or 30 (0.9004 at 8,000 with 40, 0.7505 at 2,000 with 80).
REPEAT_SHARE = 0.7
REPEAT_MIN_TRIGRAMS = 30
_WORD_CHARACTERS = re.compile(r"\w+")


# How a question to an assistant about earlier conversations is framed, not what it is about: left out of
# the search query (the whole question still decides the user prior and whether it is broad). On BEAM-128K
# 01-07: ER 0.672 -> 0.674 at 2,000 tokens, 0.806 -> 0.817 at 8,000 (event ordering 0.51 -> 0.55).
QUESTION_FRAMING = re.compile(
    r"\b(?:(?:can|could|would|will) you (?:please )?|please )?"
    r"(?:list|tell me|remind me(?: of)?|walk me through|give me|provide|show me|recap|summari[sz]e|"
    r"outline)\b|"
    r"\b(?:the )?order in which\b|\bin (?:what|which) order\b|\bin order\b|"
    r"\bI (?:brought up|mentioned|discussed|talked about|asked about|raised|shared|told you about)\b|"
    r"\b(?:the )?(?:different |various |key )?(?:aspects|parts|items|topics|points) of\b|"
    r"\b(?:throughout|across|over|during|in) (?:all )?(?:of )?(?:our|my|the|these) "
    r"(?:previous |earlier |past )?(?:conversations?|sessions?|discussions?|chats?)\b|"
    r"\bmention only(?: and only)? \w+ items?\b|"
    r"\ba (?:comprehensive |brief |short |detailed )?(?:summary|overview) of\b",
    re.IGNORECASE,
)


def focused(question: str) -> str:
    """The question without its framing ("Can you list the order in which I brought up…"): what it asks
    about. The question itself when too little would be left."""
    rest = " ".join(QUESTION_FRAMING.sub(" ", question).split())
    return rest if len(rest.split()) >= 3 else question


def date_label(created_at: datetime) -> str:
    if (created_at.hour, created_at.minute, created_at.second) == (0, 0, 0):
        return created_at.strftime("%Y-%m-%d")
    return created_at.strftime("%Y-%m-%d %H:%M UTC")


def relevance(hit: PassageHit) -> float:
    """How well a hit answers, on an absolute scale a client can read (0 to 1): the larger of its cosine
    similarity to the question and the share of the question's weighted words it holds."""
    return max(hit.similarity, hit.lexical)


def said_by_user(question: str) -> bool:
    """Whether the question asks what the user said ("the order in which I brought up…")."""
    return bool(SAID_BY_USER.search(question))


def user_prior(question: str) -> float:
    """How much more the user's own messages weigh for this question: SAID_PRIOR when it asks what the user
    said, USER_PRIOR when it speaks of "I", "my", "me", else 1."""
    if said_by_user(question):
        return SAID_PRIOR
    words = set(question.lower().replace("?", " ").split())
    return USER_PRIOR if words & SELF_REFERENCE else 1.0


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


def _best_hits(hits: list[PassageHit], *, limit: int) -> dict[str, tuple[PassageHit, float]]:
    """The best `limit` messages, best first, each with its best passage and its score."""
    ranked = sorted(_best_per_message(hits).items(), key=lambda entry: -entry[1][1])[:limit]
    return dict(ranked)


def _contents(ids: list[str]) -> dict[str, str]:
    rows = Message.objects.filter(pk__in=ids).values_list("id", "content")
    return {str(pk): content for pk, content in rows}


def _hit_item(state: ContextState, hit: PassageHit, content: str, score: float, **extra: Any) -> Item:
    """A message as B5 shows it: whole when it is one passage, else the hit's passage, labelled."""
    message = hit.message
    whole = len(message.passages) == 1
    start, end = (0, len(content)) if whole else excerpt_span(content, hit.start, hit.end)
    text = content[start:end]
    role = message.role if whole else f"{message.role}, excerpt"
    label = f"[#{message.seq} · {date_label(message.created_at)} · {role}]"
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
    position = index.by_seq.get(seq)
    if position is None:
        return None
    message = index.messages[position]
    step = 1 if message.role == Message.Role.USER else -1
    if not 0 <= position + step < len(index.messages):
        return None
    other = index.messages[position + step]
    wanted = Message.Role.ASSISTANT if step == 1 else Message.Role.USER
    return other if other.role == wanted else None


def _first_passage(index: ConversationIndex, message: IndexedMessage) -> PassageHit:
    passage = index.passages[message.passages[0]]
    return PassageHit(
        message=message, start=passage.start, end=passage.end, score=0.0, lexical=0.0, similarity=0.0
    )


def _this_conversation(
    state: ContextState, index: ConversationIndex, query: str, *, limit: int
) -> list[Item]:
    if index.missing_vectors:
        # Vectors still missing (a server restarted mid-backlog, or appends while vectors were off): have
        # them computed; while a run is queued this costs one cache operation.
        message_vectors_request(conversation_id=state.conversation.pk)
    before = state.history_until if state.history_until is not None else index.indexed_seq
    focus = focused(query)
    prior, said = user_prior(query), said_by_user(query)
    hits = search(
        index,
        query=focus,
        query_vector=lambda: _query_vector(state, focus),  # embedded meanwhile, waited for after BM25
        before_seq=before,
        limit=3 * limit,
        user_prior=prior,
        user_apart=said,
    )
    if not said:  # asked what the user said, the user's words are the answer's material however weak
        hits = [h for h in hits if relevance(h) >= MIN_RELEVANCE]
    summary = bool(SUMMARY_QUESTION.search(query))
    if summary:
        hits = exchange_scored(index, hits)
    # Placed best first. Measured worse on BEAM-128K 01-07 at 2,000 tokens (ER 0.668 by score): by score per
    # token, shorter hits first (0.653); maximal marginal relevance over the passage vectors, lambda 0.7
    # (0.657) or 0.5 (0.646), and no better at 8,000.
    best = _best_hits(hits, limit=limit)
    partners = _partners(index, best, hits)
    contents = _contents([*best, *(p.message.id for p in partners.values())])  # one read for both
    items = [_hit_item(state, hit, contents.get(hit.message.id, ""), score) for hit, score in best.values()]
    if BROAD_QUESTION.search(query):
        items = spread_over_sessions(items)
    # Partners are worth NEIGHBOUR_SHARE of their hit and come after all the hits, in the hits' order: placed
    # right after each hit, ER at 2,000 tokens fell from 0.668 to 0.609 on BEAM-128K 01-07; merged into the
    # hits by score, or right after each hit for broad questions only, within 0.005 of this on all 20
    # (2026-11-25). A request for a summary takes them right after their hit (SUMMARY_QUESTION), and so does
    # a partner short beside its hit (SHORT_PARTNER_SHARE).
    partner_items = {
        key: _hit_item(
            state,
            partners[key],
            contents.get(partners[key].message.id, ""),
            item.score * NEIGHBOUR_SHARE,
            neighbour_of=item.source["seq"],
        )
        for item in items
        if (key := str(item.source["id"])) in partners
    }
    return with_partners(items, partner_items, inline=summary)


def with_partners(items: list[Item], partners: dict[str, Item], *, inline: bool) -> list[Item]:
    """The hits and their exchange partners (by the hit's message id): each right after its hit when
    `inline` or when it is short beside its hit (SHORT_PARTNER_SHARE), the others after all the hits, in the
    hits' order."""
    placed: list[Item] = []
    after: list[Item] = []
    for item in items:
        placed.append(item)
        partner = partners.get(str(item.source["id"]))
        if partner is not None:
            short = partner.tokens <= SHORT_PARTNER_SHARE * item.tokens
            (placed if inline or short else after).append(partner)
    return placed + after


def exchange_scored(index: ConversationIndex, hits: list[PassageHit]) -> list[PassageHit]:
    """The hits, each scored with EXCHANGE_WEIGHT times the best score of the other half of its exchange
    among the hits added (a request for a summary is answered from exchanges)."""
    best = _best_per_message(hits)
    scored = []
    for hit in hits:
        other = _exchange_partner(index, hit.message.seq)
        bonus = best[other.id][1] if other is not None and other.id in best else 0.0
        scored.append(dataclasses.replace(hit, score=hit.score + EXCHANGE_WEIGHT * bonus))
    return scored


def _session_key(item: Item, sessions_by_day: bool, bucket: int) -> str:
    if sessions_by_day:
        return str(item.source["created_at"])[:10]
    return str(int(item.source["seq"]) // bucket)


def spread_over_sessions(items: list[Item]) -> list[Item]:
    """A question about the whole history ("summarise…", "in what order did I…") is answered from every
    session, not from the few best hits of one: the first hit of each session in turn, sessions in the order
    of their first hit. A session is a day of the messages' dates (or, when they share one day, a stretch
    of seqs). The scores stay as they were; the order is the placing order."""
    if len(items) < 2:
        return items
    days = {str(i.source["created_at"])[:10] for i in items}
    bucket = max(1, (max(int(i.source["seq"]) for i in items) + 1) // SEQ_SESSIONS)
    sessions: dict[str, list[Item]] = {}
    for item in items:
        sessions.setdefault(_session_key(item, len(days) > 1, bucket), []).append(item)
    spread: list[Item] = []
    for turn in range(max(len(v) for v in sessions.values())):
        spread += [group[turn] for group in sessions.values() if turn < len(group)]
    return spread


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
    items = []
    for hit, lexical_share in zip(outcome.hits, lexical, strict=True):
        memory = hit.memory
        text = f"[memory, {memory.kind}] {memory.content}"
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
    position = {str(item.source["id"]): n for n, item in enumerate(messages)}
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


def candidate_count(room: int, *, said: bool = False) -> int:
    most = SAID_CANDIDATES if said else MESSAGE_CANDIDATES
    return max(MIN_CANDIDATES, min(most, room // CANDIDATE_TOKENS))


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
    messages, memories = stand_ins(
        _this_conversation(state, index, query, limit=candidate_count(room, said=said_by_user(query))),
        memories,
    )
    sources = [by_relevance(messages, memories), others, knowledge]
    # Each source's items come in its placing order (this conversation's by value per token, spread over
    # sessions for a broad question, then the hits' exchange partners): kept, not re-sorted.
    ranked: list[tuple[int, int, Item]] = []
    for order, items in enumerate(sources):
        ranked += [(rank, order, item) for rank, item in enumerate(items)]
    merged = [item for _, _, item in sorted(ranked, key=lambda r: (r[0], r[1]))]
    top_k = (state.request.retrieval or {}).get("top_k")
    state.candidates += merged[:top_k] if top_k else merged
    for item in state.candidates[found:]:
        item.source["query"] = rewrite.method  # which query found it: the user's words, rules or an LLM
