"""How B5 places what retrieval found (context.retrieved): a hit brings the other half of its exchange, a
long message's excerpt says enough to be used, a broad question is answered from every session, and the
background embedding run leaves the conversation's index ready for the next call."""

import pytest

from context.retrieved import (
    REPEAT_MIN_TRIGRAMS,
    SHORT_PARTNER_SHARE,
    by_relevance,
    quoted_trigrams,
    repeats,
    with_partners,
)
from conversations.embedding import message_vectors_fill
from prefix_cache.rendering import Item
from providers import embeddings
from retrieval import history as history_index
from retrieval.excerpts import EXCERPT_MIN_WORDS, _words_before, excerpt_span
from tests.context.helpers import append, context, fake_source

pytestmark = pytest.mark.django_db


def b5_items(body) -> list[dict]:
    return [i for i in body["blocks"].get("B5", {}).get("items", []) if i.get("kind") == "message"]


def chatter(conversation, count: int) -> None:
    append(conversation, *[{"role": "user", "content": f"unrelated chatter {n}"} for n in range(count)])


def test_a_question_found_brings_its_answer(owner, conversation, lexical_only):
    append(
        conversation,
        {"role": "user", "content": "Which cloud region should the billing service run in?"},
        {"role": "assistant", "content": "Frankfurt, because the invoices must stay in the EU."},
    )
    chatter(conversation, 40)

    body = context(owner, conversation, user_message="Where does the billing service run?", token_budget=600)

    items = {i["seq"]: i for i in b5_items(body)}
    assert 1 in items and 2 in items
    assert items[2]["neighbour_of"] == 1
    assert "Frankfurt" in body["messages"][-1]["content"]


def test_an_answer_found_brings_its_question(owner, conversation, lexical_only):
    append(
        conversation,
        {"role": "user", "content": "What should I do about it?"},
        {"role": "assistant", "content": "Rotate the Kubernetes service account tokens every 30 days."},
    )
    chatter(conversation, 40)

    body = context(
        owner, conversation, user_message="How often to rotate the service account tokens?", token_budget=600
    )

    # A short answer alone says little: it comes with the turn it answers, both under one label.
    (item,) = [i for i in b5_items(body) if 2 in i.get("seqs", [i["seq"]])]
    assert item["seqs"] == [1, 2]
    b5_text = body["messages"][-1]["content"]
    assert "assistant: Rotate the Kubernetes" in b5_text and "user: What should I do about it?" in b5_text


def test_a_short_passage_of_a_long_message_is_grown_to_a_usable_excerpt():
    paragraphs = [" ".join(f"p{p}w{w}" for w in range(EXCERPT_MIN_WORDS)) for p in range(3)]
    text = "\n\n".join([paragraphs[0], "A short heading", paragraphs[1], paragraphs[2]])
    start = text.index("A short heading")
    end = start + len("A short heading")

    grown_start, grown_end = excerpt_span(text, start, end)

    excerpt = text[grown_start:grown_end]
    assert excerpt.startswith("A short heading")
    assert len(excerpt.split()) == EXCERPT_MIN_WORDS
    # At the message's end the excerpt grows backwards.
    tail = text.rindex(f"p2w{EXCERPT_MIN_WORDS - 1}")
    back_start, back_end = excerpt_span(text, tail, len(text))
    assert back_end == len(text) and len(text[back_start:back_end].split()) == EXCERPT_MIN_WORDS
    # A passage long enough already is left as it was.
    assert excerpt_span(text, 0, len(paragraphs[0])) == (0, len(paragraphs[0]))
    # Growing backwards reads a window before the passage, not the message from its start: a window that
    # begins inside a word reaches further back for that word's start.
    straddled = "aaaa " + "b" * 46 + " cc dd"
    assert _words_before(straddled, len(straddled), 3)[-3:] == [5, 52, 55]
    assert _words_before(straddled, len(straddled), 9) == [0, 5, 52, 55]


def test_the_background_embedding_run_leaves_the_index_ready(owner, conversation, settings):
    settings.MNEMO_EMBEDDINGS = "local"
    embeddings._build.cache_clear()
    append(conversation, *[{"role": "user", "content": f"message number {n}"} for n in range(3)])
    history_index.conversation_index_drop(conversation.id)

    message_vectors_fill(conversation_id=conversation.id)

    index = history_index._indexes[str(conversation.id)]
    assert index.indexed_seq == 3
    assert not index.missing_vectors
    embeddings._build.cache_clear()


def test_memories_are_placed_among_the_hits_by_relevance():
    def hit(id_: str, relevance: float, kind: str = "message", **source) -> Item:  # relevance: source.score
        return Item(
            text=id_, tokens=1, source=fake_source(kind, id=id_, score=relevance, **source), score=0.01
        )

    hits = [hit("m1", 0.8), hit("m2", 0.0, neighbour_of=1), hit("m3", 0.3)]
    memories = [hit("a1", 0.1, "archival"), hit("a2", 0.5, "archival"), hit("a3", 0.9, "archival")]

    placed = [i.source.id for i in by_relevance(hits, memories)]

    # An exchange partner (scored 0 by itself) does not push a memory behind it.
    assert placed == ["a3", "m1", "m2", "a2", "m3", "a1"]


def test_partners_follow_all_the_hits():
    def hit(id_: str, tokens: int = 100, **source) -> Item:
        return Item(text=id_, tokens=tokens, source=fake_source("message", id=id_, **source), score=0.01)

    hits = [hit("u1"), hit("a2"), hit("u3")]
    partners = {"u1": hit("a1", neighbour_of=1), "u3": hit("a3", neighbour_of=3)}

    assert [i.source.id for i in with_partners(hits, partners)] == ["u1", "a2", "u3", "a1", "a3"]


def test_a_partner_short_beside_its_hit_follows_it():
    """The question that prompted a long answer costs little beside it: right after its hit, while a
    partner as long as its hit (or longer) waits until all the hits are placed."""

    def hit(id_: str, tokens: int, **source) -> Item:
        return Item(text=id_, tokens=tokens, source=fake_source("message", id=id_, **source), score=0.01)

    hits = [hit("a2", 300), hit("u3", 40), hit("a6", 300), hit("u7", 30)]
    partners = {
        "a2": hit("u1", int(300 * SHORT_PARTNER_SHARE), neighbour_of=2),
        "u3": hit("a4", 400, neighbour_of=3),
        "a6": hit("u5", 20, neighbour_of=6),
        "u7": hit("a8", 30, neighbour_of=7),  # a chat's turns: as long as its hit
    }

    placed = [i.source.id for i in with_partners(hits, partners)]

    assert placed == ["a2", "u1", "u3", "a6", "u5", "u7", "a4", "a8"]


def test_a_memory_carries_its_relevance_on_the_scale_of_the_message_hits(owner, conversation, lexical_only):
    from memory.archival import archival_insert

    archival_insert(end_user=conversation.end_user, content="The ledger's staging DB runs PostgreSQL 16.")
    chatter(conversation, 30)

    body = context(owner, conversation, user_message="Which PostgreSQL does the ledger staging DB run?")

    [memory] = [i for i in body["blocks"]["B5"]["items"] if i["kind"] == "archival"]
    assert 0 < memory["score"] <= 1
    assert memory["score"] == max(memory["lexical"], memory["similarity"])
    assert memory["similarity"] == 0.0  # lexical only
    assert 0 < memory["rank_score"] < memory["score"]  # the fused rank orders the memories' own ranking


PORT_FACT = "The ledger staging database now listens on port 23456."
PORT_QUESTION = "Which port does the ledger staging database use?"


def port_memory(conversation, message: str):
    """The fact said in `message` (then 30 unrelated messages), and the memory the agent's rules would keep of
    it: the sentence verbatim, its source the message."""
    from memory.archival import archival_insert

    [statement, _answer] = append(
        conversation, {"role": "user", "content": message}, {"role": "assistant", "content": "Noted."}
    )
    chatter(conversation, 30)
    return archival_insert(
        end_user=conversation.end_user,
        content=PORT_FACT,
        conversation=conversation,
        source_message_ids=[str(statement.id)],
    ).memory


def test_a_memory_taken_from_a_message_that_is_a_hit_is_not_shown_twice(owner, conversation, lexical_only):
    from memory.archival import archival_insert

    quoted = port_memory(conversation, PORT_FACT)
    elsewhere = archival_insert(
        end_user=conversation.end_user, content="The ledger's staging DB runs PostgreSQL."
    )

    body = context(owner, conversation, user_message=PORT_QUESTION, token_budget=600)

    b5 = body["blocks"]["B5"]["items"]
    assert 1 in {i.get("seq") for i in b5 if i["kind"] == "message"}
    memories = {i["id"] for i in b5 if i["kind"] == "archival"}
    assert str(elsewhere.memory.id) in memories  # a memory of its own still comes
    assert str(quoted.id) not in memories  # the hit says it, with its date and seq


def test_a_memory_stands_in_for_its_message_when_the_message_does_not_fit(owner, conversation, lexical_only):
    codes = " ".join(f"ab{n}cd{n}ef" for n in range(150))  # one passage, several hundred tokens
    memory = port_memory(conversation, f"{PORT_FACT} Codes: {codes}")

    body = context(owner, conversation, user_message=PORT_QUESTION, token_budget=500)

    b5 = body["blocks"]["B5"]["items"]
    assert 1 not in {i.get("seq") for i in b5 if i["kind"] == "message"}  # too long for the room
    assert str(memory.id) in {i["id"] for i in b5 if i["kind"] == "archival"}


def test_a_question_about_what_i_said_is_answered_from_my_own_messages(owner, conversation, lexical_only):
    append(
        conversation,
        {"role": "user", "content": "I once got a copper kettle from my aunt and still use it at the cabin."},
        {"role": "assistant", "content": "Lovely."},
    )
    append(
        conversation,
        *[{"role": "assistant", "content": f"Kettle guide {n}: kettle, kettle, kettle."} for n in range(95)],
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."},
    )

    body = context(owner, conversation, user_message="Which kettle did I mention?", token_budget=400)

    assert 1 in {i["seq"] for i in b5_items(body)}


def test_the_candidates_follow_the_room_not_a_fixed_count(owner, conversation, lexical_only):
    filler = "with the lid, the handle, the spout, the base, the cord, the switch and the light all checked"
    for start in range(0, 200, 50):
        append(
            conversation,
            *[
                message
                for n in range(start, start + 50)
                for message in (
                    {"role": "user", "content": f"Kettle note {n}: I descaled kettle number {n} {filler}."},
                    {"role": "assistant", "content": "Noted."},
                )
            ],
        )

    large = context(owner, conversation, user_message="Which kettle needs descaling?", token_budget=8000)

    hits = [i for i in b5_items(large) if "neighbour_of" not in i]
    # Sixty hits of ~40 tokens held a third of an 8,000-token prompt: the room decides how many are read.
    assert len(hits) > 60
    assert large["tokens"]["total"] >= 0.9 * 8000


def _config(replicas: int) -> str:
    lines = [f"gateway_option_{n}: value_{n * 7} # tuned for the ingress gateway" for n in range(12)]
    return "\n".join([f"replicas: {replicas}", *lines])


def test_a_hit_repeating_what_b5_quotes_gives_its_room_to_the_next(owner, conversation, lexical_only):
    """A file pasted again with one line changed says mostly what the first paste says: the second gives
    way (listed as repeating), while a hit with its own words about the same subject is shown."""
    append(
        conversation,
        {"role": "user", "content": "My ingress gateway config:\n" + _config(3)},
        {"role": "user", "content": "The ingress gateway config again, with more replicas:\n" + _config(5)},
        {"role": "user", "content": "The ingress gateway must terminate TLS before the load balancer."},
    )
    chatter(conversation, 40)

    body = context(
        owner, conversation, user_message="How is my ingress gateway configured?", token_budget=2000
    )

    shown = {i["seq"] for i in b5_items(body)}
    assert len(shown & {1, 2}) == 1 and 3 in shown
    repeated = [d for d in body["dropped"] if d["block"] == "B5" and d["reason"] == "repeats"]
    assert len(repeated) == 1 and repeated[0]["items"] == 1


def test_a_hit_repeats_only_when_most_of_its_trigrams_are_quoted():
    def item(*words: str) -> Item:
        text = f"[#1 · 2026-01-02 · user] {' '.join(words)}"
        return Item(text=text, tokens=2 * len(words), source=fake_source("message"))

    paste = [f"line{n}" for n in range(REPEAT_MIN_TRIGRAMS + 10)]
    quoted = quoted_trigrams(item(*paste))

    assert repeats(quoted_trigrams(item("Again:", *paste[:-2])), quoted)
    half = len(paste) // 2
    assert not repeats(quoted_trigrams(item(*paste[:half], *(w.upper() + "x" for w in paste[half:]))), quoted)
    short = quoted_trigrams(item(*paste[: REPEAT_MIN_TRIGRAMS - 1]))
    assert not repeats(short, quoted)  # a short hit costs little, and its one changed word may be the fact
    assert ("2026", "01", "02") not in quoted  # the label is not what the hit quotes
