"""prefix_cache.rendering on its own: a Layout renders to the same bytes every time, without being changed,
in each provider's shape."""

import copy
import json

import pytest

from prefix_cache.provenance import AgentProfileSource, SummarySegmentSource, TaskStateSource
from prefix_cache.rendering import FORMATS, HistoryMessage, Item, Layout, canonical_json, render


def history_message(seq, role, content="", parts=None, **flags):
    return HistoryMessage(
        id=f"m{seq}", seq=seq, role=role, content=content, parts=parts or [], token_count=10, **flags
    )


def layout():
    return Layout(
        agent=Item("You are Tester.", 4, AgentProfileSource(id="p1", version=1)),
        summaries=[Item("Earlier: set up CI.", 6, SummarySegmentSource("s1", 1, 4, 0, "llm"))],
        history=[
            history_message(1, "user", "Look", [{"type": "text", "text": "Look"}]),
            history_message(2, "system", "Operator note: be terse."),
            history_message(
                3,
                "assistant",
                "",
                [{"type": "tool_call", "id": "t1", "name": "grep", "arguments": "not json"}],
            ),
            history_message(
                4,
                "tool",
                "",
                [
                    {
                        "type": "tool_result",
                        "tool_call_id": "t1",
                        "content": [{"type": "text", "text": "3 hits"}],
                    }
                ],
                is_error=True,
            ),
            history_message(
                5,
                "tool",
                "",
                [{"type": "tool_result", "tool_call_id": "zz", "name": "lookup", "content": "x"}],
            ),
        ],
        task_state=Item('{"step": 1}', 5, TaskStateSource(epoch=1, events=0)),
        user_message="next?",
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendering_is_pure_and_repeatable(fmt):
    source = layout()
    before = copy.deepcopy(source)
    first, second = render(source, fmt), render(source, fmt)
    assert json.dumps(first.messages) == json.dumps(second.messages)
    assert json.dumps(first.system) == json.dumps(second.system)
    assert source == before
    assert first.system_text == "You are Tester.\n\n## Conversation summary\nEarlier: set up CI."
    assert first.user_text == '## Task state\n{"step": 1}\n\n## User question\nnext?'


def test_unknown_format_is_refused():
    with pytest.raises(ValueError):
        render(layout(), "cohere")


def test_openai_history_shapes():
    messages = render(layout(), "openai").messages
    assert messages[1] == {"role": "user", "content": "Look"}
    assert messages[2] == {"role": "system", "content": "Operator note: be terse."}
    assert messages[3]["tool_calls"][0]["function"] == {"name": "grep", "arguments": "not json"}
    assert messages[4] == {"role": "tool", "tool_call_id": "t1", "content": "3 hits"}


def test_anthropic_history_shapes():
    rendered = render(layout(), "anthropic")
    messages = rendered.messages
    assert messages[1] == {
        "role": "user",
        "content": [{"type": "text", "text": "[system] Operator note: be terse."}],
    }
    assert messages[2]["content"] == [
        {"type": "tool_use", "id": "t1", "name": "grep", "input": {"raw": "not json"}}
    ]
    assert messages[3]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "3 hits", "is_error": True}
    ]
    assert messages[4]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    # The history that is hashed for the prefix carries no breakpoint.
    assert "cache_control" not in json.dumps(rendered.history)


def test_gemini_history_shapes():
    rendered = render(layout(), "gemini")
    assert rendered.system == {"parts": [{"text": rendered.system_text}]}
    messages = rendered.messages
    assert messages[2] == {
        "role": "model",
        "parts": [{"functionCall": {"name": "grep", "args": {"raw": "not json"}}}],
    }
    # The result names its tool from the earlier call, or from its own name when the call is not in view.
    assert messages[3]["parts"] == [{"functionResponse": {"name": "grep", "response": {"content": "3 hits"}}}]
    assert messages[4]["parts"] == [{"functionResponse": {"name": "lookup", "response": {"content": "x"}}}]
    assert all(m["role"] in ("user", "model") for m in messages)


def test_openai_messages_without_parts_render_as_text_turns_of_their_role():
    """The short path for a message without parts gives what the general one gave: a tool or unknown role
    as a user turn, an empty message left out."""
    history = [
        history_message(1, "user", "Hi"),
        history_message(2, "assistant", "Hello."),
        history_message(3, "system", "Note."),
        history_message(4, "tool", "raw output"),
        history_message(5, "assistant", ""),
    ]
    assert render(Layout(history=history), "openai").history == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": "Note."},
        {"role": "user", "content": "raw output"},
    ]


def test_canonical_json_is_json_dumps_with_sorted_keys_and_no_spaces():
    values = [
        {"b": [1, 2.5, None, True], "a": {"z": 'é \u2028 "q"', "y": []}, "": float("inf")},
        [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "t", "content": "\n"}],
        "plain text ✓",
        3,
        None,
    ]
    for value in values:
        expected = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        assert canonical_json(value) == expected
    with pytest.raises(TypeError):
        canonical_json({"when": object()})
