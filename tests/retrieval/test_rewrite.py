"""Query rewriting for retrieval: references back ('it', 'that one', '那个', '刚才说的') are resolved with
the salient terms of the recent history and the task state; other questions pass through; the prompt keeps
the user's own words."""

import pytest

from memory.archival import archival_insert
from retrieval.rewrite import query_rewrite
from tenants.services import end_user_get_or_create
from tests.summaries.helpers import append, context

pytestmark = pytest.mark.django_db


def test_pronouns_take_the_salient_terms_of_recent_history(conversation):
    append(
        conversation,
        {"role": "user", "content": "Please deploy services/billing/api.py to staging-eu."},
        {"role": "assistant", "content": "Deploying services/billing/api.py now."},
    )
    rewrite = query_rewrite(conversation=conversation, query="Did it pass?")
    assert rewrite.method == "rules"
    assert "services/billing/api.py" in rewrite.terms
    assert rewrite.query.startswith("Did it pass? ")


def test_chinese_references_and_task_state(conversation):
    append(conversation, {"role": "user", "content": "我们讨论了报表服务的迁移"})
    rewrite = query_rewrite(
        conversation=conversation, query="刚才说的那个怎么样了", task_state={"ticket": "OPS-381"}
    )
    assert rewrite.method == "rules"
    assert "OPS-381" in rewrite.terms
    assert any("报表" in t for t in rewrite.terms)


def test_a_self_contained_question_passes_through(conversation):
    append(conversation, {"role": "user", "content": "Deploy services/billing/api.py"})
    rewrite = query_rewrite(conversation=conversation, query="What is the staging database port?")
    assert (rewrite.method, rewrite.query, rewrite.terms) == (
        "passthrough",
        "What is the staging database port?",
        [],
    )


def test_the_rewrite_finds_the_memory_and_the_prompt_keeps_the_users_words(owner, conversation, settings):
    settings.MNEMO_EMBEDDINGS = "none"
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    archival_insert(
        end_user=end_user, content="services/billing/api.py needs the BILLING_KEY secret on staging."
    )
    archival_insert(end_user=end_user, content="Alice likes short answers.")
    append(conversation, {"role": "user", "content": "Let's ship services/billing/api.py today."})
    body = context(owner, conversation, user_message="What does it need?")
    items = body["blocks"]["B5"]["items"]
    assert items[0]["query"] == "rules"
    assert "BILLING_KEY" in body["messages"][-1]["content"]
    assert body["messages"][-1]["content"].endswith("## User question\nWhat does it need?")
