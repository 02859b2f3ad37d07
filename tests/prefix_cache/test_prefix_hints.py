"""Prefix accounting: layered prefix hashes, the PrefixHint level a call hits, predicted cached tokens by
each provider's rule, and one CacheUsage row per context call."""

import threading

import pytest
from django.db import connection, transaction

from context.services import agent_profile_create
from prefix_cache.models import CacheUsage, PrefixHint
from prefix_cache.services import context_calls_flush
from prefix_cache.usage import cacheable_tokens, openai_cacheable
from tests.context.helpers import append, context

pytestmark = pytest.mark.django_db

LEVELS = ["B1", "B1+B2a", "B1+B2a+B4", "B1+B2a+B4+B6"]
# ~1,200 tokens: over the 1,024-token minimum of OpenAI, Anthropic (not Haiku) and Gemini Flash, under
# Haiku's 2,048 and Gemini Pro's 4,096.
LONG_POLICY = " ".join(["Cite the ticket number."] * 240)


@pytest.fixture
def profile(owner):
    return agent_profile_create(tenant=owner.tenant, name="Support", policy=LONG_POLICY, is_default=True)


@pytest.mark.parametrize(
    ("prefix_tokens", "cached"),
    [(0, 0), (1023, 0), (1024, 1024), (1151, 1024), (1152, 1152), (1279, 1152), (5000, 4992)],
)
def test_openai_caches_from_1024_tokens_in_128_token_steps(prefix_tokens, cached):
    assert openai_cacheable(prefix_tokens) == cached
    assert cacheable_tokens("openai", prefix_tokens=prefix_tokens, model="gpt-4o") == cached


@pytest.mark.parametrize(
    ("provider", "model", "prefix_tokens", "cached"),
    [
        ("anthropic", "claude-sonnet-4-20250514", 1023, 0),
        ("anthropic", "claude-sonnet-4-20250514", 1024, 1024),
        ("anthropic", "claude-sonnet-4-20250514", 1151, 1151),  # no steps: up to the breakpoint
        ("anthropic", "claude-3-5-haiku-20241022", 2047, 0),
        ("anthropic", "claude-3-5-haiku-20241022", 2048, 2048),
        ("gemini", "gemini-2.5-flash", 1023, 0),
        ("gemini", "gemini-2.5-flash", 1024, 1024),
        ("gemini", "gemini-2.5-pro", 4095, 0),
        ("gemini", "gemini-2.5-pro", 4096, 4096),
    ],
)
def test_anthropic_and_gemini_minimums(provider, model, prefix_tokens, cached):
    assert cacheable_tokens(provider, prefix_tokens=prefix_tokens, model=model) == cached


def hints(tenant):
    return {(h.level, h.hash): h for h in PrefixHint.objects.filter(tenant=tenant)}


def assert_first_call_rows(owner, conversation, first) -> None:
    """A first call stores a hint per level and one for the whole prompt, each seen once, and its usage row
    with what it predicted (nothing cached yet) and nothing reported yet."""
    prefix = first["prefix"]
    rows = hints(owner.tenant)
    assert len(rows) == 5  # the four levels and the whole prompt
    assert {(level, h.hits, h.token_count) for (level, _), h in rows.items() if level != "prompt"} == {
        (level, 1, prefix["tokens"][level]) for level in LEVELS
    }
    (whole,) = [h for (level, _), h in rows.items() if level == "prompt"]
    assert whole.token_count == prefix["tokens"]["B1+B2a+B4+B6"] + first["tokens"]["user"]
    usage = CacheUsage.objects.get(pk=first["context_id"])
    assert (usage.tenant_id, usage.conversation_id) == (owner.tenant.id, conversation.id)
    assert (usage.provider, usage.model, usage.hint_level) == ("openai", "gpt-4o", "")
    assert usage.predicted_prompt_tokens == first["tokens"]["total"]
    assert usage.predicted_cacheable_tokens == 0
    assert usage.prefix_hash == prefix["hashes"]["B1+B2a+B4+B6"]
    assert (usage.prompt_tokens, usage.cached_tokens, usage.reported_at) == (None, None, None)


def test_hint_levels_hits_and_usage_rows_over_three_calls(owner, conversation, profile):
    append(
        conversation, {"role": "user", "content": "Ticket 881?"}, {"role": "assistant", "content": "Closed."}
    )
    question = {"user_message": "And ticket 882?"}

    first = context(owner, conversation, **question)
    prefix = first["prefix"]
    assert prefix["hint_level"] is None
    assert prefix["predicted_cached_tokens"] == 0
    assert list(prefix["hashes"]) == LEVELS
    assert 1024 < prefix["tokens"]["B1"] < 2048
    # No B2a/B4 yet: those levels cover the same text as B1; B6 adds the history's tokens.
    assert prefix["tokens"]["B1+B2a+B4"] == prefix["tokens"]["B1"] == first["tokens"]["system"]
    assert prefix["tokens"]["B1+B2a+B4+B6"] == prefix["tokens"]["B1"] + first["tokens"]["history"]
    stable = prefix["tokens"]["B1+B2a+B4+B6"]
    assert prefix["cacheable_prefix_tokens"] == {
        "openai": openai_cacheable(stable),
        "anthropic": stable,
        "gemini": stable,
    }
    assert_first_call_rows(owner, conversation, first)

    second = context(owner, conversation, **question)
    assert second["prefix"]["hint_level"] == "B1+B2a+B4+B6"
    assert second["prefix"]["predicted_cached_tokens"] == openai_cacheable(stable) > 0
    rows = hints(owner.tenant)
    assert len(rows) == 5
    assert {h.hits for h in rows.values()} == {2}
    usage = CacheUsage.objects.get(pk=second["context_id"])
    assert (usage.hint_level, usage.predicted_cacheable_tokens) == ("B1+B2a+B4+B6", openai_cacheable(stable))

    append(
        conversation,
        {"role": "user", "content": "And ticket 882?"},
        {"role": "assistant", "content": "Open."},
    )
    third = context(owner, conversation, **question)
    # The whole history level changed, but the earlier prompt is a prefix of this one up to its last
    # history message: the hash chain finds it, and the prediction covers the old history too.
    assert third["prefix"]["hint_level"] == "B1+B2a+B4"
    # The previous prompt ended with the same question, now stored: the match runs through it too.
    old = len(second["blocks"]["B6"]["items"])
    assert third["prefix"]["cached_history_messages"] == old + 1
    matched = stable + third["blocks"]["B6"]["items"][old]["tokens"]
    assert third["prefix"]["predicted_cached_tokens"] == openai_cacheable(matched) > 0
    assert third["prefix"]["hashes"]["B1+B2a+B4"] == first["prefix"]["hashes"]["B1+B2a+B4"]
    assert third["prefix"]["hashes"]["B1+B2a+B4+B6"] != first["prefix"]["hashes"]["B1+B2a+B4+B6"]
    rows = hints(owner.tenant)
    assert len(rows) == 7  # four levels and the whole prompt, then a new history level and prompt
    assert rows[("B1", prefix["hashes"]["B1"])].hits == 3
    assert rows[("B1+B2a+B4+B6", third["prefix"]["hashes"]["B1+B2a+B4+B6"])].hits == 1

    ids = {
        str(pk) for pk in CacheUsage.objects.filter(conversation=conversation).values_list("id", flat=True)
    }
    assert ids == {first["context_id"], second["context_id"], third["context_id"]}


@pytest.mark.parametrize(
    ("model", "cached_when_hit"),
    [
        ("claude-sonnet-4-20250514", "all"),
        ("claude-3-5-haiku-20241022", "none"),  # under Haiku's 2,048-token minimum
        ("gemini-2.5-flash", "all"),
        ("gemini-2.5-pro", "none"),  # under Pro's 4,096-token minimum
    ],
)
def test_predictions_follow_the_providers_rule(owner, conversation, profile, model, cached_when_hit):
    context(owner, conversation, user_message="hi", model=model)
    body = context(owner, conversation, user_message="hi", model=model)
    prefix = body["prefix"]
    assert prefix["hint_level"] == "B1+B2a+B4+B6"
    hit_tokens = prefix["tokens"]["B1+B2a+B4+B6"]
    assert 1024 <= hit_tokens < 2048
    assert prefix["predicted_cached_tokens"] == (hit_tokens if cached_when_hit == "all" else 0)
    usage = CacheUsage.objects.get(pk=body["context_id"])
    assert usage.provider == body["format"]
    assert usage.predicted_cacheable_tokens == prefix["predicted_cached_tokens"]


def test_hashes_are_per_format_and_model(owner, conversation, profile):
    openai = context(owner, conversation, user_message="hi")
    anthropic = context(owner, conversation, user_message="hi", format="anthropic")
    mini = context(owner, conversation, user_message="hi", model="gpt-4o-mini")
    assert anthropic["prefix"]["hint_level"] is None
    assert mini["prefix"]["hint_level"] is None
    assert (
        len(
            {
                openai["prefix"]["hashes"]["B1"],
                anthropic["prefix"]["hashes"]["B1"],
                mini["prefix"]["hashes"]["B1"],
            }
        )
        == 3
    )


def test_hints_are_per_tenant(owner, outsider, conversation, outsider_conversation, profile):
    agent_profile_create(tenant=outsider.tenant, name="Support", policy=LONG_POLICY, is_default=True)
    mine = context(owner, conversation, user_message="hi")
    context(owner, conversation, user_message="hi")
    theirs = context(outsider, outsider_conversation, user_message="hi")
    # Byte-identical prompt, but another tenant's traffic warms nothing for this one.
    assert theirs["prefix"]["hashes"] == mine["prefix"]["hashes"]
    assert theirs["prefix"]["hint_level"] is None
    assert theirs["prefix"]["predicted_cached_tokens"] == 0
    assert PrefixHint.objects.filter(tenant=outsider.tenant).count() == 5
    assert {h.hits for h in PrefixHint.objects.filter(tenant=owner.tenant)} == {2}


def test_a_shallow_change_resets_the_deeper_levels(owner, conversation, profile):
    append(conversation, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
    context(owner, conversation, user_message="hi")
    owner.client.patch(f"/api/v1/agent-profiles/{profile.id}", {"scope": "refunds"}, format="json")
    body = context(owner, conversation, user_message="hi")
    # The history is unchanged, but it follows a new system message: no level is a hit.
    assert body["prefix"]["hint_level"] is None
    assert body["prefix"]["predicted_cached_tokens"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_call_does_not_wait_for_hint_rows_another_call_holds(owner, conversation, profile):
    """Concurrent calls of a tenant count the same hint rows (its profile's levels) while their
    transactions are open; fifty proxied streams at once deadlocked on them. A call skips rows another
    holds instead of waiting for them."""
    if connection.vendor != "postgresql":
        pytest.skip("row-lock concurrency is tested on PostgreSQL (set DATABASE_URL)")
    first = context(owner, conversation, user_message="hi")
    held, release, done = threading.Event(), threading.Event(), []

    def other_call() -> None:
        try:
            with transaction.atomic():
                list(PrefixHint.objects.select_for_update().filter(tenant=owner.tenant))
                held.set()
                release.wait(timeout=30)
            done.append(True)
        finally:
            connection.close()

    thread = threading.Thread(target=other_call)
    thread.start()
    try:
        assert held.wait(timeout=30)
        second = context(owner, conversation, user_message="hi")
        finished_while_held = not release.is_set()
    finally:
        release.set()
        thread.join()
    assert finished_while_held and done == [True]
    assert second["prefix"]["hint_level"] == "B1+B2a+B4+B6"  # the reads were not blocked either
    assert second["prefix"]["hashes"] == first["prefix"]["hashes"]
    # The held rows were not counted; nothing was lost or duplicated.
    assert {h.hits for h in PrefixHint.objects.filter(tenant=owner.tenant)} == {1}


def test_a_server_process_buffers_hint_hits_and_writes_them_together(owner, conversation, profile, settings):
    """Hits are statistics no prompt depends on: a server process counts them with the context-call
    statistics and writes them together, and a call sees the hints themselves at once."""
    settings.MNEMO_CONTEXT_STATS_FLUSH_SECONDS = 3600  # the flush thread does not run during the test
    question = {"user_message": "Where is ticket 881?"}
    first = context(owner, conversation, **question)
    second = context(owner, conversation, **question)
    third = context(owner, conversation, **question)
    assert second["prefix"]["hint_level"] == third["prefix"]["hint_level"] == "B1+B2a+B4+B6"
    assert {h.hits for h in PrefixHint.objects.filter(tenant=owner.tenant)} == {1}

    context_calls_flush()

    rows = {(h.level, h.hash): h for h in PrefixHint.objects.filter(tenant=owner.tenant)}
    assert {h.hits for h in rows.values()} == {3}
    b1 = rows[("B1", first["prefix"]["hashes"]["B1"])]
    assert b1.last_seen > b1.first_seen
    context_calls_flush()  # nothing left: nothing counted twice
    assert {h.hits for h in PrefixHint.objects.filter(tenant=owner.tenant)} == {3}
