"""The shared text heuristics (providers.text): each stopword list serves its own use, the three sentence
splitters cut where their users need, one list of file extensions serves both fact extractors, and code in a
message is told from prose."""

import re

import pytest

from memory.facts import specific_values
from providers.summariser import extract_facts
from providers.text import (
    FACT_STOPWORDS,
    FILE_EXTENSION_PATTERN,
    FILE_EXTENSIONS,
    PASSAGE_STOPWORDS,
    SEARCH_STOPWORDS,
    SUMMARY_STOPWORDS,
    URL_TAIL,
    is_code_line,
    prose_sentences,
    search_words,
    sentence_spans,
    summary_sentences,
    without_end_mark,
    wordset,
)
from retrieval.history import terms


def test_wordset_reads_a_list_written_as_text():
    assert wordset(" a  b\nc a ") == frozenset({"a", "b", "c"})


def test_search_keeps_the_words_that_narrow_a_query_that_passage_ranking_drops():
    # "after" and "only" narrow a search ("only after the deploy") but are function words to BM25.
    assert not {"after", "only"} & SEARCH_STOPWORDS
    assert {"after", "only"} <= PASSAGE_STOPWORDS
    assert search_words("only after the deploy") == ["only", "after", "deploy"]
    assert terms("only after the deploy") == ["deploy"]


def test_the_summary_list_adds_contractions_and_chat_filler_but_counts_will():
    assert {"don't", "they're", "okay", "thanks", "actually"} <= SUMMARY_STOPWORDS
    assert "will" not in SUMMARY_STOPWORDS
    assert {"don't", "okay"}.isdisjoint(PASSAGE_STOPWORDS)


def test_fact_stopwords_are_the_search_list_and_the_vague_words_around_a_value():
    assert SEARCH_STOPWORDS < FACT_STOPWORDS
    assert {"thing", "stuff", "via", "someone"} <= FACT_STOPWORDS


@pytest.mark.parametrize(
    "name", ["app.tsx", "notes.md", "main.hcl", "deck.pptx", "photo.jpeg", "Dockerfile.dockerfile"]
)
def test_one_extension_list_makes_a_file_name_for_both_fact_extractors(name):
    assert name.rsplit(".", 1)[1].lower() in FILE_EXTENSIONS
    assert re.fullmatch(rf"\w+\.{FILE_EXTENSION_PATTERN}", name, re.IGNORECASE)
    # The summariser's fact check takes it as a path; memory.facts never as a host or an identifier.
    assert any(f.kind == "path" and f.text == name for f in extract_facts(f"Open {name} now."))
    assert not specific_values(f"The file is {name} now.")


def test_the_extension_pattern_tries_the_longest_extension_first():
    assert re.match(FILE_EXTENSION_PATTERN, "tsx").group(0) == "tsx"
    assert re.match(FILE_EXTENSION_PATTERN, "jsonl").group(0) == "jsonl"


def test_a_url_ends_before_the_sentence_punctuation():
    assert re.search(rf"https?://{URL_TAIL}", "See https://example.com/a?b=1.").group(0) == (
        "https://example.com/a?b=1"
    )


def test_summary_sentences_split_at_sentence_ends_not_inside_names():
    sentences = summary_sentences(
        "Open config.yaml and set pi to 3.14. Then restart.\n- a list item\n"
        "```\ncode = 1. Not prose.\n```\nDone!"
    )
    assert sentences == ["Open config.yaml and set pi to 3.14.", "Then restart.", "a list item", "Done!"]


def test_a_long_summary_sentence_is_cut_at_a_word():
    (sentence,) = summary_sentences("word " * 200)
    assert sentence.endswith(" …") and len(sentence) <= 402
    assert sentence[:-2].split() == ["word"] * len(sentence[:-2].split())


def test_sentence_spans_cover_each_sentence_and_line():
    text = "First one. Second one!\nA line without an end\n\n結論です。 次です"
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "First one.",
        " Second one!",
        "A line without an end",
        "結論です。",
        " 次です",
    ]
    assert sentence_spans("   ") == ((0, 3),)


def test_prose_sentences_leave_code_logs_and_commands_out():
    text = (
        "We pinned the SDK to 7.31.4, e.g. for J. Smith's build. It works!\n"
        "$ psql -h db-01.internal -p 5433\n"
        "2025-03-14T10:22:31Z ERROR api pid=4411 timeout\n"
        "```\nport = 5432.\n```\n"
        "- the last item"
    )
    assert prose_sentences(text) == [
        "We pinned the SDK to 7.31.4, e.g. for J. Smith's build.",
        "It works!",
        "the last item",
    ]
    assert without_end_mark(" It works! ") == "It works"


@pytest.mark.parametrize(
    "line, code",
    [
        ("    return x", True),
        ("    - a nested list item", False),
        ("kubectl get pods -n prod", True),
        ("kubectl is what we use", False),
        ("| a | table |", True),
        ("def handler(event):", True),
        ("if (a[0] == b[1]) { c(); }", True),
        ("The port is 5432 on staging.", False),
    ],
)
def test_code_lines_are_told_from_prose(line, code):
    assert is_code_line(line) is code
