"""Summaries through an LLM (the OpenAI-compatible test server on 127.0.0.1, via the real openai package):
the good path with the fact check on top, each failure falling back to the extractive summariser with a
recorded degradation, and the tenant's monthly token budget counted from the responses."""

import pytest

from summaries.selectors import segments_live
from summaries.services import compaction_run
from tenants.llm_budget import current_month, llm_tokens_used
from tenants.models import LlmUsage
from tests.summaries.helpers import budgets, history

pytestmark = pytest.mark.django_db


def codes(outcome) -> list[str]:
    return [d["code"] for d in outcome.degradations]


def test_a_good_reply_makes_an_llm_segment_and_the_fact_check_completes_it(
    conversation, llm_settings, llm_server
):
    llm_server.reply = (
        "Requests and intent: the user reconfigures services.\nDecisions: Dana Whitfield reviews."
    )
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)
    (segment,) = outcome.segments
    assert (segment.source, segment.model) == ("llm", "test-model")
    assert segment.text.startswith(llm_server.reply)
    # The reply named no path or port: the fact check put them back.
    assert "Key facts (verbatim): services/module_0/handler.py" in segment.text
    assert "port 8000" in segment.text
    assert segment.facts_missing < segment.facts_checked  # "Dana Whitfield" survived the LLM
    assert codes(outcome) == []

    (request,) = llm_server.requests
    system, user = request["body"]["messages"]
    assert "Decisions" in system["content"] and "Key facts" in system["content"]
    assert "[#1 user] Please update services/module_0/handler.py" in user["content"]
    usage = LlmUsage.objects.get(tenant=conversation.tenant, month=current_month())
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 120, 30)
    assert llm_tokens_used(tenant=conversation.tenant) == 150


def test_manual_instructions_reach_the_llm_prompt(owner, conversation, llm_settings, llm_server):
    history(conversation, 20)
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/compact",
        {"instructions": "Focus on the printer jam."},
        format="json",
    )
    assert response.json()["source"] == "llm"
    system = llm_server.requests[0]["body"]["messages"][0]["content"]
    assert system.endswith("The operator adds: Focus on the printer jam.")


def test_500s_are_retried_in_the_background_then_the_extractive_summariser_serves(
    conversation, llm_settings, llm_server
):
    llm_server.default = "500"
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert len(llm_server.requests) == 3  # one call and LLM_MAX_RETRIES=2 retries
    assert outcome.source == outcome.segments[0].source == "extractive"
    assert codes(outcome) == ["llm_failed"]
    assert "llm_unavailable" in outcome.degradations[0]["message"]
    assert LlmUsage.objects.filter(tenant=conversation.tenant).count() == 0  # nothing was used


def test_the_request_path_does_not_retry(conversation, llm_settings, llm_server):
    llm_server.default = "500"
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=True)
    assert len(llm_server.requests) == 1
    assert outcome.source == "extractive"


def test_a_slow_llm_times_out_and_the_extractive_summariser_serves(conversation, llm_settings, llm_server):
    llm_settings.LLM_MAX_RETRIES = 0
    llm_server.slow_seconds = 3
    llm_server.default = "slow"
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="manual", sync=True)
    assert outcome.source == "extractive"
    assert "llm_timeout" in outcome.degradations[0]["message"]
    assert outcome.elapsed_ms < 2500


def test_a_malformed_reply_falls_back_without_retry(conversation, llm_settings, llm_server):
    llm_server.default = "malformed"
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert len(llm_server.requests) == 1
    assert outcome.source == "extractive"
    assert "llm_bad_response" in outcome.degradations[0]["message"]


def test_a_spent_monthly_budget_sends_background_work_offline_and_says_so(
    owner, conversation, llm_settings, llm_server
):
    budgets(owner.tenant, llm_monthly_token_budget=200)
    conversation.refresh_from_db()
    history(conversation, 20)
    first = compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert first.source == "llm"  # 150 of 200 tokens used
    history(conversation, 20, start=20)
    second = compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert second.source == "llm"  # 50 left: allowed, and now over
    history(conversation, 20, start=40)
    third = compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert third.source == "extractive"
    assert codes(third) == ["llm_budget_spent"]
    assert len(llm_server.requests) == 2
    usage = LlmUsage.objects.get(tenant=owner.tenant, month=current_month())
    assert (usage.calls, usage.budget_fallbacks) == (2, 1)


def test_a_tenant_can_turn_its_llm_off(owner, conversation, llm_settings, llm_server):
    budgets(owner.tenant, llm_enabled=False)
    conversation.refresh_from_db()
    history(conversation, 20)
    outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)
    assert outcome.source == "extractive" and codes(outcome) == ["offline_summariser"]
    assert llm_server.requests == []
    assert segments_live(conversation=conversation)[0].model.startswith("extractive")
