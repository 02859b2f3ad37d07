"""Task state (B3) and session profile (B2b): events at an expected epoch (409 when it moved; every accepted
event moves it), request_id replay, durable on write, folded into the base (the epoch stays), the overlay on
read, and both blocks in the context."""

import threading
from types import SimpleNamespace

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from memory.models import StateEvent, TaskState
from memory.state import state_fold, state_fold_due
from memory.tasks import state_fold_periodic
from tests.summaries.helpers import context

pytestmark = pytest.mark.django_db


def events_url(conversation) -> str:
    return f"/api/v1/conversations/{conversation.id}/state/events"


def state_url(conversation) -> str:
    return f"/api/v1/conversations/{conversation.id}/state"


def post_event(actor, conversation, event_type, payload, *, epoch=0, request_id=None):
    body = {
        "expected_epoch": epoch,
        "request_id": request_id or f"r-{event_type}-{sorted(payload.items())}",
        "event_type": event_type,
        "payload": payload,
    }
    return actor.client.post(events_url(conversation), body, format="json")


def test_events_overlay_on_read_in_order(owner, conversation):
    assert post_event(owner, conversation, "set", {"path": "step", "value": "build"}).status_code == 201
    post_event(
        owner, conversation, "merge", {"path": "release", "value": {"version": "2.4.0", "rc": 1}}, epoch=1
    )
    post_event(owner, conversation, "append", {"path": "done", "value": "tests"}, epoch=2)
    post_event(owner, conversation, "set", {"path": "release.rc", "value": 2}, epoch=3)
    post_event(owner, conversation, "delete", {"path": "step"}, epoch=4)
    body = owner.client.get(state_url(conversation)).json()
    assert (body["epoch"], body["base_epoch"]) == (5, 0)
    assert body["base"] == {}
    assert body["state"] == {"release": {"version": "2.4.0", "rc": 2}, "done": ["tests"]}
    assert [e["event_type"] for e in body["pending_events"]] == ["set", "merge", "append", "set", "delete"]
    assert [e["epoch"] for e in body["pending_events"]] == [1, 2, 3, 4, 5]


def writer(owner):
    """A second client of the same tenant (another agent process with the key)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.raw_key}")
    return SimpleNamespace(client=client)


def test_two_writers_at_the_same_epoch_only_the_first_is_accepted(owner, conversation):
    member = writer(owner)
    first = post_event(owner, conversation, "set", {"path": "step", "value": "build"}, request_id="a")
    second = post_event(member, conversation, "set", {"path": "step", "value": "deploy"}, request_id="b")
    assert first.status_code == 201
    assert (first.json()["epoch"], first.json()["event"]["epoch"]) == (1, 1)
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "epoch_moved"
    assert second.json()["error"]["extra"] == {"epoch": 1}
    assert owner.client.get(state_url(conversation)).json()["state"] == {"step": "build"}
    # The second writer reads again and appends at the new epoch.
    again = post_event(
        member, conversation, "set", {"path": "step", "value": "deploy"}, epoch=1, request_id="c"
    )
    assert (again.status_code, again.json()["epoch"], again.json()["state"]) == (201, 2, {"step": "deploy"})
    assert StateEvent.objects.filter(conversation=conversation).count() == 2


def test_a_replayed_request_id_does_not_advance_the_epoch(owner, conversation):
    post_event(owner, conversation, "set", {"path": "a", "value": 1}, request_id="same")
    replay = post_event(owner, conversation, "set", {"path": "a", "value": 1}, request_id="same")
    assert (replay.status_code, replay.json()["epoch"]) == (200, 1)
    refused = post_event(owner, conversation, "set", {"path": "", "value": 1}, epoch=1, request_id="bad")
    assert refused.json()["error"]["code"] == "invalid_event"
    assert TaskState.objects.get(conversation=conversation).epoch == 1


def test_request_id_replay_returns_the_original(owner, conversation):
    first = post_event(owner, conversation, "set", {"path": "a", "value": 1}, request_id="same")
    again = post_event(owner, conversation, "set", {"path": "a", "value": 2}, request_id="same")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["event"] == first.json()["event"]
    assert StateEvent.objects.filter(conversation=conversation).count() == 1
    assert again.json()["state"] == {"a": 1}


def test_fold_moves_the_base_not_the_epoch_and_a_stale_epoch_is_a_409(owner, conversation):
    post_event(owner, conversation, "set", {"path": "step", "value": "tag"})
    folded = owner.client.post(f"/api/v1/conversations/{conversation.id}/state/fold").json()
    assert (folded["folded"], folded["epoch"], folded["base_epoch"]) == (1, 1, 1)
    assert (folded["base"], folded["pending_events"]) == ({"step": "tag"}, [])
    stale = post_event(owner, conversation, "set", {"path": "step", "value": "push"}, epoch=0)
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "epoch_moved"
    assert stale.json()["error"]["extra"] == {"epoch": 1}
    # A fold does not change the state, so a writer that read before it is still current.
    ok = post_event(owner, conversation, "set", {"path": "step", "value": "push"}, epoch=1)
    assert ok.status_code == 201
    assert (ok.json()["state"], ok.json()["base"], ok.json()["epoch"]) == (
        {"step": "push"},
        {"step": "tag"},
        2,
    )
    assert state_fold(conversation=conversation) == 1
    assert state_fold(conversation=conversation) == 0  # nothing pending
    task_state = TaskState.objects.get(conversation=conversation)
    assert (task_state.epoch, task_state.base_epoch, task_state.state) == (2, 2, {"step": "push"})


def test_periodic_fold_picks_conversations_with_enough_events(owner, conversation, settings):
    settings.MNEMO_STATE_FOLD_MIN_EVENTS = 2
    settings.MNEMO_STATE_FOLD_MIN_AGE_SECONDS = 3600
    post_event(owner, conversation, "set", {"path": "a", "value": 1})
    assert state_fold_due(min_events=2, min_age_seconds=3600) == []
    post_event(owner, conversation, "set", {"path": "b", "value": 2}, epoch=1)
    assert state_fold_due(min_events=2, min_age_seconds=3600) == [conversation.id]
    assert state_fold_periodic() == 1  # eager Celery: folded in-process
    assert TaskState.objects.get(conversation=conversation).state == {"a": 1, "b": 2}
    assert state_fold_due(min_events=1, min_age_seconds=0) == []


def test_events_are_durable_rows_on_write(owner, conversation):
    post_event(owner, conversation, "set", {"path": "x", "value": [1, 2]})
    event = StateEvent.objects.get(conversation=conversation)
    assert (event.epoch, event.event_type, event.payload) == (1, "set", {"path": "x", "value": [1, 2]})


@pytest.mark.parametrize(
    "body, error",
    [
        ({"expected_epoch": 0, "request_id": "r", "event_type": "nope", "payload": {}}, "invalid_choice"),
        ({"expected_epoch": -1, "request_id": "r", "event_type": "set", "payload": {}}, "min_value"),
        ({"request_id": "r", "event_type": "set", "payload": {"path": "a"}}, "required"),
        ({"expected_epoch": 0, "request_id": "r", "event_type": "set", "payload": {}}, "invalid_event"),
        (
            {"expected_epoch": 0, "request_id": "r", "event_type": "merge", "payload": {"value": 1}},
            "invalid_event",
        ),
        ({"expected_epoch": 0, "request_id": "r", "event_type": "set", "extra": 1}, "unknown_field"),
    ],
)
def test_bad_events_are_400(owner, conversation, body, error):
    response = owner.client.post(events_url(conversation), body, format="json")
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not StateEvent.objects.exists()


def test_append_to_a_non_list_is_refused(owner, conversation):
    post_event(owner, conversation, "set", {"path": "a", "value": "text"})
    response = post_event(owner, conversation, "append", {"path": "a", "value": 1}, epoch=1)
    assert response.json()["error"]["code"] == "invalid_event"


def test_outsider_and_anonymous(owner, outsider, anonymous, conversation):
    post_event(owner, conversation, "set", {"path": "secret", "value": 1})
    assert outsider.client.get(state_url(conversation)).status_code == 404
    assert post_event(outsider, conversation, "set", {"path": "a", "value": 1}).status_code == 404
    assert outsider.client.post(f"/api/v1/conversations/{conversation.id}/state/fold").status_code == 404
    assert anonymous.get(state_url(conversation)).status_code == 401
    assert anonymous.post(events_url(conversation), {}, format="json").status_code == 401
    assert owner.client.get("/api/v1/conversations/not-a-uuid/state").status_code == 404
    assert StateEvent.objects.count() == 1


def test_b3_and_b2b_in_the_current_user_message(owner, conversation):
    post_event(owner, conversation, "set", {"path": "step", "value": "tag"})
    post_event(
        owner, conversation, "merge", {"path": "session_profile", "value": {"locale": "de-DE"}}, epoch=1
    )
    body = context(owner, conversation)
    assert body["blocks"]["B3"]["items"][0]["kind"] == "task_state"
    assert body["blocks"]["B3"]["items"][0]["epoch"] == 2
    assert body["blocks"]["B2b"]["items"][0]["kind"] == "session_profile"
    user_text = body["messages"][-1]["content"]
    assert '## Task state\n{"step":"tag"}' in user_text
    assert "## Session profile\nlocale: de-DE" in user_text
    assert "step" not in body["system"]


# --- concurrency and the migration -------------------------------------------------------------------------

WRITERS = 8


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_at_one_epoch_exactly_one_wins(owner, conversation):
    if connection.vendor != "postgresql":
        pytest.skip("row-lock concurrency is tested on PostgreSQL (set DATABASE_URL)")
    statuses: list[int] = []
    start = threading.Barrier(WRITERS)

    def write(n: int, epoch: int) -> None:
        payload = {"path": "log", "value": f"w{n}"}
        try:
            start.wait()
            response = post_event(
                writer(owner), conversation, "append", payload, epoch=epoch, request_id=f"{epoch}-{n}"
            )
            statuses.append(response.status_code)
        finally:
            connections.close_all()

    for epoch in range(5):  # five rounds: every round, all writers race at the epoch they all read
        threads = [threading.Thread(target=write, args=(n, epoch)) for n in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses[-WRITERS:]) == [201] + [409] * (WRITERS - 1)

    body = owner.client.get(state_url(conversation)).json()
    assert body["epoch"] == 5
    assert [e["epoch"] for e in body["pending_events"]] == [1, 2, 3, 4, 5]
    assert len(body["state"]["log"]) == 5


@pytest.mark.django_db(transaction=True)
def test_the_migration_numbers_existing_events_one_epoch_each(owner):
    from conversations.services import conversation_create

    conversation = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Old")
    executor = MigrationExecutor(connection)
    leaf = executor.loader.graph.leaf_nodes("memory")
    executor.migrate([("memory", "0005_operation_details")])
    try:
        apps = executor.loader.project_state([("memory", "0005_operation_details")]).apps
        old_state, old_event = apps.get_model("memory", "TaskState"), apps.get_model("memory", "StateEvent")
        # The old scheme: two events folded at epoch 0 (the fold bumped it to 1), two pending at epoch 1.
        old_state.objects.create(conversation_id=conversation.pk, state={"a": 1, "b": 2}, epoch=1)
        for n, (key, epoch) in enumerate([("a", 0), ("b", 0), ("c", 1), ("d", 1)]):
            payload = {"path": key, "value": n + 1}
            old_event.objects.create(
                conversation_id=conversation.pk,
                epoch=epoch,
                event_type="set",
                payload=payload,
                request_id=key,
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaf)
    body = owner.client.get(state_url(conversation)).json()
    assert (body["epoch"], body["base_epoch"]) == (4, 2)
    assert [e["request_id"] for e in body["pending_events"]] == ["c", "d"]
    assert body["state"] == {"a": 1, "b": 2, "c": 3, "d": 4}
    assert post_event(owner, conversation, "set", {"path": "e", "value": 5}, epoch=1).status_code == 409
    assert post_event(owner, conversation, "set", {"path": "e", "value": 5}, epoch=4).status_code == 201


@pytest.mark.parametrize("path", [5, ["a"], {"a": 1}, True])
def test_a_path_that_is_not_a_string_is_refused(owner, conversation, path):
    response = post_event(owner, conversation, "set", {"path": path, "value": 1}, request_id="p")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_event"
    assert not StateEvent.objects.exists()
