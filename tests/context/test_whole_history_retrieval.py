"""Retrieval over the whole history (retrieval.history through context.retrieved): an early fact is found
however many later messages reuse its words, hits carry their seq and the client's date, vectors find a
paraphrase, a missing model degrades to lexical (reported), and nothing crosses tenants."""

from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations.embedding import FILL_BATCH, message_vectors_fill
from conversations.models import Conversation, Message, MessageVector
from conversations.services import conversation_create
from providers import embeddings
from tests.context.helpers import append, context
from tests.retrieval.backends import milvus_lite_uri, vector_backend, vectors_of_end_user  # noqa: F401

pytestmark = pytest.mark.django_db

FACT = "The staging database uses port 6543 since the migration."
QUESTION = "Which port does the staging database use?"


def retrieved(body) -> str:
    return body["messages"][-1]["content"].split("## User question")[0]


def b5_seqs(body) -> list[int]:
    return [i["seq"] for i in body["blocks"].get("B5", {}).get("items", []) if i.get("kind") == "message"]


def filler(conversation: Conversation, count: int, *, start: int) -> None:
    """`count` messages that each use one or two of the question's words, never all of them together."""
    lines = [
        "The staging build ran green this morning.",
        "Database migrations are done for the reporting tables.",
        "Port forwarding works again after the VPN change.",
        "We use the staging cluster for the demo.",
        "Which database does the analytics team use?",
    ]
    Message.objects.bulk_create(
        Message(
            conversation=conversation,
            seq=seq,
            role=Message.Role.USER if seq % 2 else Message.Role.ASSISTANT,
            content=f"{lines[seq % len(lines)]} (note {seq})",
            token_count=15,
        )
        for seq in range(start, start + count)
    )
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=start + count - 1)


def test_a_fact_said_once_early_is_found_after_2000_messages_that_reuse_its_words(
    owner, conversation, lexical_only
):
    append(conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."})
    filler(conversation, 2000, start=3)

    body = context(owner, conversation, user_message=QUESTION, token_budget=2000)

    assert 1 in b5_seqs(body)
    assert FACT in retrieved(body)
    assert body["tokens"]["total"] <= 2000


def test_hits_are_labelled_with_their_seq_and_the_clients_date_and_ordered_by_time(owner, conversation):
    owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {
            "messages": [
                {"role": "user", "content": "I adopted a cat named Miso.", "created_at": "2024-03-15"},
                {"role": "assistant", "content": "Congratulations!", "created_at": "2024-03-15"},
                {
                    "role": "user",
                    "content": "Miso knocked a vase over.",
                    "created_at": "2024-04-02T09:30:00Z",
                },
            ]
        },
        format="json",
    )
    append(conversation, *[{"role": "user", "content": f"unrelated chatter {n}"} for n in range(40)])

    body = context(owner, conversation, user_message="When did I adopt Miso?", token_budget=400)

    text = retrieved(body)
    assert "[#1 · 2024-03-15 · user] I adopted a cat named Miso." in text
    assert "[#3 · 2024-04-02 · user] Miso knocked a vase over." in text
    assert text.index("#1 ·") < text.index("#3 ·")
    items = body["blocks"]["B5"]["items"]
    # Every hit says how well it matched; the answer that came along with #1 is marked as such.
    assert all(i["score"] > 0 for i in items if "neighbour_of" not in i)
    assert [i["seq"] for i in items if "neighbour_of" in i] == [2]
    assert items[0]["created_at"] == datetime(2024, 3, 15, tzinfo=UTC).isoformat()


@pytest.mark.usefixtures("vector_backend")
def test_a_paraphrase_is_found_by_the_local_vectors(owner, conversation, local_embeddings):
    append(
        conversation,
        {"role": "user", "content": "Last weekend I ran a 5k to raise money for the animal shelter."},
        {"role": "assistant", "content": "Well done!"},
    )
    for start in (0, 75):
        append(
            conversation,
            *[
                {"role": "user", "content": f"Kitchen renovation, step {n}."}
                for n in range(start, start + 75)
            ],
        )
    message_vectors_fill(conversation_id=conversation.id)

    body = context(owner, conversation, user_message="What charity race did I do?", token_budget=1000)

    assert "animal shelter" in retrieved(body)
    assert "embeddings_unavailable" not in [d["code"] for d in body["degradations"]]


def test_without_the_model_retrieval_is_lexical_and_says_so(owner, conversation, settings):
    settings.MNEMO_EMBEDDINGS = "local"
    settings.MNEMO_EMBEDDINGS_MODEL_PATH = "/nonexistent/model.onnx"
    embeddings._build.cache_clear()
    try:
        append(conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."})
        filler(conversation, 500, start=3)
        body = context(owner, conversation, user_message=QUESTION, token_budget=2000)
    finally:
        embeddings._build.cache_clear()
    assert FACT in retrieved(body)
    [degradation] = [d for d in body["degradations"] if d["code"] == "embeddings_unavailable"]
    assert degradation["stage"] == "retrieve"


def test_an_outsider_never_retrieves_the_owners_messages(owner, outsider, conversation, lexical_only):
    append(conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."})
    theirs = conversation_create(tenant=outsider.tenant, end_user_external_id="alice", title="Same user id")
    append(theirs, {"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."})

    body = context(outsider, theirs, user_message=QUESTION, token_budget=2000)
    rendered = " ".join(str(m["content"]) for m in body["messages"]) + body["system"]
    assert "port 6543" not in rendered
    assert "B5" not in body["blocks"]
    assert (
        outsider.client.post(
            f"/api/v1/conversations/{conversation.id}/context", {"user_message": QUESTION}, format="json"
        ).status_code
        == 404
    )


def test_the_retrieval_index_reports_embedded_messages_and_an_outsider_gets_404(
    owner, outsider, conversation, local_embeddings
):
    long_reply = "\n\n".join(f"Paragraph {n}: " + "details about the rollout plan " * 20 for n in range(6))
    append(
        conversation,
        {"role": "user", "content": "Plan the rollout."},
        {"role": "assistant", "content": long_reply},
    )
    url = f"/api/v1/conversations/{conversation.id}"
    before = owner.client.get(url).json()["retrieval_index"]
    assert before == {"messages": 2, "embedded": 0, "model": embeddings.INT8_NAME}

    assert message_vectors_fill(conversation_id=conversation.id) == 2
    assert owner.client.get(url).json()["retrieval_index"]["embedded"] == 2
    reply = MessageVector.objects.get(seq=2)
    assert len(reply.spans) > 1  # a long message is embedded passage by passage
    assert len(bytes(reply.vectors)) == 4 * reply.dimension * len(reply.spans)
    assert message_vectors_fill(conversation_id=conversation.id) == 0  # nothing left: idempotent
    assert outsider.client.get(url).status_code == 404


def test_a_run_after_an_append_reads_only_the_messages_without_vectors(conversation, local_embeddings):
    """A long conversation grows at its end: the run an append queues reads the new messages, not the whole
    conversation again from its first message (every run did, ~0.6 s for three new of 10,000)."""
    older = 4 * 50  # more than three of the run's windows (FILL_BATCH)
    for start in range(0, older, 50):
        append(conversation, *[{"role": "user", "content": f"note {start + n}"} for n in range(50)])
    assert older > 3 * FILL_BATCH
    assert message_vectors_fill(conversation_id=conversation.id) == older
    append(conversation, {"role": "user", "content": "the newest note"})

    with CaptureQueriesContext(connection) as queries:
        assert message_vectors_fill(conversation_id=conversation.id) == 1

    # The run's windows of messages (the index that then takes the new vectors reads only what is new).
    windows = [q["sql"] for q in queries if q["sql"].endswith(f"LIMIT {FILL_BATCH}")]
    assert len(windows) == 1, "\n\n".join(windows)
    assert MessageVector.objects.filter(conversation=conversation).count() == older + 1


def test_identical_text_of_the_same_tenant_reuses_its_vectors(
    owner, conversation, local_embeddings, monkeypatch
):
    append(conversation, {"role": "user", "content": "Ship it on Friday."})
    message_vectors_fill(conversation_id=conversation.id)
    other = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Bob")
    append(other, {"role": "user", "content": "Ship it on Friday."})
    embedder = embeddings.embedder_status().embedder
    monkeypatch.setattr(embedder, "embed", lambda texts: pytest.fail(f"embedded again: {texts}"))
    assert message_vectors_fill(conversation_id=other.id) == 1
    first, second = MessageVector.objects.order_by("created_at")
    assert bytes(first.vectors) == bytes(second.vectors)


@pytest.mark.usefixtures("vector_backend")
def test_deleting_the_end_user_deletes_their_vectors(owner, conversation, local_embeddings):
    append(conversation, {"role": "user", "content": FACT})
    message_vectors_fill(conversation_id=conversation.id)
    assert MessageVector.objects.count() == 1
    assert vectors_of_end_user(owner.tenant.pk, conversation.end_user_id)["message"] == 1
    assert owner.client.delete("/api/v1/users/alice").status_code == 200
    assert MessageVector.objects.count() == 0
    assert vectors_of_end_user(owner.tenant.pk, conversation.end_user_id)["message"] == 0


def test_the_backfill_command_fills_what_is_missing_and_resumes(owner, conversation, local_embeddings):
    append(conversation, *[{"role": "user", "content": f"message number {n}"} for n in range(5)])
    message_vectors_fill(conversation_id=conversation.id, limit=2)  # an interrupted earlier run
    call_command("embeddings_backfill", "--no-progress")
    assert MessageVector.objects.filter(conversation=conversation).count() == 5
    call_command("embeddings_backfill", "--no-progress", "--conversation", str(conversation.id))
    assert MessageVector.objects.filter(conversation=conversation).count() == 5


def test_top_k_caps_the_retrieved_items(owner, conversation, lexical_only):
    append(conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."})
    filler(conversation, 500, start=3)
    body = context(owner, conversation, user_message=QUESTION, token_budget=2000, retrieval={"top_k": 1})
    assert b5_seqs(body) == [1]
    many = context(owner, conversation, user_message=QUESTION, token_budget=2000)
    assert len(b5_seqs(many)) > 1


def test_vectors_computed_after_the_index_was_read_reach_it(conversation, local_embeddings, monkeypatch):
    from retrieval import history as history_index

    append(conversation, *[{"role": "user", "content": f"Note {n} about the garden shed."} for n in range(4)])
    index = history_index.conversation_index(conversation.id)  # read whole, no vectors yet
    assert len(index.missing_vectors) == 4 and not len(index.vectors)

    message_vectors_fill(conversation_id=conversation.id, limit=1)
    index = history_index.conversation_index(conversation.id)  # a few missing: the fixed statement
    assert len(index.missing_vectors) == 3

    monkeypatch.setattr(history_index, "FIXED_VECTOR_READ", 1)  # a backlog: read in chunks
    message_vectors_fill(conversation_id=conversation.id)
    index = history_index.conversation_index(conversation.id)
    assert not index.missing_vectors
    assert len(index.vectors) == 4


def test_a_backlog_with_no_new_vector_is_not_read_again(conversation, local_embeddings, monkeypatch):
    """Vectors off on append (or a worker behind): each call probes for a new vector with one fixed
    statement instead of opening the chunked read over the whole backlog to find nothing."""
    from retrieval import history as history_index

    append(conversation, *[{"role": "user", "content": f"Note {n} about the garden shed."} for n in range(4)])
    monkeypatch.setattr(history_index, "FIXED_VECTOR_READ", 1)  # 4 missing: a backlog
    history_index.conversation_index(conversation.id)
    chunked = []
    real = history_index._new_vectors
    monkeypatch.setattr(history_index, "_new_vectors", lambda *a: chunked.append(a) or real(*a))
    index = history_index.conversation_index(conversation.id)
    assert (chunked, len(index.missing_vectors)) == ([], 4)

    message_vectors_fill(conversation_id=conversation.id, limit=2)
    index = history_index.conversation_index(conversation.id)
    assert len(chunked) == 1 and len(index.missing_vectors) == 2


def test_other_stores_are_read_before_the_wait_for_the_questions_vector(
    owner, conversation, local_embeddings, monkeypatch
):
    """The question is embedded on another thread meanwhile: knowledge, the other conversations and the
    archival memories are read first, and this conversation's search waits for the vector only after them."""
    from memory.archival import archival_insert
    from retrieval import find as retrieval

    append(conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."})
    archival_insert(end_user=conversation.end_user, content="The ledger's staging DB runs PostgreSQL 16.")
    order = []
    for name in ("_knowledge", "_other_conversations", "_archival", "_query_vector"):
        original = getattr(retrieval, name)
        monkeypatch.setattr(retrieval, name, lambda *a, _n=name, _f=original: order.append(_n) or _f(*a))

    context(owner, conversation, user_message=QUESTION, token_budget=1000)

    assert order[-1] == "_query_vector" and len(order) == 4


def test_no_archival_search_is_started_for_an_end_user_without_archival_memories(
    owner, conversation, local_embeddings, monkeypatch
):
    """Whether any exists is read ahead: nothing is handed to another thread for an empty answer."""
    from retrieval import find as retrieval

    append(conversation, {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."})
    started = []
    monkeypatch.setattr(retrieval, "_archival", lambda *a: started.append(a) or ([], []))

    context(owner, conversation, user_message=QUESTION, token_budget=1000)

    assert started == []
