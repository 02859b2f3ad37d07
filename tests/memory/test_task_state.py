"""Task state (B3) and session profile (B2b): events at an expected epoch (409 when it moved), request_id
replay, durable on write, folded into the base (epoch bump), the overlay on read, and both blocks in the
context."""

import pytest

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
    post_event(owner, conversation, "merge", {"path": "release", "value": {"version": "2.4.0", "rc": 1}})
    post_event(owner, conversation, "append", {"path": "done", "value": "tests"})
    post_event(owner, conversation, "set", {"path": "release.rc", "value": 2})
    post_event(owner, conversation, "delete", {"path": "step"})
    body = owner.client.get(state_url(conversation)).json()
    assert body["epoch"] == 0
    assert body["base"] == {}
    assert body["state"] == {"release": {"version": "2.4.0", "rc": 2}, "done": ["tests"]}
    assert [e["event_type"] for e in body["pending_events"]] == ["set", "merge", "append", "set", "delete"]


def test_request_id_replay_returns_the_original(owner, conversation):
    first = post_event(owner, conversation, "set", {"path": "a", "value": 1}, request_id="same")
    again = post_event(owner, conversation, "set", {"path": "a", "value": 2}, request_id="same")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["event"] == first.json()["event"]
    assert StateEvent.objects.filter(conversation=conversation).count() == 1
    assert again.json()["state"] == {"a": 1}


def test_fold_bumps_the_epoch_and_a_stale_epoch_is_a_409(owner, conversation):
    post_event(owner, conversation, "set", {"path": "step", "value": "tag"})
    folded = owner.client.post(f"/api/v1/conversations/{conversation.id}/state/fold").json()
    assert (folded["folded"], folded["epoch"], folded["base"]) == (1, 1, {"step": "tag"})
    assert folded["pending_events"] == []
    stale = post_event(owner, conversation, "set", {"path": "step", "value": "push"}, epoch=0)
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "epoch_moved"
    assert stale.json()["error"]["extra"] == {"epoch": 1}
    ok = post_event(owner, conversation, "set", {"path": "step", "value": "push"}, epoch=1)
    assert ok.status_code == 201
    assert ok.json()["state"] == {"step": "push"}
    assert state_fold(conversation=conversation) == 1
    assert state_fold(conversation=conversation) == 0  # nothing pending: the epoch stays
    assert TaskState.objects.get(conversation=conversation).epoch == 2


def test_periodic_fold_picks_conversations_with_enough_events(owner, conversation, settings):
    settings.MNEMO_STATE_FOLD_MIN_EVENTS = 2
    settings.MNEMO_STATE_FOLD_MIN_AGE_SECONDS = 3600
    post_event(owner, conversation, "set", {"path": "a", "value": 1})
    assert state_fold_due(min_events=2, min_age_seconds=3600) == []
    post_event(owner, conversation, "set", {"path": "b", "value": 2})
    assert state_fold_due(min_events=2, min_age_seconds=3600) == [conversation.id]
    assert state_fold_periodic() == 1  # eager Celery: folded in-process
    assert TaskState.objects.get(conversation=conversation).state == {"a": 1, "b": 2}
    assert state_fold_due(min_events=1, min_age_seconds=0) == []


def test_events_are_durable_rows_on_write(owner, conversation):
    post_event(owner, conversation, "set", {"path": "x", "value": [1, 2]})
    event = StateEvent.objects.get(conversation=conversation)
    assert (event.epoch, event.event_type, event.payload) == (0, "set", {"path": "x", "value": [1, 2]})


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
    response = post_event(owner, conversation, "append", {"path": "a", "value": 1})
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
    post_event(owner, conversation, "merge", {"path": "session_profile", "value": {"locale": "de-DE"}})
    body = context(owner, conversation)
    assert body["blocks"]["B3"]["items"][0]["kind"] == "task_state"
    assert body["blocks"]["B3"]["items"][0]["epoch"] == 0
    assert body["blocks"]["B2b"]["items"][0]["kind"] == "session_profile"
    user_text = body["messages"][-1]["content"]
    assert '## Task state\n{"step":"tag"}' in user_text
    assert "## Session profile\nlocale: de-DE" in user_text
    assert "step" not in body["system"]
