"""Query rewriting through an LLM (the OpenAI-compatible test server, through the real openai package): a
reference back is rewritten from the recent history and the task state into a standalone query; a question
without a reference costs no call; a failure, a timeout or an unusable answer falls back to the rules with
the degradation recorded, and a failed endpoint is paused instead of costing every request a timeout."""

import time

import pytest
from django.core.cache import cache

from memory.archival import archival_insert
from retrieval.rewrite import query_rewrite
from tenants.services import end_user_get_or_create
from tests import llm_server as server
from tests.summaries.helpers import append, budgets, context

pytestmark = pytest.mark.django_db
# The OpenAI-compatible test server's fixtures (this folder's conftest does not load them).
llm_server = server.llm_server
llm_settings = server.llm_settings

STANDALONE = "Did the deploy of services/billing/api.py to staging-eu pass?"


@pytest.fixture(autouse=True)
def no_pause_left_behind():
    # A failure pauses the endpoint in the cache; the next test may get the same port.
    yield
    cache.clear()


@pytest.fixture
def deploy_history(conversation):
    append(
        conversation,
        {"role": "user", "content": "Please deploy services/billing/api.py to staging-eu."},
        {"role": "assistant", "content": "Deploying services/billing/api.py now."},
    )
    return conversation


def codes(rewrite) -> list[str]:
    return [d["code"] for d in rewrite.degradations]


def test_a_reference_is_rewritten_by_the_llm_from_history_and_task_state(
    deploy_history, llm_settings, llm_server
):
    llm_server.reply = f'Query: "{STANDALONE}"'
    rewrite = query_rewrite(
        conversation=deploy_history, query="Did it pass?", task_state={"ticket": "OPS-381"}
    )

    assert (rewrite.method, rewrite.query, rewrite.model, rewrite.degradations) == (
        "llm",
        STANDALONE,
        "test-model",
        [],
    )
    assert "services/billing/api.py" in rewrite.terms and "staging-eu" in rewrite.terms
    assert rewrite.record()["method"] == "llm"
    (request,) = llm_server.requests
    body = request["body"]
    assert body["max_tokens"] == 96
    system, user = body["messages"]
    assert "standalone search query" in system["content"]
    prompt = user["content"]
    # Oldest first, the task state, and the question exactly as the user wrote it.
    assert prompt.index("user: Please deploy services/billing/api.py") < prompt.index("assistant: Deploying")
    assert 'Task state: {"ticket": "OPS-381"}' in prompt
    assert prompt.endswith("Question: Did it pass?")


def test_a_question_without_a_reference_costs_no_llm_call(deploy_history, llm_settings, llm_server):
    rewrite = query_rewrite(conversation=deploy_history, query="What is the staging database port?")
    assert (rewrite.method, rewrite.query) == ("passthrough", "What is the staging database port?")
    assert llm_server.requests == []


def test_a_tenant_with_the_llm_turned_off_gets_the_rules(owner, deploy_history, llm_settings, llm_server):
    budgets(owner.tenant, llm_enabled=False)
    deploy_history.tenant.refresh_from_db()
    rewrite = query_rewrite(conversation=deploy_history, query="Did it pass?")
    assert (rewrite.method, rewrite.degradations, llm_server.requests) == ("rules", [], [])


def test_a_failing_llm_falls_back_to_the_rules_once_then_is_paused(deploy_history, llm_settings, llm_server):
    llm_server.default = "500"
    rewrite = query_rewrite(conversation=deploy_history, query="Did it pass?")

    assert rewrite.method == "rules"
    assert "services/billing/api.py" in rewrite.terms
    assert codes(rewrite) == ["query_rewrite_llm_failed"]
    assert "[llm_unavailable]" in rewrite.degradations[0]["message"]
    assert rewrite.record()["degradations"] == rewrite.degradations
    assert len(llm_server.requests) == 1  # the request path does not retry

    again = query_rewrite(conversation=deploy_history, query="And did that one pass?")
    assert (again.method, codes(again)) == ("rules", ["query_rewrite_llm_paused"])
    assert len(llm_server.requests) == 1


def test_a_slow_llm_times_out_fast_and_the_rules_serve(deploy_history, llm_settings, llm_server):
    llm_settings.MNEMO_QUERY_REWRITE_TIMEOUT_MS = 300
    llm_server.slow_seconds = 1.0
    llm_server.script("slow")
    started = time.perf_counter()
    rewrite = query_rewrite(conversation=deploy_history, query="Did it pass?")

    assert time.perf_counter() - started < 0.9
    assert (rewrite.method, codes(rewrite)) == ("rules", ["query_rewrite_llm_failed"])
    assert "[llm_timeout]" in rewrite.degradations[0]["message"]


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        # A rambling answer is not a query; an empty one is a bad response from the endpoint.
        ("Sure! " + "The deployment went through several stages. " * 12, "query_rewrite_llm_unusable"),
        ("  \n ", "query_rewrite_llm_failed"),
    ],
)
def test_an_answer_that_is_not_a_query_falls_back_to_the_rules(
    deploy_history, llm_settings, llm_server, reply, code
):
    llm_server.reply = reply
    rewrite = query_rewrite(conversation=deploy_history, query="Did it pass?")
    assert (rewrite.method, codes(rewrite)) == ("rules", [code])
    assert rewrite.query.startswith("Did it pass? ")


def test_the_llm_query_finds_the_memory_and_the_prompt_keeps_the_users_words(
    owner, conversation, llm_settings, llm_server
):
    llm_settings.MNEMO_EMBEDDINGS = "none"
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    archival_insert(
        end_user=end_user, content="services/billing/api.py needs the BILLING_KEY secret on staging."
    )
    archival_insert(end_user=end_user, content="Alice likes short answers.")
    append(conversation, {"role": "user", "content": "Let's ship services/billing/api.py today."})
    llm_server.reply = "What does services/billing/api.py need?"
    body = context(owner, conversation, user_message="What does it need?")

    items = body["blocks"]["B5"]["items"]
    assert items[0]["query"] == "llm"
    assert "BILLING_KEY" in body["messages"][-1]["content"]
    assert body["messages"][-1]["content"].endswith("## User question\nWhat does it need?")
    (request,) = llm_server.requests
    assert request["body"]["messages"][1]["content"].endswith("Question: What does it need?")
