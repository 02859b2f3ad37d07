"""The memory agent's rules without an LLM: sentences are split where sentences end (not inside 7.31.4 or a
host name), lead-ins are dropped, and a durable detail the user states in passing (a statement carrying a
specific value) is kept as an archival memory, while questions, requests, guesses, code, logs and secrets are
not; a newer statement of the same detail invalidates the older memory."""

import pytest

from memory.agent import memory_agent_run
from memory.agent.rules import rule_for
from memory.agent.rules import sentences as split_sentences
from memory.agent.standing import STANDING_CHARS
from memory.facts import strip_lead_in
from memory.models import ArchivalMemory, MemoryOperation
from tests.summaries.helpers import append

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def lexical_only(settings):
    settings.MNEMO_EMBEDDINGS = "none"


def stored(text: str) -> list[str]:
    """What the rules keep of a user message: memory.agent's own rule for each sentence, secrets left out."""
    rules = [rule_for(sentence) for sentence in split_sentences(text)]
    return [rule.content for rule in rules if rule is not None and not rule.secret]


@pytest.mark.parametrize(
    "text, sentences",
    [
        (
            "We pinned the SDK to 7.31.4 today. It works.",
            ["We pinned the SDK to 7.31.4 today", "It works"],
        ),
        (
            "Hop through bastion-12.eu2.acme.internal first. Then run the script!",
            ["Hop through bastion-12.eu2.acme.internal first", "Then run the script"],
        ),
        (
            "Write to a.falcon@northwind-12.example. Thanks",
            ["Write to a.falcon@northwind-12.example", "Thanks"],
        ),
        (
            "Use a managed queue, e.g. SQS, for this. Done?",
            ["Use a managed queue, e.g. SQS, for this", "Done?"],
        ),
        ("Ask J. Smith about it. OK", ["Ask J. Smith about it", "OK"]),
        ("端口是23456。明白了吗？好的", ["端口是23456", "明白了吗？", "好的"]),
        ("first line\nsecond line", ["first line", "second line"]),
        ("- a list item\n2. another one", ["a list item", "another one"]),
        (
            "Look:\n```python\nport = 5432. # not a sentence\n```\nThe port is 23456.",
            ["Look:", "The port is 23456"],
        ),
        (
            "Logs:\n2025-03-14T10:22:31Z ERROR api pid=4411 timeout\n"
            "$ psql -h db-01.internal -p 5433\n    SELECT 1;\n> quoted text.\nEnd.",
            ["Logs:", "End"],
        ),
    ],
)
def test_sentences_end_at_sentence_punctuation_not_inside_values(text, sentences):
    assert split_sentences(text) == sentences


@pytest.mark.parametrize(
    "sentence, rest, memo",
    [
        ("btw Priya rotated the key", "Priya rotated the key", False),
        ("By the way, the key changed", "the key changed", False),
        ("Heads-up, the key changed", "the key changed", True),
        ("Note for later: the key is QW-1", "the key is QW-1", True),
        ("oh btw, fyi: the key is QW-1", "the key is QW-1", True),
        ("PSA: deploys are frozen", "deploys are frozen", True),
        ("Note that the port is 23456", "the port is 23456", True),
        ("Important: the port is 23456", "the port is 23456", True),
        # Words, not lead-ins.
        ("Notes are in the wiki", "Notes are in the wiki", False),
        ("Important changes are coming", "Important changes are coming", False),
        ("Updates are slow", "Updates are slow", False),
    ],
)
def test_lead_ins_are_stripped(sentence, rest, memo):
    assert strip_lead_in(sentence) == (rest, memo)


@pytest.mark.parametrize(
    "text",
    [
        "btw Priya rotated the staging deploy key for ledger this morning, it's QW-4821 now.",
        "The ledger staging Postgres does not listen on 5432, it's on port 23456.",
        "Alerts for ledger go to the Slack channel #ops-falcon-quartz.",
        "Heads-up, the ledger staging deploy key changed again: use KX-1234 from now on.",
        "The DNS for the marketing site is managed by Hana Kowalski.",
        "Our SLA with Contoso caps API usage at 1200 requests per second.",
        "Staging Redis moved to redis-staging-2.internal.acme.com:6380 last night.",
        "The shared mailbox for vendor invoices is ap-invoices@acme-corp.example.",
        "Procurement signed the Datadog renewal at €48,000 per year.",
        "Backups land in gs://acme-backups-eu-west3 every night.",
        "We agreed to drop Python 3.9 support on 2025-06-30.",
        "Our on-call rotation for payments is in PagerDuty schedule P7X2KQ9.",
        "We're gating the new search flow behind a feature flag called search_v2_rollout.",
    ],
)
def test_durable_details_stated_in_passing_are_captured(text):
    assert stored(f"Thanks for the help earlier. {text} Anyway, back to the timeout.") == [
        strip_lead_in(text.rstrip("."))[0]
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Can you check why pod api-7d9f8b6c4-x2kq9 keeps restarting?",  # a question
        "Which port is the ledger DB on, 23456?",
        "Please write a migration for INC-12345 that adds an index.",  # a request
        "Could you compare the output against 7.31.4 and 7.32.0",
        "Remind me to rotate the ledger key QW-4821 next month.",
        "I think the problem might be in v2.3.1 of the client, not sure though.",  # a guess
        "If the migration fails we roll back to 2.14.0 and page the DBA.",
        "The test test_checkout_flow_v2 failed twice on CI today.",  # an event, a measurement
        "Latency on eu-west-1 is about 40 ms higher than us-east-1.",
        "We saw 3200 errors between 02:00 and 02:15 UTC, mostly HTTP 503.",  # numbers, no identifier
        "The p99 went from 180 ms to 2.4 s after the deploy.",
        "Let's revisit the retry policy in src/retry/policy_v2.py next week.",  # a path
        "Quick follow-up on the usage_events migration we talked about earlier.",
        "It's QW-4821 now.",  # nothing says what the value belongs to
        "My password is hunter2forever, don't share it.",  # secrets
        "The signing key for the webhook is Zk8Qm2Lx9Vb4Np7Rt1Hs6Jd3Wc5 on host hooks-01.acme.io.",
        "2025-03-14T10:22:31Z ERROR ledger pid=4411 request_id=req_8f2a timeout after 3000 ms",  # logs
        "$ psql -h db-01.internal -p 5433 -U app -c 'select 1'",
        "kubectl rollout restart deploy/api -n prod --context prod-eu-2",
        "```\nledger:\n  port: 23456\n  host: bastion-12.eu2.acme.internal\n```",
    ],
)
def test_questions_requests_guesses_code_and_secrets_are_not_captured(text):
    assert stored(text) == []


def test_a_secret_is_not_stored(conversation):
    append(
        conversation,
        {
            "role": "user",
            "content": "My password is hunter2forever. The API key is sk_live_51HcXyZabcdefghijk.",
        },
        {"role": "assistant", "content": "Please do not paste those here."},
    )
    run = memory_agent_run(conversation=conversation)
    assert run.operations == []
    assert not ArchivalMemory.objects.exists()
    assert any("reads as a secret" in note for note in run.notes)


def test_details_said_in_passing_are_kept_and_a_newer_statement_invalidates_the_older(owner, conversation):
    append(
        conversation,
        {
            "role": "user",
            "content": "Can you look at the timeout in ledger? Note for later: the deploy key for ledger on "
            "staging is QW-4821. The checkout staging deploy key is AB-5555. We saw 4500 errors overnight.",
        },
        {"role": "assistant", "content": "Noted. The key for ledger is QW-4821, use it for the next push."},
    )
    run = memory_agent_run(conversation=conversation)
    assert [op["rule"] for op in run.operations] == ["detail", "detail"]
    first = ArchivalMemory.objects.get(content__contains="QW-4821")
    assert first.content == "the deploy key for ledger on staging is QW-4821"
    assert first.importance == 0.6  # "note for later"
    assert first.kind == "fact"
    checkout = ArchivalMemory.objects.get(content__contains="AB-5555")
    assert checkout.importance == 0.5

    append(
        conversation,
        {
            "role": "user",
            "content": "Heads-up, the ledger staging deploy key changed again: use KX-1234 from now on.",
        },
        {"role": "assistant", "content": "Got it."},
    )
    run = memory_agent_run(conversation=conversation)
    newer = ArchivalMemory.objects.get(content__contains="KX-1234")
    assert run.operations == [
        {
            "op": "archival_memory_inserted",
            "id": str(newer.id),
            "rule": "detail",
            "invalidated": [str(first.id)],
        }
    ]
    first.refresh_from_db()
    checkout.refresh_from_db()
    assert first.invalidated_by_id == newer.id
    assert checkout.invalidated_at is None  # another service's key is another fact
    operation = MemoryOperation.objects.get(op="archival_memory_invalidate")
    assert operation.target == f"archival:{first.id}"
    assert operation.old_value == first.content and operation.new_value == newer.content
    assert "ledger" in operation.trigger and operation.actor == "agent"
    live = owner.client.get("/api/v1/users/alice/memories").json()["memories"]
    assert {m["content"] for m in live} == {newer.content, checkout.content}


def test_a_decision_with_a_value_is_kept_as_a_decision(conversation):
    append(
        conversation,
        {
            "role": "user",
            "content": "fyi we pinned the ledger client SDK to 7.31.4 until upstream fixes the bug.",
        },
        {"role": "assistant", "content": "OK."},
    )
    memory_agent_run(conversation=conversation)
    memory = ArchivalMemory.objects.get()
    assert (memory.kind, memory.content) == (
        "decision",
        "we pinned the ledger client SDK to 7.31.4 until upstream fixes the bug",
    )


def test_the_rules_vectors_are_computed_before_the_cursor_is_locked(conversation, monkeypatch):
    """An archival memory the rules keep is embedded before _batch_apply takes the cursor's row lock (a slow
    embedder must not hold it), once for each memory; the write under the lock only stores the vector."""
    from django.db import connection

    import memory.archival

    append(
        conversation,
        {
            "role": "user",
            "content": "The deploy key for ledger on staging is QW-4821. We pinned the ledger SDK to 7.31.4.",
        },
        {"role": "assistant", "content": "Noted."},
    )
    depth_outside = len(connection.atomic_blocks)
    embedded = []

    def embed(texts):
        embedded.append((list(texts), len(connection.atomic_blocks)))
        return None, "no embedder in this test"

    monkeypatch.setattr(memory.archival, "embed", embed)
    run = memory_agent_run(conversation=conversation)
    assert [op["rule"] for op in run.operations] == ["detail", "detail"]
    kept = set(ArchivalMemory.objects.values_list("content", flat=True))
    assert kept == {"The deploy key for ledger on staging is QW-4821", "We pinned the ledger SDK to 7.31.4"}
    assert sorted(embedded) == [([content], depth_outside) for content in sorted(kept)]


def test_a_preference_in_a_run_on_request_is_kept_as_the_words_around_it():
    sentence = (
        "I'm trying to understand probability as a ratio, and I prefer step-by-step explanations with "
        "concrete examples like coin tosses and dice rolls, so can you help me calculate the probability of "
        "rolling an even number on a 6-sided die, considering that there are 3 even numbers out of 6 "
        "possible outcomes, considering my goal is to solve 10 probability problems by February 1, and "
        "I've already completed 5 coin toss problems with 80% mastery of simple probability ratios"
    )
    rule = rule_for(sentence)

    assert rule is not None and rule.kind == ArchivalMemory.Kind.PREFERENCE
    assert "I prefer step-by-step explanations" in rule.content
    assert "6-sided die" not in rule.content  # the request that follows is not the preference
    assert rule.content.endswith("…") and len(rule.content) <= STANDING_CHARS + 4


def test_a_short_statement_is_kept_whole():
    rule = rule_for("I prefer tabs over spaces in every Python file")
    assert rule is not None and rule.content == "I prefer tabs over spaces in every Python file"
