"""A context call that records nothing (the admin inspector's dry run, record=False) changes no row of any
table and queues no work; the same call recorded writes what the stages noted (the pipeline state row, the
core-memory snapshot, the window start, the prefix hints and the cache-usage row, a queued compaction).

Each runs with and without an embedder: with one, a call asks for the history's missing vectors, also one of
its collected writes."""

import pytest
from celery.app.task import Task
from django.apps import apps

from context.models import ConversationContext
from context.pipeline import context_assemble
from context.state import ContextRequest
from memory.models import CoreMemorySnapshot
from prefix_cache.models import CacheUsage, PrefixHint
from summaries.services import compaction_run
from tests.context.helpers import exchanges
from tests.summaries.helpers import budgets

pytestmark = pytest.mark.django_db

QUESTION = "what did we decide about exchange 3?"


@pytest.fixture(params=["lexical_only", "local_embeddings"])
def loaded(request, owner, conversation, settings):
    """History with a summary segment before its boundary, archival and core memory, a small history budget
    (so a call cuts the window and wants a compaction) and no context call yet (so a call has first-call
    rows to store)."""
    request.getfixturevalue(request.param)
    exchanges(conversation, 12, tokens=40, label="early")
    compaction_run(conversation=conversation, trigger="manual")
    exchanges(conversation, 40, tokens=40)
    for content in ["The export job runs nightly.", "Exchange 3 decided to keep the backup."]:
        response = owner.client.post("/api/v1/users/alice/memories", {"content": content}, format="json")
        assert response.status_code == 201, response.content
    response = owner.client.put(
        "/api/v1/users/alice/memory/blocks/human", {"value": "Alice runs the ops team."}, format="json"
    )
    assert response.status_code in (200, 201), response.content
    budgets(owner.tenant, history=1000)
    # From here on, missing vectors are asked for (the history above has none yet).
    settings.MNEMO_EMBED_ON_APPEND = request.param == "local_embeddings"
    conversation.refresh_from_db()
    return conversation


def row_counts() -> dict[str, int]:
    return {
        model._meta.label: model._base_manager.count()
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy
    }


@pytest.fixture
def queued(monkeypatch):
    """Every Celery task sent (apply_async, which delay calls), held instead of run."""
    sent = []
    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: sent.append(self.name))
    return sent


def assemble(conversation, *, record: bool):
    request = ContextRequest(user_message=QUESTION, token_budget=1500, record=record)
    return context_assemble(conversation=conversation, request=request)


def test_a_dry_run_changes_no_row_and_queues_nothing(loaded, queued, django_capture_on_commit_callbacks):
    before = row_counts()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        state = assemble(loaded, record=False)
    assert row_counts() == before
    assert callbacks == []
    assert queued == []
    assert state.context_id is None
    # It had writes to leave out: the first call's rows, the window's cut, the prefix hints, a compaction.
    assert state.writes
    assert any(d.block == "B6" and d.reason == "budget" for d in state.dropped)
    assert state.layout.summaries and state.layout.core_memory
    assert not ConversationContext.objects.filter(conversation=loaded).exists()


def test_the_same_call_recorded_writes(loaded, queued, django_capture_on_commit_callbacks):
    before = row_counts()
    with django_capture_on_commit_callbacks() as callbacks:
        state = assemble(loaded, record=True)
    after = row_counts()
    assert after["prefix_cache.CacheUsage"] == before["prefix_cache.CacheUsage"] + 1
    assert CacheUsage.objects.filter(pk=state.context_id).exists()
    assert after["prefix_cache.PrefixHint"] > before["prefix_cache.PrefixHint"]
    assert PrefixHint.objects.filter(tenant=loaded.tenant).exists()
    assert CoreMemorySnapshot.objects.filter(conversation=loaded).exists()
    context = ConversationContext.objects.get(conversation=loaded)
    assert context.window_start_seq == state.context.window_start_seq > 0
    assert callbacks  # the compaction the history outgrew, queued on commit


def test_a_dry_run_after_recorded_calls_still_writes_nothing(
    loaded, queued, django_capture_on_commit_callbacks
):
    """Steady state: the rows exist; hits would be counted and the window could move again."""
    assemble(loaded, record=True)
    exchanges(loaded, 30, tokens=40, label="later")
    queued.clear()  # what the appends queued
    before = row_counts()
    window = ConversationContext.objects.get(conversation=loaded).window_start_seq
    hits = sorted(PrefixHint.objects.values_list("hash", "hits"))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        state = assemble(loaded, record=False)
    assert row_counts() == before
    assert callbacks == [] and queued == []
    assert ConversationContext.objects.get(conversation=loaded).window_start_seq == window
    assert sorted(PrefixHint.objects.values_list("hash", "hits")) == hits
    assert state.context.window_start_seq > window  # the prompt moved it; the table did not
