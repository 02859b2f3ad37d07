import pytest

from conversations.models import Turn

pytestmark = pytest.mark.django_db


def turns_url(conversation):
    return f"/api/v1/conversations/{conversation.id}/turns"


def test_starting_a_turn_ends_the_previous_and_messages_join_the_active_turn(owner, conversation):
    first = owner.client.post(turns_url(conversation))
    assert first.status_code == 201
    assert (first.json()["index"], first.json()["status"]) == (1, "active")
    message = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages", {"role": "user", "content": "go"}, format="json"
    ).json()
    assert message["turn_id"] == first.json()["id"]

    second = owner.client.post(turns_url(conversation), {}, format="json").json()
    assert second["index"] == 2
    assert Turn.objects.get(pk=first.json()["id"]).status == "ended"
    assert Turn.objects.get(pk=first.json()["id"]).ended_at is not None
    assert Turn.objects.filter(conversation=conversation, status="active").count() == 1


def test_ending_a_turn_is_idempotent_and_closes_it_to_new_messages(owner, conversation):
    turn = owner.client.post(turns_url(conversation)).json()
    end_url = f"{turns_url(conversation)}/{turn['id']}/end"
    ended = owner.client.post(end_url)
    assert ended.status_code == 200
    assert ended.json()["status"] == "ended"
    again = owner.client.post(end_url)
    assert again.json()["ended_at"] == ended.json()["ended_at"]
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "user", "content": "late", "turn_id": turn["id"]},
        format="json",
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "turn_ended"
    # Without an active turn a message belongs to no turn.
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "user", "content": "free"},
        format="json",
    )
    assert response.json()["turn_id"] is None


def test_bad_input(owner, conversation):
    response = owner.client.post(turns_url(conversation), {"index": 7}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_field"
    assert not Turn.objects.exists()
    assert owner.client.post(f"{turns_url(conversation)}/not-a-uuid/end").status_code == 404


def test_outsider_gets_404(owner, outsider, conversation):
    turn = owner.client.post(turns_url(conversation)).json()
    assert outsider.client.post(turns_url(conversation)).status_code == 404
    assert outsider.client.post(f"{turns_url(conversation)}/{turn['id']}/end").status_code == 404
    assert Turn.objects.get(pk=turn["id"]).status == "active"
    assert Turn.objects.count() == 1


def test_anonymous_gets_401(anonymous, conversation):
    assert anonymous.post(turns_url(conversation)).status_code == 401
