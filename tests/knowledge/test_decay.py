"""Attachment decay (P0–P3): a conversation's documents and the images its user sent reach the current
message by priority (this turn in full, named again described, earlier in this conversation summarised, the
end user's other conversations by name), under the budget, with what was shortened listed in `dropped`."""

import pytest

from context.decay import Entry, _fit
from context.dropped import Dropped
from conversations.services import conversation_create
from prefix_cache.provenance import AttachmentSource
from tests.cold_storage.helpers import frame, image_part
from tests.context.helpers import append, context, context_call
from tests.knowledge.conftest import upload

pytestmark = pytest.mark.django_db

NOTES = (
    b"# Refund policy\n\nRefunds are paid within 14 days of the request, to the card that paid.\n\n"
    b"## Shipping\n\nOrders ship from the Leipzig warehouse within 3 working days.\n"
)
PLAN = b"# Launch plan\n\nThe launch moves to the 12th of March; marketing owns the announcement.\n"


def attachments(body) -> list[dict]:
    return body["blocks"].get("attachments", {}).get("items", [])


def by_name(body) -> dict[str, dict]:
    return {item["name"]: item for item in attachments(body)}


def section(body) -> str:
    prompt = body["messages"][-1]["content"]
    if "## Attachments and tool output" not in prompt:
        return ""
    return prompt.split("## Attachments and tool output", 1)[1].split("## User question", 1)[0]


def decay_drops(body) -> list[dict]:
    return [d for d in body["dropped"] if d["block"] == "attachments"]


def exchange(conversation, text="ok"):
    append(conversation, {"role": "user", "content": text}, {"role": "assistant", "content": "Noted."})


# --- priorities -------------------------------------------------------------------------------------------


def test_a_document_uploaded_this_turn_is_p0_with_its_content(owner, conversation):
    exchange(conversation)
    upload(owner, ("notes.md", NOTES), conversation=str(conversation.pk))
    body = context(owner, conversation, user_message="Please check this file.")
    item = by_name(body)["notes.md"]
    assert (item["priority"], item["level"], item["reason"], item["attachment"]) == (
        "P0",
        "content",
        "this_turn",
        "document",
    )
    assert "Orders ship from the Leipzig warehouse within 3 working days." in section(body)
    assert decay_drops(body) == []


def test_after_the_reply_it_is_p2_a_short_summary(owner, conversation):
    upload(owner, ("notes.md", NOTES), conversation=str(conversation.pk))
    exchange(conversation, "here is the file")
    body = context(owner, conversation, user_message="What next?")
    item = by_name(body)["notes.md"]
    assert (item["priority"], item["level"], item["reason"]) == ("P2", "summary", "this_conversation")
    text = section(body)
    assert "notes.md (MARKDOWN" in text and "Refund policy; Refund policy > Shipping" in text
    assert "Leipzig warehouse" not in text  # the content stays out; retrieval may still cite it (B5)


def test_named_again_it_is_p1_with_its_description(owner, conversation):
    upload(owner, ("notes.md", NOTES), conversation=str(conversation.pk))
    exchange(conversation)
    body = context(owner, conversation, user_message="What did notes.md say again?")
    item = by_name(body)["notes.md"]
    assert (item["priority"], item["level"], item["reason"]) == ("P1", "description", "referenced")
    assert "Contents: Refund policy; Refund policy > Shipping" in section(body)
    assert "Refunds are paid within 14 days" in section(body)  # its opening


def test_by_id_too(owner, conversation):
    response = upload(owner, ("plan.md", PLAN), conversation=str(conversation.pk))
    document_id = response.json()["documents"][0]["id"]
    exchange(conversation)
    body = context(owner, conversation, user_message=f"Summarise document {document_id}")
    assert by_name(body)["plan.md"]["priority"] == "P1"


def test_reattached_by_name_it_is_p1_and_listed_once(owner, conversation):
    upload(owner, ("notes.md", NOTES), conversation=str(conversation.pk))
    exchange(conversation)
    body = context(owner, conversation, user_message="Again, please.", attachments=[{"name": "notes.md"}])
    [item] = attachments(body)
    assert (item["priority"], item["reason"], item["level"]) == ("P1", "reattached", "description")


def test_sent_with_content_the_request_copy_wins_and_the_stored_one_is_not_repeated(owner, conversation):
    upload(owner, ("notes.md", NOTES), conversation=str(conversation.pk))
    exchange(conversation)
    sent = {"name": "notes.md", "content": "Refunds: 30 days now."}
    body = context(owner, conversation, user_message="Updated file.", attachments=[sent])
    [item] = attachments(body)
    assert (item["priority"], item.get("attachment")) == ("P0", None)
    assert "Refunds: 30 days now." in section(body) and "Refund policy" not in section(body)


def test_the_end_users_other_conversations_are_names_only_and_nothing_else_leaks(
    owner, outsider, conversation
):
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Earlier")
    upload(owner, ("plan.md", PLAN), conversation=str(earlier.pk))
    bobs = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Bob's")
    upload(owner, ("bob.md", NOTES), conversation=str(bobs.pk))
    theirs = conversation_create(tenant=outsider.tenant, end_user_external_id="alice")
    upload(outsider, ("outsider.md", NOTES), conversation=str(theirs.pk))
    exchange(conversation)
    body = context(owner, conversation, user_message="Anything new?")
    assert set(by_name(body)) == {"plan.md"}
    item = by_name(body)["plan.md"]
    assert (item["priority"], item["level"], item["reason"]) == ("P3", "name", "other_conversation")
    assert "- plan.md (earlier conversation, " in section(body)
    assert "launch moves" not in section(body)
    # Named, it is described (it is the same end user's); bob's and the outsider's stay out even when named.
    body = context(owner, conversation, user_message="What did plan.md, bob.md and outsider.md say?")
    assert set(by_name(body)) == {"plan.md"}
    assert by_name(body)["plan.md"]["priority"] == "P1"
    assert "launch moves to the 12th of March" in section(body)


def test_the_outsider_gets_a_404_for_the_context_of_a_conversation_with_attachments(
    owner, outsider, conversation
):
    upload(owner, ("notes.md", NOTES), conversation=str(conversation.pk))
    response = context_call(outsider, conversation, user_message="notes.md?")
    assert response.status_code == 404


# --- the budget -------------------------------------------------------------------------------------------


def test_a_small_budget_steps_the_lowest_priority_down_first_and_lists_it(owner, conversation):
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Earlier")
    upload(owner, ("plan.md", PLAN), conversation=str(earlier.pk))
    upload(owner, ("old.md", PLAN + b"\nOld notes on the warehouse move."), conversation=str(conversation.pk))
    exchange(conversation)
    upload(owner, ("notes.md", NOTES * 20), conversation=str(conversation.pk))
    roomy = context(owner, conversation, user_message="Read the new file.", retrieval={"enabled": False})
    assert {i["name"]: i["level"] for i in attachments(roomy)} == {
        "notes.md": "content",
        "old.md": "summary",
        "plan.md": "name",
    }
    tight = context(
        owner, conversation, user_message="Read the new file.", token_budget=420, retrieval={"enabled": False}
    )
    drops = {d["name"]: d for d in decay_drops(tight)}
    assert drops["plan.md"]["to"] == "dropped" and drops["plan.md"]["priority"] == "P3"
    assert drops["notes.md"]["from"] == "content" and drops["notes.md"]["tokens"] > 0
    assert "notes.md" in by_name(tight)  # P0 is shortened, never dropped
    assert tight["tokens"]["total"] <= 420
    assert all(d["reason"] == "decay" for d in decay_drops(tight))


def _entry(priority, order, **texts):
    start = {"P0": "content", "P1": "description", "P2": "summary", "P3": "name"}[priority]
    return Entry(
        priority, (order,), texts, AttachmentSource(name=f"{priority}-{order}", priority=priority), start
    )


def test_fit_order_lowest_priority_then_oldest_and_floors():
    p0 = _entry("P0", 0, content="word " * 100, description="d " * 20, summary="s " * 5, name="n")
    p2_old = _entry("P2", 1, summary="s " * 30, name="old")
    p2_new = _entry("P2", 2, summary="s " * 30, name="new")
    p3 = _entry("P3", 3, name="name " * 5)
    entries = [p0, p2_old, p2_new, p3]
    dropped: list[Dropped] = []
    _fit(entries, allowance=150, model="gpt-4o", dropped=dropped)
    assert p3.level is None  # P3 first
    assert (p2_old.level, p2_new.level) == ("name", "summary")  # then the older P2, one level at a time
    assert p0.level == "content" and not p0.cut
    assert [(d.data()["name"], d.data()["to"]) for d in dropped] == [("P2-1", "name"), ("P3-3", "dropped")]
    # P0's content is cut to what is left (with a marker), not replaced by its description.
    p0 = _entry("P0", 0, content="word " * 400, description="d " * 20, name="n")
    dropped = []
    _fit([p0], allowance=200, model="gpt-4o", dropped=dropped)
    assert p0.level == "content" and p0.cut
    assert p0.texts["content"].endswith("[… shortened here to fit the token budget]")
    assert dropped[0].data()["shortened"] and 190 < dropped[0].tokens < 220
    # With no room at all, P0 keeps its name and the rest goes.
    entries = [_entry("P0", 0, content="c " * 50, description="d", name="n"), _entry("P2", 1, summary="s")]
    _fit(entries, allowance=0, model="gpt-4o", dropped=[])
    assert [e.level for e in entries] == ["name", None]


# --- images -----------------------------------------------------------------------------------------------


def post_message(actor, conversation, body):
    response = actor.client.post(f"/api/v1/conversations/{conversation.id}/messages", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_images_the_user_sent_are_described_offline_and_the_response_says_so(owner, conversation):
    first = post_message(
        owner, conversation, {"role": "user", "content": "see", "parts": [image_part(frame(1))]}
    )
    image_id = first["parts"][0]["image_id"]
    append(conversation, {"role": "assistant", "content": "I see a window."})
    # In the history its pixels are shown: not listed again.
    body = context(owner, conversation, user_message="And now?")
    assert image_id not in by_name(body)
    # A question stored with an image: the image is this turn's (P0), described by what is known offline.
    question = post_message(
        owner, conversation, {"role": "user", "content": "what is this?", "parts": [image_part(frame(2))]}
    )
    current = question["parts"][0]["image_id"]
    body = context(owner, conversation, user_message_id=question["id"], token_budget=2000)
    item = by_name(body)[current]
    assert (item["priority"], item["attachment"], item["described"]) == ("P0", "image", "offline")
    assert f"- image {current} (PNG, 320×200 px, " in section(body)
    [degradation] = [d for d in body["degradations"] if d["stage"] == "decay"]
    assert degradation["code"] == "image_description_offline"
    assert "no LLM endpoint is configured" in degradation["message"]


def test_a_client_description_is_used_and_an_image_is_found_by_its_id(owner, outsider, conversation):
    part = image_part(frame(3), description="Invoice #4411 from ACME, total 312.50 EUR")
    sent = post_message(owner, conversation, {"role": "user", "content": "invoice", "parts": [part]})
    image_id = sent["parts"][0]["image_id"]
    append(conversation, {"role": "assistant", "content": "Got it."})
    exchange(conversation, "more")
    other = post_message(
        owner, conversation, {"role": "user", "content": "x", "parts": [image_part(frame(4))]}
    )
    del other
    append(conversation, {"role": "assistant", "content": "ok"})
    theirs = conversation_create(tenant=outsider.tenant, end_user_external_id="alice")
    foreign = post_message(
        outsider, theirs, {"role": "user", "content": "x", "parts": [image_part(frame(5))]}
    )
    foreign_id = foreign["parts"][0]["image_id"]
    body = context(owner, conversation, user_message=f"What was the total on {image_id}? And {foreign_id}?")
    item = by_name(body)[image_id]
    assert (item["priority"], item["reason"], item["described"]) == ("P1", "referenced", "client")
    assert "Invoice #4411 from ACME, total 312.50 EUR" in section(body)
    assert foreign_id not in by_name(body) and foreign_id not in section(body)


def _queries_of_a_context_call(owner, conversation) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    # Retrieval off: its hits (and their reads) vary with the documents; the decay stage's may not.
    question = {"user_message": "Anything new?", "retrieval": {"enabled": False}}
    context(owner, conversation, **question)  # a first call of a conversation sets things up
    with CaptureQueriesContext(connection) as queries:
        body = context(owner, conversation, **question)
    assert attachments(body)
    return len(queries.captured_queries)


def test_the_queries_do_not_grow_with_the_attachments(owner, conversation):
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Earlier")
    upload(owner, ("a.md", NOTES), conversation=str(conversation.pk))
    upload(owner, ("b.md", PLAN), conversation=str(earlier.pk))
    exchange(conversation)
    few = _queries_of_a_context_call(owner, conversation)
    for n in range(8):
        upload(owner, (f"more-{n}.md", PLAN + f"\n{n}".encode()), conversation=str(conversation.pk))
        upload(owner, (f"old-{n}.md", NOTES + f"\n{n}".encode()), conversation=str(earlier.pk))
    exchange(conversation, "and now")
    assert _queries_of_a_context_call(owner, conversation) == few


def test_an_image_the_window_cut_leaves_out_in_this_very_call_is_an_attachment(owner, conversation):
    from tests.context.helpers import exchanges

    sent = post_message(
        owner, conversation, {"role": "user", "content": "see", "parts": [image_part(frame(9))]}
    )
    append(conversation, {"role": "assistant", "content": "Seen."})
    exchanges(conversation, 40, tokens=60)
    body = context(owner, conversation, user_message="Where were we?", token_budget=1500)
    assert any(d["block"] == "B6" for d in body["dropped"])  # this call moved the window past the image
    item = by_name(body)[sent["parts"][0]["image_id"]]
    assert (item["priority"], item["level"]) == ("P2", "summary")


def test_screenshots_in_tool_output_are_visual_memory_not_attachments_unless_named(owner, conversation):
    from tests.context.helpers import exchanges

    tool = post_message(owner, conversation, {"role": "tool", "parts": [image_part(frame(10))]})
    user = post_message(
        owner, conversation, {"role": "user", "content": "mine", "parts": [image_part(frame(11))]}
    )
    append(conversation, {"role": "assistant", "content": "Seen."})
    exchanges(conversation, 40, tokens=60)
    screenshot, upload_id = tool["parts"][0]["image_id"], user["parts"][0]["image_id"]
    body = context(owner, conversation, user_message="Where were we?", token_budget=1500)
    assert set(by_name(body)) == {upload_id}
    body = context(owner, conversation, user_message=f"What did {screenshot} show?", token_budget=1500)
    assert by_name(body)[screenshot]["priority"] == "P1" and upload_id in by_name(body)


def test_this_turns_upload_stays_p0_when_named_or_reattached_and_short_names_need_a_whole_word(
    owner, conversation
):
    exchange(conversation)
    upload(owner, ("a.md", PLAN), conversation=str(conversation.pk))
    body = context(owner, conversation, user_message="Read a.md please.", attachments=[{"name": "a.md"}])
    [item] = attachments(body)
    assert (item["priority"], item["level"], item["reason"]) == ("P0", "content", "this_turn")
    exchange(conversation)
    body = context(owner, conversation, user_message="Compare data.md with the plan.")
    assert by_name(body)["a.md"]["priority"] == "P2"  # "a.md" inside "data.md" does not name it


@pytest.mark.parametrize("budget", [300, 450, 700, 1000, 1500, 2500, 4000, 8000])
def test_every_budget_holds_with_attachments_of_every_priority(owner, conversation, budget):
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Earlier")
    upload(owner, ("plan.md", PLAN), conversation=str(earlier.pk))
    upload(owner, ("old.md", NOTES * 3), conversation=str(conversation.pk))
    post_message(owner, conversation, {"role": "user", "content": "see", "parts": [image_part(frame(13))]})
    exchange(conversation)
    upload(owner, ("notes.md", NOTES * 40), conversation=str(conversation.pk))
    body = context(owner, conversation, user_message="Compare notes.md with old.md", token_budget=budget)
    assert body["tokens"]["total"] <= budget
    assert not [d for d in body["degradations"] if d["code"] == "over_budget"]
    assert "notes.md" in by_name(body)  # P0 keeps at least its name
