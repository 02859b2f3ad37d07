"""memory.history_index: the in-process whole-history index of a conversation, kept up to date
incrementally, rebuilt when a cut-off message is completed, dropped with its conversation; passages and
terms."""

import pytest

from conversations.models import Message
from providers import embeddings
from providers.passages import PASSAGE_WORDS, WHOLE_MESSAGE_WORDS, passage_spans
from retrieval import history as history_index
from retrieval.history import conversation_index, search, terms
from tests.context.helpers import append

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def lexical_only(settings):
    settings.MNEMO_EMBEDDINGS = "none"
    embeddings._build.cache_clear()
    yield
    embeddings._build.cache_clear()


def test_terms_are_stemmed_without_stopwords_and_split_identifiers():
    assert terms("The runners were running to get_user_name on KX-4821") == [
        "runner",
        "run",
        "get",
        "user",
        "name",
        "kx",
        "4821",
    ]
    assert "东京" in terms("我在东京")


def test_a_long_message_is_cut_into_passages_on_paragraphs():
    short = " ".join(["word"] * WHOLE_MESSAGE_WORDS)
    assert passage_spans(short) == [(0, len(short))]
    paragraphs = "\n\n".join(" ".join([f"p{n}"] * 100) for n in range(4))
    spans = passage_spans(paragraphs)
    assert len(spans) == 4
    assert all(len(paragraphs[a:b].split()) <= PASSAGE_WORDS for a, b in spans)
    assert " ".join(paragraphs[a:b] for a, b in spans).split() == paragraphs.split()


def test_the_index_reads_only_what_was_appended_since(conversation, django_assert_max_num_queries):
    append(conversation, {"role": "user", "content": "The red kettle is in the attic."})
    index = conversation_index(conversation.id)
    assert [m.seq for m in index.messages] == [1]
    append(conversation, {"role": "user", "content": "The blue kettle is in the shed."})
    with django_assert_max_num_queries(2):  # the new messages, and (none missing) no vector read
        index = conversation_index(conversation.id)
    assert [m.seq for m in index.messages] == [1, 2]
    [best, *_] = search(index, query="where is the blue kettle", query_vector=None, before_seq=10, limit=5)
    assert best.message.seq == 2
    assert 0 < best.lexical <= 1


def test_a_cut_off_message_that_is_completed_later_is_indexed_again(conversation):
    [partial] = append(
        conversation, {"role": "assistant", "content": "The deploy failed on", "completed": False}
    )
    conversation_index(conversation.id)
    Message.objects.filter(pk=partial.pk).update(
        content="The deploy failed on the migration step.", completed=True
    )
    index = conversation_index(conversation.id)
    hits = search(index, query="migration step", query_vector=None, before_seq=10, limit=5)
    assert [h.message.seq for h in hits] == [1]


def test_search_leaves_out_what_is_after_before_seq(conversation):
    append(conversation, {"role": "user", "content": "kettle one"}, {"role": "user", "content": "kettle two"})
    index = conversation_index(conversation.id)
    assert [
        h.message.seq for h in search(index, query="kettle", query_vector=None, before_seq=1, limit=5)
    ] == [1]


def test_a_deleted_conversation_takes_its_index_with_it(conversation):
    append(conversation, {"role": "user", "content": "kettle"})
    conversation_index(conversation.id)
    assert str(conversation.id) in history_index._indexes
    conversation.delete()
    assert str(conversation.id) not in history_index._indexes


def reply_then_user(conversation, user_text: str):
    """A reply of six passages that all match "kettle descaling", then a user message that matches less."""
    reply = "\n\n".join(
        f"Section {n}: the kettle descaling schedule, kettle descaling filters and kettle descaling care."
        + " filler" * 70
        for n in range(6)
    )
    append(conversation, {"role": "assistant", "content": reply}, {"role": "user", "content": user_text})
    index = conversation_index(conversation.id)
    assert len(index.messages[0].passages) == 6  # each passage ranks on its own
    return index


def found(index, *, limit: int, **options) -> list[int]:
    hits = search(index, query="kettle descaling", query_vector=None, before_seq=10, limit=limit, **options)
    return [h.message.seq for h in hits]


def test_a_preference_weighs_before_the_best_passages_are_chosen(conversation):
    index = reply_then_user(conversation, "Once a month I clean the kettle with citric acid, it works.")
    users = ((lambda i: history_index.said_by(i, frozenset(), user=True), 2.5),)

    # Messages are ranked, not passages: the reply's six passages do not fill the limit.
    assert set(found(index, limit=3)) == {1, 2}
    assert found(index, limit=1) == [1]
    assert found(index, limit=1, preferences=users) == [2]  # weighed first, the user's own message leads


def test_a_long_replys_passages_do_not_push_a_short_message_past_the_fusion_depth(conversation, monkeypatch):
    monkeypatch.setattr(history_index, "FUSION_DEPTH", 4)
    index = reply_then_user(conversation, "I said the kettle needs citric acid.")

    # The reply's six passages match better, but it is one message in each ranking (ranked by passage, the
    # reply filled the depth and the user's message scored nothing).
    assert set(found(index, limit=4)) == {1, 2}


def test_a_named_speakers_turns_and_a_periods_messages_are_told_apart():
    from datetime import UTC, datetime

    from providers.dates import question_period

    index = history_index.ConversationIndex("conversation")
    rows = (
        (1, "Priya", "I went to a pottery class yesterday.", datetime(2023, 5, 8, tzinfo=UTC)),
        (2, "Tomas", "Nice, I went hiking.", datetime(2023, 5, 8, tzinfo=UTC)),
        (3, "Priya", "Back at work today.", datetime(2023, 6, 2, tzinfo=UTC)),
    )
    for seq, name, content, created in rows:
        index._add(f"m{seq}", seq, "user", name, content, 10, created, True)

    assert history_index.said_by(index, frozenset({"priya"})).tolist() == [True, False, True]
    assert history_index.said_by(index, frozenset({"nobody"})).tolist() == [False, False, False]
    may_7 = question_period("What happened on 7 May 2023?")
    # Said on 8 May, but its "yesterday" is 7 May.
    assert history_index.said_in(index, may_7).tolist() == [True, False, False]
    assert history_index.said_in(index, question_period("in June 2023")).tolist() == [False, False, True]


def test_search_reads_the_index_under_its_lock(conversation, monkeypatch):
    """Another request's sync() may add passages and vectors while this one searches: the postings' arrays
    cannot grow while numpy reads them, nor the vector rows be written twice."""
    append(conversation, {"role": "user", "content": "The red kettle is in the attic."})
    index = conversation_index(conversation.id)
    held = []
    bm25, similarity, share = index.postings.bm25, index.vectors.similarity, index.postings.share
    monkeypatch.setattr(index.postings, "bm25", lambda *a: held.append(index.lock.locked()) or bm25(*a))
    monkeypatch.setattr(
        index.vectors, "similarity", lambda *a, **k: held.append(index.lock.locked()) or similarity(*a, **k)
    )
    monkeypatch.setattr(index.postings, "share", lambda *a: held.append(index.lock.locked()) or share(*a))
    assert search(index, query="red kettle", query_vector=None, before_seq=10, limit=3)
    assert history_index.lexical_shares(index, "red kettle", ["a red kettle"])[0] > 0
    assert held == [True, True, True] and not index.lock.locked()


def test_the_passages_a_search_may_return_are_those_of_messages_up_to_its_seq():
    """Passages are added in seq order: those of messages up to a seq are a prefix, a message without text
    (tool calls only) holding none."""
    from datetime import UTC, datetime

    index = history_index.ConversationIndex("conversation")
    long = "\n\n".join(" ".join(["alpha"] * 150) for _ in range(2))
    for seq, role, content in (
        (1, "user", long),
        (2, "assistant", ""),
        (3, "user", "beta"),
        (5, "tool", "x"),
    ):
        index._add(f"m{seq}", seq, role, "", content, 10, datetime.now(UTC), True)
    assert len(index.passages) == 4
    until = [history_index._passages_until(index, seq) for seq in (0, 1, 2, 3, 4, 5, 99)]
    assert until == [0, 2, 2, 3, 3, 4, 4]
    assert index.passage_from_user.tolist() == [1, 1, 1, 0]
    hits = search(index, query="alpha beta", query_vector=None, before_seq=2, limit=5)
    assert {h.message.seq for h in hits} == {1}


def test_a_whole_index_is_kept_out_of_the_garbage_collectors_walks(conversation):
    """gc.freeze after the first whole read: full collections no longer walk the index's objects."""
    import gc

    append(conversation, {"role": "user", "content": "The red kettle is in the attic."})
    before = gc.get_freeze_count()
    try:
        index = conversation_index(conversation.id)
        assert gc.get_freeze_count() > before
        frozen = gc.get_freeze_count()
        append(conversation, {"role": "user", "content": "The blue kettle is in the shed."})
        assert conversation_index(conversation.id) is index
        assert gc.get_freeze_count() <= frozen  # one message caught up: no full collection for it
    finally:
        gc.unfreeze()  # the other tests' objects go back to the collector whatever happened here


def test_messages_caught_up_are_frozen_once_enough_have_piled_up(conversation, monkeypatch):
    """Catch-up reads freeze too, every FREEZE_EVERY_MESSAGES messages added in the process: full collections
    never walk more than about that many messages' objects, however long the server runs."""
    import gc

    monkeypatch.setattr(history_index, "FREEZE_EVERY_MESSAGES", 3)
    append(conversation, {"role": "user", "content": "The red kettle is in the attic."})
    try:
        conversation_index(conversation.id)  # the whole read freezes and starts the count again
        counts = []
        for colour in ("blue", "green", "white"):
            frozen = gc.get_freeze_count()
            append(conversation, {"role": "user", "content": f"The {colour} kettle is in the shed."})
            conversation_index(conversation.id)
            counts.append(gc.get_freeze_count() > frozen)
        assert counts == [False, False, True]
        assert history_index._unfrozen == [0]
    finally:
        gc.unfreeze()


def _unit(*values: float):
    import numpy as np

    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_what_the_whole_conversation_shares_does_not_decide_the_vector_ranking(monkeypatch):
    """Eight messages about the conversation's subject and one about an aspect of it: a question naming
    both is closer to the subject's messages by plain cosine, but the aspect is what tells the messages
    apart, so the vector ranking compares them with the question less the conversation's mean vector. The
    similarity a hit reports stays its cosine with the question."""
    from datetime import UTC, datetime

    index = history_index.ConversationIndex("conversation")
    subject = [_unit(1, 0.05 * n, 0) for n in range(8)]
    aspect = _unit(0.5, 0, 0.866)
    for seq, vector in enumerate([*subject, aspect], start=1):
        index._add(f"m{seq}", seq, "user", "", f"message {seq}", 10, datetime.now(UTC), True)
        index.vectors[seq - 1] = vector
    question = _unit(1, 0, 0.4)

    def best(**options):
        options.setdefault("query_vector", question)
        return search(index, query="nothing shared", before_seq=99, limit=1, **options)[0]

    hit = best()
    assert hit.message.seq == 9
    assert hit.similarity == pytest.approx(float(aspect @ question), abs=1e-4)
    # A question still being embedded is passed as a function returning its vector: the same hit.
    assert best(query_vector=lambda: question) == hit
    monkeypatch.setattr(history_index, "CENTRING", 0.0)
    assert best().message.seq == 1  # by plain cosine the subject's first message comes first
