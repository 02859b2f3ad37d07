"""Standing instructions and preferences: the memory agent's rules keep them verbatim in core memory (the
`instructions` and `preferences` blocks, one line "#<seq> <the user's words>" each), once, dropping the oldest
lines when a block is full, every change logged; the prompts of later calls hold them. One-off requests,
questions and code are not instructions."""

import pytest

from conversations.services import conversation_create
from memory.agent import memory_agent_run, standing_statements
from memory.models import ArchivalMemory, CoreMemoryBlock, MemoryOperation
from memory.services import core_memory_write
from tenants.services import end_user_get_or_create
from tests.memory.helpers import put_block
from tests.summaries.helpers import append, context

pytestmark = pytest.mark.django_db

FORMAT_CODE = (
    "Always format all code snippets with syntax highlighting when I ask about implementation details."
)
# A preference said in passing in a long message: the clause that holds it is kept, not the whole message.
LONG_PREFERENCE = (
    "I'm trying to keep my app lightweight and easy to maintain, so I prefer simple, minimal dependencies, "
    "how can I make sure my Flask app stays minimal while still covering income and expense tracking, "
    "budgets per category, CSV export and a small analytics dashboard, given that I'm on Flask 2.3.1 and "
    "Python 3.11 with a deadline of April 15?"
)
LONG_PREFERENCE_KEPT = (
    "I'm trying to keep my app lightweight and easy to maintain, so I prefer simple, minimal dependencies …"
)
HOOKS = "I prefer functional components with hooks, so can you rewrite it without the class?"
FENCED = (
    "Here's my component:\n```jsx\n// always use default exports\n"
    f"export default class Cart extends Component {{}}\n```\n{HOOKS}"
)


@pytest.fixture(autouse=True)
def lexical_only(settings):
    settings.MNEMO_EMBEDDINGS = "none"


@pytest.mark.parametrize(
    "text, label, kept",
    [
        *(
            (text, "instructions", text)
            for text in (
                FORMAT_CODE,
                "Never use semicolons in my JS examples",
                "Do not use var in your JavaScript examples, only const and let.",
                "Quick one: please always include type hints when you write Python for me.",
                "Make sure to always cite the RFC number when you mention a protocol.",
                "Whenever I paste a stack trace, start with the most likely root cause.",
                "When I ask about deployments, always mention the rollback plan.",
                "I want you to always answer with the command first and the explanation after it.",
                "Going forward, please use metric units in every answer.",
                "btw, never use emojis in commit messages you write for me.",
                "Include the time complexity whenever I ask for an algorithm.",
            )
        ),
        ("From now on answer in French. Thanks!", "instructions", "From now on answer in French."),
        (
            "Thanks, that fixed it! Don't ever suggest jQuery again, we ripped it out last year.",
            "instructions",
            "Don't ever suggest jQuery again, we ripped it out last year.",
        ),
        *(
            (text, "preferences", text)
            for text in (
                "I prefer simple, minimal dependencies to keep the app lightweight and easy to maintain.",
                "I prefer e-books for their portability, but I also enjoy print for collectible editions, "
                "can you help me find a balance?",
                "Honestly I'd prefer if you kept answers under 200 words.",
                "I like it when you show the diff instead of the whole file.",
                "My preference is pnpm over npm for anything new.",
                "I'd rather you use British spelling than American.",
                "I'm not a fan of ORMs, plain SQL is fine by me.",
            )
        ),
        (LONG_PREFERENCE, "preferences", LONG_PREFERENCE_KEPT),
        (FENCED, "preferences", HOOKS),
    ],
)
def test_standing_instructions_and_preferences_are_found_verbatim(text, label, kept):
    assert [(item.label, item.text) for item in standing_statements(text)] == [(label, kept)]


@pytest.mark.parametrize(
    "text",
    [
        "Never mind, I figured it out.",
        "Don't worry about the tests for now.",
        "Can you always-on the server?",
        "Can you help me set up a cron job that always runs at midnight?",
        "Why does the build always fail on Mondays?",
        "Did I always have this setting enabled?",
        "I've never used Docker before, can you help me get started?",
        "Never heard of that library, is it maintained?",
        "I always forget the syntax for list comprehensions, can you remind me?",
        "Should I prefer composition over inheritance here?",
        "I'm not sure if I prefer Vue or React, what do you think?",
        "Don't forget to add the migration file.",
        "Do not merge this PR until CI passes.",
        "Please make sure the function never returns None.",
        "Whenever I run the tests, pytest hangs on the database fixture.",
        "From now on I'll handle the deploys myself.",
        "From now on, the staging cluster runs in eu-west-1.",
        "Always the same error, no matter what I change.",
        "I love this, thanks!",
        "I like the idea, let's do it.",
        "What's my preference for date formats again?",
        "Explain what happens when I send a request with an expired token.",
        "My partner, who is always supportive, thinks I should take the job.",
        "Here's the linter config:\n```js\n// always use strict\nconst semi = 'never';\n```\nWhy?",
        "    # never commit this file\n    DEBUG = True\nIt still starts in debug mode, any idea why?",
    ],
)
def test_one_off_requests_questions_and_code_are_not_instructions(text):
    assert standing_statements(text) == []


def test_a_message_with_an_instruction_and_a_preference_keeps_each_sentence():
    found = standing_statements("From now on, reply in Spanish. I prefer short answers, too.")
    assert [(item.label, item.text) for item in found] == [
        ("instructions", "From now on, reply in Spanish."),
        ("preferences", "I prefer short answers, too."),
    ]


def block(label: str) -> CoreMemoryBlock:
    return CoreMemoryBlock.objects.get(label=label)


def test_the_rules_store_each_line_with_its_seq_and_log_it(owner, outsider, conversation):
    instruction = "Always include version numbers when I ask about software dependencies or libraries used."
    append(
        conversation,
        {"role": "user", "content": instruction},
        {"role": "assistant", "content": "Will do."},
        {"role": "user", "content": LONG_PREFERENCE},
        {"role": "assistant", "content": "Here is a plan with Flask only."},
    )
    run = memory_agent_run(conversation=conversation)

    assert block("instructions").value == f"#1 {instruction}"
    assert block("preferences").value == f"#3 {LONG_PREFERENCE_KEPT}"
    assert [(op["op"], op["rule"]) for op in run.operations] == [
        ("core_memory_append", "instruction"),
        ("core_memory_append", "preference"),
        ("archival_memory_inserted", "preference"),
    ]
    # A preference is searchable too; an instruction is in every prompt already, so it is not archived.
    assert list(ArchivalMemory.objects.values_list("kind", flat=True)) == ["preference"]
    ops = owner.client.get("/api/v1/users/alice/memory/operations").json()["operations"]
    logged = {o["target"]: o for o in ops if o["target"].startswith("core:")}
    fields = ("op", "old_value", "new_value", "trigger", "actor", "actor_name")
    assert [logged["core:instructions"][f] for f in fields] == [
        "core_memory_create",
        "",
        f"#1 {instruction}",
        "rule:instruction (message #1)",
        "agent",
        "rules",
    ]
    assert logged["core:preferences"]["trigger"] == "rule:preference (message #3)"
    assert outsider.client.get("/api/v1/users/alice/memory/operations").status_code == 404


def test_an_instruction_said_again_is_not_appended_twice(owner, conversation):
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    # Support staff wrote it by hand once, without a #seq.
    core_memory_write(end_user=end_user, label="instructions", value="Never use semicolons in my JS examples")
    append(
        conversation,
        {"role": "user", "content": "never use semicolons in my JS examples!"},
        {"role": "assistant", "content": "Right, no semicolons."},
        {"role": "user", "content": "From now on answer in French."},
        {"role": "assistant", "content": "D'accord."},
        {"role": "user", "content": "Again: from now on, answer in French"},
        {"role": "assistant", "content": "Oui."},
    )
    memory_agent_run(conversation=conversation)

    assert block("instructions").value == (
        "Never use semicolons in my JS examples\n#3 From now on answer in French."
    )
    assert MemoryOperation.objects.filter(target="core:instructions").count() == 2  # create + one append
    assert memory_agent_run(conversation=conversation).operations == []


def test_a_full_block_drops_its_oldest_lines_never_the_new_one(owner, conversation):
    end_user = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    old = "#7 Always answer in English.\n#9 Never use tables in answers."
    core_memory_write(end_user=end_user, label="instructions", value=old, char_limit=100)
    new = "#1 From now on, include the test command with every code change."
    append(
        conversation,
        {"role": "user", "content": new[3:]},
        {"role": "assistant", "content": "Sure."},
    )
    run = memory_agent_run(conversation=conversation)

    assert block("instructions").value == f"#9 Never use tables in answers.\n{new}"
    assert len(block("instructions").value) <= 100
    assert run.operations == [
        {
            "op": "core_memory_update",
            "label": "instructions",
            "rule": "instruction",
            "dropped": ["#7 Always answer in English."],
        }
    ]
    operation = MemoryOperation.objects.filter(target="core:instructions").first()
    assert (operation.op, operation.actor, operation.old_value) == ("core_memory_update", "agent", old)
    assert operation.trigger == (
        "rule:instruction (message #1); "
        "block over its 100-character limit: the oldest 1 line(s) gave way (#7)"
    )
    assert any("gave way" in note for note in run.notes)


def test_an_instruction_carrying_a_secret_is_not_stored(conversation):
    append(
        conversation,
        {
            "role": "user",
            "content": "Always use the API key sk_live_51HcXyZabcdefghijk for the billing calls.",
        },
        {"role": "assistant", "content": "Please rotate that key."},
    )
    run = memory_agent_run(conversation=conversation)
    assert not CoreMemoryBlock.objects.exists()
    assert any("reads as a secret" in note for note in run.notes)


def test_instructions_render_in_a_fixed_place_in_b2a(owner, conversation):
    for label in ("zeta", "profile", "instructions", "persona", "preferences"):
        put_block(owner, label, f"{label} text")
    items = context(owner, conversation)["blocks"]["B2a"]["items"]
    assert [i["label"] for i in items] == ["persona", "preferences", "instructions", "profile", "zeta"]


def test_every_later_prompt_holds_the_instruction_verbatim(
    owner, outsider, conversation, django_capture_on_commit_callbacks
):
    url = f"/api/v1/conversations/{conversation.id}/messages"
    context(owner, conversation)  # B2a of this conversation is taken before the instruction exists
    with django_capture_on_commit_callbacks(execute=True):
        seq = owner.client.post(url, {"role": "user", "content": FORMAT_CODE}, format="json").json()["seq"]
    with django_capture_on_commit_callbacks(execute=True):
        owner.client.post(url, {"role": "assistant", "content": "Understood."}, format="json")
    line = f"#{seq} {FORMAT_CODE}"

    # In this conversation: a memory update in the current user message (the cached prefix stays).
    body = context(owner, conversation, user_message="How do I add the login route?")
    assert line in body["messages"][-1]["content"]
    # In a later conversation of the same user: in B2a, the system message.
    later = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Next week")
    body = context(owner, later, user_message="How should I structure the models?")
    assert f"<instructions>\n{line}\n</instructions>" in body["system"]
    response = outsider.client.post(f"/api/v1/conversations/{conversation.id}/context", {}, format="json")
    assert response.status_code == 404
