"""The offline extractive summariser and the fact extractor: what counts as a fact, how sentences are scored,
the target size, and determinism (sentence splitting: tests/providers/test_text.py)."""

from providers.summariser import (
    SourceMessage,
    extract_facts,
    fact_present,
    normalise,
    summarise,
)
from providers.tokens import count_text

TEXT = (
    "We decided to move the API to port 8443 on 2024-03-15. Priya Raman owns src/billing/invoice.py and "
    "/etc/nginx/sites-enabled/api.conf. The budget is $12,500 and latency fell from 340 ms to 95ms (72%). "
    "Set `max_retries` and call fetchUserProfile in InvoiceService; ticket PROJ-1234, commit 3fa9c2e1. "
    'Ship version 2.14.3 by March 3rd, 2025 at 14:05, see https://example.com/docs/a.html for the "Blue '
    'Falcon" plan. We use Redis and PostgreSQL, and/or I/O 24/7.'
)


def facts_by_kind(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for fact in extract_facts(text):
        out.setdefault(fact.kind, set()).add(fact.text)
    return out


def test_facts_cover_numbers_identifiers_paths_names_and_dates():
    kinds = facts_by_kind(TEXT)
    assert {"src/billing/invoice.py", "/etc/nginx/sites-enabled/api.conf"} <= kinds["path"]
    assert "https://example.com/docs/a.html" in kinds["url"]
    assert {"2024-03-15", "March 3rd, 2025", "14:05"} <= kinds["date"]
    assert {"$12,500", "340 ms", "95ms", "72%", "2.14.3", "8443"} <= kinds["number"]
    assert {"fetchUserProfile", "InvoiceService", "PROJ-1234", "3fa9c2e1"} <= kinds["identifier"]
    assert {"max_retries", "Blue Falcon"} <= kinds["quoted"]
    assert {"Priya Raman", "Redis", "PostgreSQL"} <= kinds["name"]
    everything = {f.text for f in extract_facts(TEXT)}
    assert not {"and/or", "I/O", "24/7", "API"} & everything  # not paths, not names


def test_a_bare_number_keeps_the_words_that_lead_up_to_it():
    (fact,) = [f for f in extract_facts("The service listens on port 8443 now.") if f.text == "8443"]
    assert fact.context == "listens on port 8443"


def test_facts_are_deduplicated_and_counted():
    facts = extract_facts(
        "Edit src/app/main.py. Then run src/app/main.py again. Ask Priya Raman; Priya Raman agrees."
    )
    counts = {f.text: f.count for f in facts}
    assert counts["src/app/main.py"] == 2
    assert counts["Priya Raman"] == 2


def test_fact_presence_ignores_case_and_thousands_separators():
    (money,) = [f for f in extract_facts("It costs $12,500 a year.") if f.kind == "number"]
    assert fact_present(money, normalise("the cost is $12500"))
    assert not fact_present(money, normalise("the cost is $1,250"))


def conversation() -> list[SourceMessage]:
    return [
        SourceMessage(1, "user", "Can you set up the billing service for Acme? We need it by Friday."),
        SourceMessage(
            2, "assistant", "Sure. The weather is nice today. I will create src/billing/invoice.py first."
        ),
        SourceMessage(3, "user", "Nice. Thanks a lot. By the way, lovely weather indeed."),
        SourceMessage(4, "assistant", "We decided to use PostgreSQL 16 instead of MySQL for the ledger."),
        SourceMessage(5, "tool", "ERROR connection refused on 10.0.0.5:5432 after 3 retries", "psql"),
        SourceMessage(6, "assistant", "The error was a firewall rule; I fixed it by opening port 5432."),
        SourceMessage(7, "user", "Ok. Good. Fine."),
    ]


def test_the_summary_keeps_requests_decisions_and_fixes_and_drops_chatter():
    # Room for the three that matter most, not for the chatter that follows them in the ranking.
    summary = summarise(conversation(), target_tokens=60)
    assert "Can you set up the billing service for Acme?" in summary
    assert "We decided to use PostgreSQL 16 instead of MySQL for the ledger." in summary
    assert "I fixed it by opening port 5432" in summary
    assert "weather" not in summary
    assert "Ok. Good. Fine." not in summary
    assert count_text(summary, encoding="o200k_base") <= 60 * 1.1


def test_the_summary_is_in_conversation_order_and_labelled_by_speaker():
    summary = summarise(conversation(), target_tokens=200)
    lines = summary.splitlines()
    assert lines[0].startswith("- User: Can you set up")
    assert any(line.startswith("- Tool (psql): ") for line in lines)
    order = [summary.find(s) for s in ("Acme", "PostgreSQL 16", "firewall")]
    assert -1 not in order and order == sorted(order)


def test_the_summary_is_deterministic():
    first = summarise(conversation(), target_tokens=60)
    assert all(summarise(conversation(), target_tokens=60) == first for _ in range(5))


def test_a_focus_raises_the_sentences_it_names():
    without = summarise(conversation(), target_tokens=20)
    focused = summarise(conversation(), target_tokens=20, focus="the billing invoice file")
    assert "invoice.py" not in without
    assert "invoice.py" in focused


def test_a_tiny_target_still_gives_the_best_sentence_shortened():
    summary = summarise(conversation(), target_tokens=3)
    assert summary.startswith("- ")
    assert len(summary.split()) <= 10


def test_nothing_to_summarise_gives_nothing():
    assert summarise([], target_tokens=100) == ""
    assert summarise([SourceMessage(1, "user", "  ")], target_tokens=100) == ""
