"""POST /api/v1/conversations/{id}/compact and GET …/summaries: what they return, and what the outsider
gets (404)."""

import pytest

from conversations.models import Message
from summaries.locks import compaction_lock
from summaries.selectors import segments_live
from tests.summaries.helpers import append, b6_tokens, budgets, history

pytestmark = pytest.mark.django_db


def compact_url(conversation) -> str:
    return f"/api/v1/conversations/{conversation.id}/compact"


def test_compact_returns_tokens_ratio_segment_files_and_source(owner, conversation):
    history(conversation, 30)
    before = b6_tokens(conversation, 0)
    response = owner.client.post(compact_url(conversation), {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["trigger"] == "manual"
    assert body["source"] == "extractive"
    assert body["tokens_before"] == before
    assert body["tokens_after"] < body["tokens_before"] * 0.7
    assert body["ratio"] == round(body["tokens_after"] / body["tokens_before"], 4)
    (segment,) = segments_live(conversation=conversation)
    assert body["segment"]["id"] == str(segment.id)
    assert body["segment"]["text"] == segment.text
    assert body["segment"]["facts_checked"] == segment.facts_checked
    assert body["boundary"]["end_seq"] == segment.end_seq
    assert (
        body["boundary"]["seq"] == Message.objects.get(conversation=conversation, kind="compact_boundary").seq
    )
    names = [a["name"] for a in body["attachments"]]
    assert "services/module_0/handler.py" in names
    assert body["messages_summarised"] + body["messages_kept"] == 60
    assert [d["code"] for d in body["degradations"]] == ["offline_summariser"]


def test_instructions_are_recorded_with_the_segment(owner, conversation):
    # How they steer the summary: the LLM prompt carries them (test_llm_path), the extractive summariser
    # raises the sentences that share their terms (tests/providers/test_summariser.py).
    history(conversation, 30)
    body = owner.client.post(
        compact_url(conversation), {"instructions": "Keep everything about the printer jam."}, format="json"
    ).json()
    (segment,) = segments_live(conversation=conversation)
    assert body["segment"]["id"] == str(segment.id)
    assert segment.metadata["instructions"] == "Keep everything about the printer jam."


def test_compact_without_enough_history_is_a_409(owner, conversation):
    append(conversation, {"role": "user", "content": "hi"})
    response = owner.client.post(compact_url(conversation), {}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "nothing_to_compact"


def test_compact_while_another_compaction_runs_is_a_409(owner, conversation):
    history(conversation, 10)
    with compaction_lock(conversation.pk, ttl=60):
        response = owner.client.post(compact_url(conversation), {}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "compaction_in_progress"


def test_compact_refuses_unknown_fields_and_overlong_instructions(owner, conversation):
    history(conversation, 10)
    response = owner.client.post(compact_url(conversation), {"instruction": "typo"}, format="json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "unknown_field")
    response = owner.client.post(compact_url(conversation), {"instructions": "x" * 4001}, format="json")
    assert response.status_code == 400


def test_the_outsider_gets_404_and_changes_nothing(owner, outsider, conversation):
    history(conversation, 10)
    assert outsider.client.post(compact_url(conversation), {}, format="json").status_code == 404
    assert outsider.client.get(f"/api/v1/conversations/{conversation.id}/summaries").status_code == 404
    assert not Message.objects.filter(conversation=conversation, kind="compact_boundary").exists()


def test_summaries_lists_live_segments_and_all_with_superseded(owner, conversation):
    budgets(owner.tenant, summary=300)
    for n in range(3):
        history(conversation, 20, start=n * 20)
        assert owner.client.post(compact_url(conversation), {}, format="json").status_code == 200
    live = owner.client.get(f"/api/v1/conversations/{conversation.id}/summaries").json()["results"]
    everything = owner.client.get(f"/api/v1/conversations/{conversation.id}/summaries?all=true").json()[
        "results"
    ]
    assert [s["id"] for s in live] == [str(s.id) for s in segments_live(conversation=conversation)]
    assert all(s["superseded_by"] is None for s in live)
    assert len(everything) > len(live)
    assert any(s["superseded_by"] for s in everything)


def test_anonymous_is_refused(anonymous, conversation):
    assert anonymous.post(compact_url(conversation), {}, format="json").status_code == 401
