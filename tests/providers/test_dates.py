"""Relative dates in what people say, resolved against the day it was said, and the period a question names
(providers.dates)."""

from datetime import date

import pytest

from providers.dates import annotate, mentions, question_period

MONDAY = date(2023, 5, 8)


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        ("I went yesterday", "I went yesterday (2023-05-07)"),
        ("we met last night", "we met last night (2023-05-07)"),
        ("the day before yesterday", "the day before yesterday (2023-05-06)"),
        ("see you tomorrow", "see you tomorrow (2023-05-09)"),
        ("today was long", "today (2023-05-08) was long"),
        ("Last Saturday was fun", "Last Saturday (2023-05-06) was fun"),
        ("last Monday", "last Monday (2023-05-01)"),  # said on a Monday: the one before
        ("next Friday", "next Friday (2023-05-12)"),
        ("last weekend", "last weekend (weekend of 2023-05-06)"),
        ("this weekend", "this weekend (weekend of 2023-05-13)"),
        ("last week", "last week (week of 2023-05-01)"),
        ("next month we fly", "next month (June 2023) we fly"),
        ("last year", "last year (2022)"),
        ("3 days ago", "3 days ago (2023-05-05)"),
        ("two weeks ago I moved", "two weeks ago (around 2023-04-24) I moved"),
        ("a couple of months ago", "a couple of months ago (March 2023)"),
        ("in two weeks", "in two weeks (around 2023-05-22)"),
        ("last summer I built a shed", "last summer (summer 2022) I built a shed"),
        ("this winter", "this winter (winter 2023)"),
        ("no dates here, only 25 years of age", "no dates here, only 25 years of age"),
    ],
)
def test_relative_expressions_are_resolved_against_the_day_they_were_said(said, shown):
    assert annotate(said, MONDAY) == shown


def test_a_mention_knows_its_span_and_period():
    (mention,) = mentions("We hiked last weekend, it rained.", MONDAY)

    assert "We hiked last weekend, it rained."[mention.start : mention.end] == "last weekend"
    assert (mention.period.first, mention.period.last) == (date(2023, 5, 6), date(2023, 5, 7))


def test_a_season_last_year_when_this_years_has_not_ended():
    assert annotate("last summer", date(2023, 7, 1)) == "last summer (summer 2022)"
    assert annotate("last summer", date(2023, 10, 1)) == "last summer (summer 2023)"
    assert annotate("last winter", date(2023, 1, 15)) == "last winter (winter 2021)"


@pytest.mark.parametrize(
    ("question", "first", "last"),
    [
        ("What did Ana do in May 2023?", date(2023, 5, 1), date(2023, 5, 31)),
        ("What happened in mid-August 2023?", date(2023, 8, 11), date(2023, 8, 21)),
        ("Where was Tomas on 7 May 2023?", date(2023, 5, 7), date(2023, 5, 7)),
        ("Where was Tomas on May 7th, 2023?", date(2023, 5, 7), date(2023, 5, 7)),
        ("And on 2023-05-07?", date(2023, 5, 7), date(2023, 5, 7)),
        ("What did Priya do the weekend before 10 April 2023?", date(2023, 4, 8), date(2023, 4, 9)),
        ("What did Priya do the week before 2023-05-08?", date(2023, 5, 1), date(2023, 5, 7)),
        ("Which trips in 2022?", date(2022, 1, 1), date(2022, 12, 31)),
        ("What did they plan for summer 2024?", date(2024, 6, 1), date(2024, 8, 31)),
    ],
)
def test_the_period_a_question_names(question, first, last):
    period = question_period(question)

    assert period is not None and (period.first, period.last) == (first, last)


@pytest.mark.parametrize(
    "question", ["When did Priya go to the pottery class?", "Is a budget of 2,000 OK?", "On 31 June 2023?"]
)
def test_a_question_without_a_period_names_none(question):
    assert question_period(question) is None
