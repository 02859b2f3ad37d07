"""Knowledge in the context: chunks in the conversation's scope become cited B5 candidates beside the
history, and nothing of another scope or tenant does."""

import pytest

from conversations.services import conversation_create
from tests.context.helpers import context
from tests.knowledge.conftest import upload
from tests.knowledge.files import PYTHON_SOURCE, pdf_bytes

pytestmark = pytest.mark.django_db

SPEC = [["Overview of the product."], ["Refunds are paid within 14 days of the request."]]


def b5(body) -> list[dict]:
    return [i for i in body["blocks"].get("B5", {}).get("items", []) if i.get("kind") == "knowledge"]


def test_a_document_of_the_conversation_is_cited_in_b5(owner, conversation):
    upload(owner, ("requirements.pdf", pdf_bytes(SPEC)), conversation=str(conversation.pk))
    body = context(owner, conversation, user_message="Within how many days are refunds paid?")
    [item, *_] = b5(body)
    assert item["citation"] == 'file "requirements.pdf", page 2'
    prompt = body["messages"][-1]["content"]
    assert '[file "requirements.pdf", page 2] Refunds are paid within 14 days' in prompt


def test_code_is_cited_with_path_lines_and_symbol(owner, conversation):
    upload(owner, ("billing.py", PYTHON_SOURCE))  # tenant-wide: in every conversation's scope
    body = context(owner, conversation, user_message="How does render_invoice render the invoice?")
    citations = [i["citation"] for i in b5(body)]
    assert "billing.py:14-16 (Invoice.render_invoice)" in citations


def test_other_scopes_stay_out(owner, outsider, conversation):
    other = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Bob's")
    upload(owner, ("bob.pdf", pdf_bytes(SPEC)), end_user="bob")
    upload(owner, ("elsewhere.pdf", pdf_bytes([*SPEC, ["x"]])), conversation=str(other.pk))
    outsider_conv = conversation_create(tenant=outsider.tenant, end_user_external_id="alice")
    upload(outsider, ("theirs.pdf", pdf_bytes(SPEC)), conversation=str(outsider_conv.pk))
    body = context(owner, conversation, user_message="Within how many days are refunds paid?")
    assert b5(body) == []
    assert "Refunds are paid" not in body["messages"][-1]["content"]
    assert b5(context(owner, other, user_message="Within how many days are refunds paid?"))
