"""Admin: the conversation page lists its segments with their fact-check counts, the actions "compact now"
and "rebuild summaries" work for operators of the tenant, and nobody sees another tenant's segments."""

import pytest
from django.urls import reverse

from conversations.models import Message
from summaries.models import SummarySegment
from summaries.selectors import segments_live
from summaries.services import compaction_run
from tenants.models import Membership
from tests.factories import MembershipFactory
from tests.summaries.helpers import history

pytestmark = pytest.mark.django_db


def changelist_action(client, action: str, ids) -> object:
    return client.post(
        reverse("admin:conversations_conversation_changelist"),
        {"action": action, "_selected_action": [str(i) for i in ids]},
    )


def test_the_conversation_page_shows_its_segments_with_fact_counts(client, member, conversation):
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="manual")
    segment = outcome.segments[0]
    client.force_login(member.user)
    page = client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Summary segments (B4)" in html
    assert f"{segment.start_seq}–{segment.end_seq}" in html
    assert f"<td>{segment.facts_checked}</td><td>{segment.facts_missing}</td>" in html
    assert reverse("admin:summaries_summarysegment_change", args=[segment.pk]) in html


def test_compact_now_and_rebuild_summaries(client, member, conversation, django_capture_on_commit_callbacks):
    history(conversation, 20)
    client.force_login(member.user)
    with django_capture_on_commit_callbacks(execute=True):
        response = changelist_action(client, "compact_now", [conversation.pk])
    assert response.status_code == 302
    (first,) = segments_live(conversation=conversation)

    with django_capture_on_commit_callbacks(execute=True):
        response = changelist_action(client, "rebuild_summaries", [conversation.pk])
    assert response.status_code == 302
    (rebuilt,) = segments_live(conversation=conversation)
    assert rebuilt.pk != first.pk
    assert (rebuilt.start_seq, rebuilt.end_seq) == (first.start_seq, first.end_seq)
    first.refresh_from_db()
    assert first.superseded_by_id == rebuilt.pk
    assert rebuilt.metadata["rebuild_of"] == str(first.pk)
    assert Message.objects.filter(conversation=conversation, kind="compact_summary").count() == 2


def test_support_staff_see_segments_but_cannot_run_the_actions(client, owner, conversation):
    support = MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)
    history(conversation, 20)
    compaction_run(conversation=conversation, trigger="manual")
    client.force_login(support.user)
    page = client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    assert page.status_code == 200 and "Summary segments (B4)" in page.content.decode()
    changelist = client.get(reverse("admin:conversations_conversation_changelist"))
    assert "compact_now" not in changelist.content.decode()


def test_nobody_sees_another_tenants_segments(client, member, outsider_conversation):
    history(outsider_conversation, 20)
    outcome = compaction_run(conversation=outsider_conversation, trigger="manual")
    client.force_login(member.user)
    listing = client.get(reverse("admin:summaries_summarysegment_changelist"))
    assert listing.status_code == 200
    assert list(listing.context["cl"].result_list) == []
    detail = client.get(reverse("admin:summaries_summarysegment_change", args=[outcome.segments[0].pk]))
    assert detail.status_code == 302
    # An action on a foreign id selects nothing.
    response = changelist_action(client, "compact_now", [outsider_conversation.pk])
    assert response.status_code == 302  # Django's "no items selected", back to the list
    assert SummarySegment.objects.filter(conversation=outsider_conversation).count() == 1
