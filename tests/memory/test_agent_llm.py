"""The memory agent's LLM path, against the OpenAI-compatible test server through the real openai package:
each tool executes through the memory services and is logged with the model as the actor; search results go
back to the model; invalid calls are reported back and never half-written; a block changed during the call
is refused as stale; a concurrent run's cursor move discards the plan; a failing LLM leaves the rules to
serve with the degradation recorded."""

import json

import pytest

import memory.agent.llm as agent_llm
import memory.agent.run as agent_run
from conversations.models import Message
from memory.agent import memory_agent_run
from memory.archival import archival_insert
from memory.models import Actor, ArchivalMemory, CoreMemoryBlock, MemoryAgentCursor, MemoryOperation
from memory.services import core_memory_write
from tenants.models import LlmUsage
from tests import llm_server as server
from tests.llm_server import tool_call, tool_reply
from tests.summaries.helpers import append, budgets

pytestmark = pytest.mark.django_db
# The OpenAI-compatible test server's fixtures (this folder's conftest does not load them).
llm_server = server.llm_server
llm_settings = server.llm_settings


@pytest.fixture(autouse=True)
def lexical_only(settings):
    settings.MNEMO_EMBEDDINGS = "none"


def agent_ops(**filters):
    return MemoryOperation.objects.filter(actor=Actor.AGENT, **filters).order_by("id")


def codes(run) -> list[str]:
    return [e["code"] for e in run.errors]


def block(label: str) -> CoreMemoryBlock:
    return CoreMemoryBlock.objects.get(label=label)


def assert_given_blocks_messages_and_tools(body) -> None:
    """What the model was given: the blocks with their limits, the new messages by seq, the four tools."""
    assert sorted(t["function"]["name"] for t in body["tools"]) == [
        "archival_memory_insert",
        "archival_memory_search",
        "core_memory_append",
        "core_memory_update",
    ]
    prompt = body["messages"][1]["content"]
    assert '<block label="profile" chars="19" limit="2000">\nName: Ali\nRole: SRE\n</block>' in prompt
    assert '<block label="preferences" chars="0" limit="2000">' in prompt
    assert "#1 user: Actually it's Alice." in prompt and "#2 assistant: Noted, Alice." in prompt
    labels = body["tools"][0]["function"]["parameters"]["properties"]["label"]["enum"]
    assert labels == ["preferences", "instructions", "profile"]


def test_each_tool_executes_through_the_services_and_is_logged_with_the_model(
    conversation, llm_settings, llm_server
):
    end_user = conversation.end_user
    core_memory_write(end_user=end_user, label="profile", value="Name: Ali\nRole: SRE")
    user, _ = append(
        conversation,
        {"role": "user", "content": "Actually it's Alice. I prefer short answers. I moved to Lisbon."},
        {"role": "assistant", "content": "Noted, Alice."},
    )
    llm_server.script(
        tool_reply(
            tool_call("core_memory_update", {"label": "profile", "old_text": "Ali", "new_text": "Alice"}),
            tool_call(
                "core_memory_append",
                {"label": "preferences", "content": "Wants short answers.", "source_seq": 1},
            ),
            tool_call(
                "archival_memory_insert",
                {"content": "The user's city is Lisbon.", "kind": "fact", "source_seq": 1},
            ),
        )
    )
    run = memory_agent_run(conversation=conversation)

    assert (run.mode, run.model, run.rounds, run.errors) == ("llm", "test-model", 1, [])
    assert block("profile").value == "Name: Alice\nRole: SRE"
    # The LLM decided instead of the rules: the preference rule would have stored "I prefer short answers".
    assert block("preferences").value == "Wants short answers."
    (memory,) = ArchivalMemory.objects.all()
    assert (memory.content, memory.kind, memory.subject) == ("The user's city is Lisbon.", "fact", "city")
    assert memory.source_message_ids == [str(user.id)]
    ops = list(agent_ops().values_list("op", "target", "actor_name", "trigger"))
    assert ops == [
        ("core_memory_update", "core:profile", "test-model", "llm:core_memory_update (messages #1-#2)"),
        ("core_memory_create", "core:preferences", "test-model", "llm:core_memory_append (message #1)"),
        (
            "archival_memory_insert",
            f"archival:{memory.id}",
            "test-model",
            "llm:archival_memory_insert (message #1)",
        ),
    ]
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2

    (request,) = llm_server.requests
    assert_given_blocks_messages_and_tools(request["body"])
    # The tokens count against the tenant's monthly budget for background work.
    usage = LlmUsage.objects.get(tenant=conversation.tenant, purpose="memory_agent")
    assert (usage.calls, usage.prompt_tokens + usage.completion_tokens) == (1, 150)

    # Idempotent: nothing new, no model call.
    assert memory_agent_run(conversation=conversation).operations == []
    assert len(llm_server.requests) == 1


def test_archival_search_results_go_back_to_the_model(conversation, llm_settings, llm_server):
    old = archival_insert(end_user=conversation.end_user, content="The user's editor is Helix.").memory
    append(
        conversation,
        {"role": "user", "content": "I switched to Zed last week."},
        {"role": "assistant", "content": "Zed it is."},
    )
    llm_server.script(
        tool_reply(tool_call("archival_memory_search", {"query": "editor"}, call_id="call_search")),
        tool_reply(
            tool_call(
                "archival_memory_insert", {"content": "The user's editor is Zed.", "kind": "preference"}
            )
        ),
    )
    run = memory_agent_run(conversation=conversation)

    assert (run.mode, run.rounds, run.errors) == ("llm", 2, [])
    second = llm_server.requests[1]
    assistant, tool = second["body"]["messages"][2:]
    assert assistant["tool_calls"][0]["id"] == "call_search"
    assert assistant["tool_calls"][0]["function"]["name"] == "archival_memory_search"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_search"
    results = json.loads(tool["content"])["results"]
    assert [(r["content"], r["kind"]) for r in results] == [("The user's editor is Helix.", "fact")]
    # The newer fact about the same subject invalidated the old one, logged as the agent's.
    old.refresh_from_db()
    assert old.invalidated_at is not None
    assert list(agent_ops().values_list("op", flat=True)) == [
        "archival_memory_insert",
        "archival_memory_invalidate",
    ]
    # Lexical-only search is a degradation, and it is reported, not hidden.
    assert [d["code"] for d in run.degradations] == ["embeddings_unavailable"]


def test_bad_tool_calls_are_reported_back_and_nothing_is_half_written(conversation, llm_settings, llm_server):
    end_user = conversation.end_user
    core_memory_write(end_user=end_user, label="profile", value="Name: Ali", char_limit=40)
    append(
        conversation,
        {"role": "user", "content": "I live in Lisbon and work on the payments team."},
        {"role": "assistant", "content": "Good to know."},
    )
    llm_server.script(
        tool_reply(
            tool_call("forget_everything", {}),
            tool_call("core_memory_append", "{not json"),
            tool_call("core_memory_append", {"label": "secrets", "content": "x"}),
            tool_call("core_memory_append", {"label": "profile", "content": "Lives in Lisbon; " * 3}),
            tool_call("core_memory_update", {"label": "profile", "old_text": "Name: Bob", "new_text": "x"}),
            tool_call("archival_memory_insert", {"content": "Works on payments.", "kind": "gossip"}),
        ),
        # The model reads the errors and corrects itself.
        tool_reply(tool_call("core_memory_append", {"label": "profile", "content": "Lives in Lisbon"})),
    )
    run = memory_agent_run(conversation=conversation)

    assert codes(run) == [
        "unknown_tool",
        "bad_arguments",
        "unknown_label",
        "over_char_limit",
        "old_text_not_found",
        "bad_arguments",
    ]
    assert "would have 60 characters; its limit is 40" in run.errors[3]["message"]
    tool_messages = [m for m in llm_server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert [json.loads(m["content"])["error"]["code"] for m in tool_messages] == codes(run)
    # Only the corrected call was written; the refused ones left no trace.
    assert block("profile").value == "Name: Ali\nLives in Lisbon"
    assert list(agent_ops().values_list("op", flat=True)) == ["core_memory_append"]
    assert not CoreMemoryBlock.objects.filter(label="secrets").exists()
    assert not ArchivalMemory.objects.exists()
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2


def test_a_block_changed_during_the_llm_call_is_refused_as_stale(
    conversation, llm_settings, llm_server, monkeypatch
):
    end_user = conversation.end_user
    core_memory_write(end_user=end_user, label="profile", value="Name: Ali")
    append(
        conversation,
        {"role": "user", "content": "Call me Alice. My team is payments."},
        {"role": "assistant", "content": "Sure."},
    )
    real = agent_llm.chat_tools

    def support_edits_meanwhile(*args, **kwargs):
        reply = real(*args, **kwargs)
        # Support staff change the block while the model is thinking (no transaction is held meanwhile).
        core_memory_write(
            end_user=end_user, label="profile", value="Name: Ali (VIP)", expected_version=1, actor=Actor.ADMIN
        )
        return reply

    monkeypatch.setattr(agent_llm, "chat_tools", support_edits_meanwhile)
    llm_server.script(
        tool_reply(
            tool_call("core_memory_update", {"label": "profile", "old_text": "Ali", "new_text": "Alice"}),
            tool_call("core_memory_append", {"label": "profile", "content": "Team: payments"}),
            tool_call("archival_memory_insert", {"content": "The user's team is payments.", "kind": "fact"}),
        )
    )
    run = memory_agent_run(conversation=conversation)

    assert codes(run) == ["stale_version", "stale_version"]
    assert block("profile").value == "Name: Ali (VIP)"  # the support edit stands
    assert list(agent_ops().values_list("op", flat=True)) == ["archival_memory_insert"]
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2


def test_a_concurrent_run_moving_the_cursor_discards_the_plan_and_the_batch_is_read_again(
    conversation, llm_settings, llm_server, monkeypatch
):
    append(
        conversation,
        {"role": "user", "content": "My dog is called Rex."},
        {"role": "assistant", "content": "Nice."},
        {"role": "user", "content": "My cat is called Tom."},
        {"role": "assistant", "content": "Also nice."},
    )
    real = agent_llm.chat_tools
    calls = []

    def another_run_meanwhile(*args, **kwargs):
        reply = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:  # another worker processed the first exchange while we waited for the model
            MemoryAgentCursor.objects.filter(conversation=conversation).update(last_seq=2)
        return reply

    monkeypatch.setattr(agent_llm, "chat_tools", another_run_meanwhile)
    llm_server.script(
        tool_reply(
            tool_call("archival_memory_insert", {"content": "The user's dog is Rex.", "kind": "fact"})
        ),
        tool_reply(
            tool_call("archival_memory_insert", {"content": "The user's cat is Tom.", "kind": "fact"})
        ),
    )
    run = memory_agent_run(conversation=conversation)

    assert "Another run moved the cursor meanwhile: this batch was read again." in run.notes
    first, second = (r["body"]["messages"][1]["content"] for r in llm_server.requests)
    assert "#1 user: My dog is called Rex." in first
    assert "#1 user" not in second and "#3 user: My cat is called Tom." in second
    # The first plan was dropped whole: the other run owns messages 1-2.
    assert list(ArchivalMemory.objects.values_list("content", flat=True)) == ["The user's cat is Tom."]
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 4


@pytest.mark.parametrize(
    ("behaviour", "code", "requests"),
    [("500", "llm_unavailable", 3), ("close", "llm_unavailable", 3), ("malformed", "llm_bad_response", 1)],
)
def test_a_failing_llm_leaves_the_rules_to_serve_and_says_so(
    conversation, llm_settings, llm_server, behaviour, code, requests
):
    llm_server.default = behaviour
    append(
        conversation,
        {"role": "user", "content": "Call me Ali. Remember that the VPN key rotates on Mondays."},
        {"role": "assistant", "content": "Noted."},
    )
    run = memory_agent_run(conversation=conversation)

    assert run.mode == "rules_fallback"
    (degradation,) = run.degradations
    assert degradation["code"] == "memory_agent_llm_failed"
    assert f"[{code}]" in degradation["message"] and "The rules decided" in degradation["message"]
    assert len(llm_server.requests) == requests  # 5xx and dropped connections retried, a bad reply not
    assert set(agent_ops().values_list("actor_name", flat=True)) == {"rules"}
    assert block("profile").value == "Name: Ali"
    assert ArchivalMemory.objects.get().content == "the VPN key rotates on Mondays"
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2


def test_a_timeout_in_a_later_round_discards_the_whole_llm_plan(conversation, llm_settings, llm_server):
    llm_settings.LLM_MAX_RETRIES = 0
    llm_server.slow_seconds = 1.5  # past LLM_TIMEOUT_SECONDS = 1
    append(
        conversation,
        {"role": "user", "content": "I prefer tea."},
        {"role": "assistant", "content": "Tea it is."},
    )
    llm_server.script(
        tool_reply(
            tool_call("core_memory_append", {"label": "preferences", "content": "Drinks tea"}),
            tool_call("archival_memory_search", {"query": "tea"}),
        ),
        "slow",
    )
    run = memory_agent_run(conversation=conversation)

    assert run.mode == "rules_fallback"
    assert "[llm_timeout]" in run.degradations[-1]["message"]
    # Round one's append was planned, never applied: the rules wrote their own line instead.
    assert block("preferences").value == "#1 I prefer tea."
    assert set(agent_ops().values_list("actor_name", flat=True)) == {"rules"}


def test_a_spent_budget_means_rules_without_a_model_call(owner, conversation, llm_settings, llm_server):
    budgets(owner.tenant, llm_monthly_token_budget=0)
    conversation.tenant.refresh_from_db()
    append(
        conversation,
        {"role": "user", "content": "My name is Ali"},
        {"role": "assistant", "content": "Hi Ali."},
    )
    run = memory_agent_run(conversation=conversation)

    assert llm_server.requests == []
    assert (run.mode, [d["code"] for d in run.degradations]) == ("rules_fallback", ["llm_budget_spent"])
    assert block("profile").value == "Name: Ali"
    assert LlmUsage.objects.get(tenant=owner.tenant, purpose="memory_agent").budget_fallbacks == 1


def test_a_backlog_is_read_in_batches_of_whole_exchanges(conversation, llm_settings, llm_server, monkeypatch):
    monkeypatch.setattr(agent_run, "BATCH_CHARS", 60)
    append(
        conversation,
        {"role": "user", "content": "First question about the billing service."},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "Second question about the search cluster."},
        {"role": "assistant", "content": "Second answer."},
    )
    llm_server.reply = "Nothing to remember."  # a reply without tool calls
    run = memory_agent_run(conversation=conversation)

    first, second = (r["body"]["messages"][1]["content"] for r in llm_server.requests)
    assert "#2 assistant: First answer." in first and "#3" not in first
    assert "#3 user: Second question" in second and "#2" not in second
    assert (run.mode, run.processed_to, run.operations) == ("llm", 4, [])
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 4


def test_a_conversation_without_a_completed_exchange_calls_no_model(conversation, llm_settings, llm_server):
    append(conversation, {"role": "user", "content": "My name is Ali"})
    append(conversation, {"role": "assistant", "content": "Hi", "completed": False})
    run = memory_agent_run(conversation=conversation)
    assert (run.operations, llm_server.requests) == ([], [])
    assert Message.objects.filter(conversation=conversation).count() == 2


def test_an_update_with_empty_new_text_deletes_the_line(conversation, llm_settings, llm_server):
    core_memory_write(
        end_user=conversation.end_user, label="profile", value="Name: Ali\nRole: SRE\nTeam: payments"
    )
    append(
        conversation,
        {"role": "user", "content": "I left the SRE role."},
        {"role": "assistant", "content": "Understood."},
    )
    llm_server.script(
        tool_reply(
            tool_call("core_memory_update", {"label": "profile", "old_text": "Role: SRE", "new_text": ""})
        )
    )
    run = memory_agent_run(conversation=conversation)
    assert run.errors == []
    assert block("profile").value == "Name: Ali\nTeam: payments"
    op = agent_ops().get()
    assert (op.op, op.old_value, op.new_value) == (
        "core_memory_update",
        "Name: Ali\nRole: SRE\nTeam: payments",
        "Name: Ali\nTeam: payments",
    )


def test_the_tool_loop_is_bounded(conversation, llm_settings, llm_server):
    append(
        conversation,
        {"role": "user", "content": "What did I say about my editor?"},
        {"role": "assistant", "content": "Let me check."},
    )
    search = tool_reply(tool_call("archival_memory_search", {"query": "editor"}))
    llm_server.script(*[search] * 6)  # a model that never stops searching
    run = memory_agent_run(conversation=conversation)
    assert len(llm_server.requests) == agent_llm.MAX_ROUNDS == run.rounds
    assert any("still calling tools after 4 rounds" in note for note in run.notes)
    assert MemoryAgentCursor.objects.get(conversation=conversation).last_seq == 2


def test_the_plans_vectors_are_computed_before_the_cursor_is_locked(
    conversation, llm_settings, llm_server, monkeypatch
):
    """An archival insert the model planned is embedded before _batch_apply takes the cursor's row lock (a
    slow embedder must not hold it); the write under the lock only stores the vector."""
    from django.db import connection

    import memory.archival

    append(
        conversation,
        {"role": "user", "content": "I switched to Zed last week."},
        {"role": "assistant", "content": "Zed it is."},
    )
    llm_server.script(
        tool_reply(
            tool_call("archival_memory_insert", {"content": "The user's editor is Zed.", "kind": "fact"})
        )
    )
    depth_outside = len(connection.atomic_blocks)
    depths = []

    def embed(texts):
        depths.append(len(connection.atomic_blocks))
        return None, "no embedder in this test"

    monkeypatch.setattr(memory.archival, "embed", embed)
    run = memory_agent_run(conversation=conversation)
    assert (run.mode, run.errors) == ("llm", [])
    assert ArchivalMemory.objects.get().content == "The user's editor is Zed."
    assert depths == [depth_outside]
