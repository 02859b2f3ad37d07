"""What a context call asks the database: the number of queries of a steady call on a plain conversation
(bench/context_latency.py counts the same on PostgreSQL), and the stored question a caller holds (the chat
proxy's just-appended message) used as it is, never a row of another conversation or role."""

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from context.pipeline import context_assemble
from context.state import ContextRequest
from conversations.embedding import message_vectors_fill
from conversations.models import Conversation
from tests.context.helpers import append, exchanges
from tests.factories import ConversationFactory

pytestmark = pytest.mark.django_db

# A conversation with an end user, no documents or images, on the test database (SQLite): the context state;
# the default profile, last boundary, live segments, core memory (snapshot, blocks) and B6; the task state;
# the history index's new rows and vectors, archival memories, other conversations, the knowledge
# fingerprint, the conversation's images; the attachments' two checks; the prefix hints (read, count, add)
# and the cache-usage row; the call's savepoint and its release. A change to it should be a choice.
STEADY_QUERIES = 22


def _assemble(conversation, **request):
    return context_assemble(conversation=conversation, request=ContextRequest(**request))


def test_a_steady_call_on_a_plain_conversation_makes_a_fixed_number_of_queries(
    owner, conversation, django_assert_num_queries
):
    exchanges(conversation, 4)
    _assemble(conversation, user_message="what did we decide about the export job?")
    with django_assert_num_queries(STEADY_QUERIES):
        _assemble(conversation, user_message="and what about the nightly backup?")


def test_the_held_question_row_is_not_read_again(owner, conversation):
    exchanges(conversation, 2)
    (question,) = append(conversation, {"role": "user", "content": "is the backup fixed?"})
    _assemble(conversation, user_message="", user_message_id=question.id)  # the prompt's hints exist now
    with CaptureQueriesContext(connection) as reading:
        read = _assemble(conversation, user_message="", user_message_id=question.id)
    with CaptureQueriesContext(connection) as holding:
        held = _assemble(
            conversation, user_message="", user_message_id=question.id, user_message_row=question
        )
    assert len(holding) == len(reading) - 1
    assert held.rendered.messages == read.rendered.messages
    assert held.history_until == read.history_until == question.seq - 1


@pytest.mark.parametrize("mismatch", ["other_conversation", "assistant", "other_id"])
def test_a_held_row_that_does_not_match_is_read_from_the_database(owner, conversation, mismatch):
    (question, reply) = append(
        conversation, {"role": "user", "content": "the question"}, {"role": "assistant", "content": "a reply"}
    )
    held = {
        "other_conversation": append(
            ConversationFactory(tenant=conversation.tenant), {"role": "user", "content": "elsewhere"}
        )[0],
        "assistant": reply,
        "other_id": append(conversation, {"role": "user", "content": "a later one"})[0],
    }[mismatch]
    state = _assemble(conversation, user_message="", user_message_id=question.id, user_message_row=held)
    assert state.layout.user_message == "the question"
    assert state.history_until == question.seq - 1


def test_every_read_a_call_reads_ahead_is_one_it_makes(owner, conversation, local_embeddings, monkeypatch):
    """call_reads lists reads for reading them ahead; one the stages no longer make would cost every call
    a statement for nothing (and one they make with other values would be read twice). Listed before each
    call, as read_ahead does. The history index catches up on what was appended since it last looked: the
    new messages and, when there are some, their vectors (read ahead in case, as the catch-up cannot know
    before its messages come back), also across seqs it never reads (a compaction's boundary)."""
    from context.load import call_reads
    from retrieval.history import _NEW_MESSAGES, _NEW_VECTORS
    from tenants import statements

    made = []
    run = statements.FixedQuery.run

    def recording(self, *, using="default", **values):
        made.append((self, statements._key(self.bound(using, values)[1])))
        return run(self, using=using, **values)

    monkeypatch.setattr(statements.FixedQuery, "run", recording)
    # As with a Celery worker: vectors are written elsewhere, and this process's index reads them when asked.
    monkeypatch.setattr("retrieval.receivers.conversation_index_warm", lambda conversation_id: None)
    for call in range(3):
        if call == 2:  # seqs the index never reads before the new messages
            Conversation.objects.filter(pk=conversation.pk).update(last_seq=F("last_seq") + 5)
        if call != 1:  # the second call follows no appends
            exchanges(conversation, 3, label=f"call {call}")
        # Every vector written: the index misses none of what it read, and catches up from the new messages.
        message_vectors_fill(conversation_id=conversation.pk)
        listed = [
            (query, statements._key(query.bound("default", values)[1]))
            for query, values in call_reads(conversation, retrieval=True)
        ]
        made.clear()
        _assemble(conversation, user_message="what did we decide about the export job?")
        assert len(listed) == len(set(listed))
        unmade = {query for query, key in listed if (query, key) not in made}
        assert unmade == ({_NEW_VECTORS} if call == 1 else set())
        # None before the first call, which reads the index whole.
        assert (_NEW_MESSAGES in {query for query, _ in listed}) == (call > 0)
