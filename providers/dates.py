"""Dates in what people say: relative expressions in a message ("yesterday", "last Saturday", "two weeks
ago", "next month") resolved against the day it was said, and the period a question names ("in May 2023",
"mid-August 2023", "the weekend before 10 April 2023").

A small parser rather than dateparser: dateparser's `parse` turns a whole string into one datetime, while
this needs the spans of the expressions inside running text and the period each names (a day, a weekend, a
week, a month, a season, a year), so that "last month" is shown as a month, not as a day picked inside it.
Pure functions of their input: the same text and day always give the same result (prompts stay cacheable)."""

import calendar
import re
import threading
from dataclasses import dataclass
from datetime import date, timedelta

MONTHS = {name.lower(): n for n, name in enumerate(calendar.month_name) if name}
MONTHS |= {name.lower(): n for n, name in enumerate(calendar.month_abbr) if name}
MONTHS["sept"] = 9
WEEKDAYS = {name.lower(): n for n, name in enumerate(calendar.day_name)}
NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2,
    "a few": 3, "few": 3, "several": 3,
}  # fmt: skip
# Meteorological seasons of the northern hemisphere: (first month, months long). Winter starts in December.
SEASONS = {"spring": (3, 3), "summer": (6, 3), "autumn": (9, 3), "fall": (9, 3), "winter": (12, 3)}
UNITS = ("day", "week", "weekend", "month", "year")


@dataclass(frozen=True)
class Period:
    """A span of days, both ends included, and how to say it."""

    first: date
    last: date
    label: str

    def overlaps(self, first: date, last: date) -> bool:
        return self.first <= last and first <= self.last


@dataclass(frozen=True)
class Mention:
    """A relative expression in a text (its character span) and the period it names."""

    start: int
    end: int
    period: Period


# --- periods ------------------------------------------------------------------------------------------------


def day_period(day: date) -> Period:
    return Period(day, day, day.isoformat())


def week_period(day: date) -> Period:
    monday = day - timedelta(days=day.weekday())
    return Period(monday, monday + timedelta(days=6), f"week of {monday.isoformat()}")


def weekend_period(saturday: date) -> Period:
    return Period(saturday, saturday + timedelta(days=1), f"weekend of {saturday.isoformat()}")


def month_period(year: int, month: int) -> Period:
    last = calendar.monthrange(year, month)[1]
    return Period(date(year, month, 1), date(year, month, last), f"{calendar.month_name[month]} {year}")


def year_period(year: int) -> Period:
    return Period(date(year, 1, 1), date(year, 12, 31), str(year))


def season_period(name: str, year: int) -> Period:
    """The season `name` that starts in `year` (winter: December of `year` to February)."""
    month, length = SEASONS[name]
    first = date(year, month, 1)
    end_month = (month + length - 1 - 1) % 12 + 1
    end_year = year + (month + length - 1 - 1) // 12
    last = date(end_year, end_month, calendar.monthrange(end_year, end_month)[1])
    return Period(first, last, f"{'autumn' if name == 'fall' else name} {year}")


def _add_months(year: int, month: int, delta: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + delta
    return index // 12, index % 12 + 1


# --- relative expressions in a message ----------------------------------------------------------------------

_NUMBER = "|".join(sorted((re.escape(n) for n in NUMBERS), key=len, reverse=True))
_WEEKDAY = "|".join(WEEKDAYS)
_SEASON = "|".join(SEASONS)
_RELATIVE = re.compile(
    rf"\b(?:(?P<before_yesterday>the day before yesterday)|(?P<after_tomorrow>the day after tomorrow)"
    rf"|(?P<yesterday>yesterday|last night)|(?P<today>today|tonight|this (?:morning|afternoon|evening))"
    rf"|(?P<tomorrow>tomorrow)"
    rf"|(?P<which>last|this past|past|this|next|this coming|coming) "
    rf"(?P<thing>{_WEEKDAY}|weekend|week|month|year|{_SEASON})"
    rf"|(?P<count>\d{{1,2}}|{_NUMBER}) (?P<unit>days?|weeks?|weekends?|months?|years?) "
    rf"(?P<direction>ago|from now|later)"
    rf"|in (?P<in_count>\d{{1,2}}|{_NUMBER}) (?P<in_unit>days?|weeks?|months?|years?))\b",
    re.IGNORECASE,
)


def mentions(text: str, said_on: date) -> list[Mention]:
    """The relative expressions of `text`, each with the period it names when said on `said_on`."""
    key = (hash(text), len(text), said_on)
    found = _found.get(key)
    if found is None:
        found = tuple(
            Mention(match.start(), match.end(), period)
            for match in _RELATIVE.finditer(text)
            if (period := _resolve(match, said_on)) is not None
        )
        with _found_lock:  # server threads share it
            if len(_found) >= FOUND_KEPT:
                _found.pop(next(iter(_found)))  # the oldest entry
            _found[key] = found
    return list(found)


# What mentions() found, by the text's hash and length and the day, not by the text: the same history is
# shown call after call, and the cache must not keep every message's text alive. Oldest entries go first.
FOUND_KEPT = 32_768
_found: dict[tuple[int, int, date], tuple[Mention, ...]] = {}
_found_lock = threading.Lock()


def annotate(text: str, said_on: date) -> str:
    """`text` with the period of each relative expression after it: "yesterday (2023-05-07)"."""
    found = mentions(text, said_on)
    if not found:
        return text
    pieces, at = [], 0
    for mention in found:
        pieces += [text[at : mention.end], f" ({mention.period.label})"]
        at = mention.end
    return "".join(pieces) + text[at:]


def _resolve(match: re.Match[str], said_on: date) -> Period | None:
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    fixed = {"before_yesterday": -2, "yesterday": -1, "today": 0, "tomorrow": 1, "after_tomorrow": 2}
    for key, shift in fixed.items():
        if key in groups:
            return day_period(said_on + timedelta(days=shift))
    if "which" in groups:
        return _named(groups["which"].lower(), groups["thing"].lower(), said_on)
    if "count" in groups:
        sign = -1 if groups["direction"].lower() == "ago" else 1
        return _counted(sign * _number(groups["count"]), groups["unit"].lower().rstrip("s"), said_on)
    return _counted(_number(groups["in_count"]), groups["in_unit"].lower().rstrip("s"), said_on)


def _number(text: str) -> int:
    return int(text) if text.isdigit() else NUMBERS[" ".join(text.lower().split())]


def _step(which: str) -> int:
    """-1 for the one before, 0 for the current one, 1 for the one after."""
    if which in ("last", "this past", "past"):
        return -1
    return 1 if which == "next" else 0


def _named(which: str, thing: str, said_on: date) -> Period | None:
    step = _step(which)
    if thing in WEEKDAYS:
        return day_period(_weekday(WEEKDAYS[thing], said_on, step))
    if thing == "weekend":
        return _weekend(said_on, step)
    if thing == "week":
        return week_period(said_on + timedelta(weeks=step))
    if thing == "month":
        return month_period(*_add_months(said_on.year, said_on.month, step))
    if thing == "year":
        return year_period(said_on.year + step)
    return _season(thing, said_on, step)


def _weekday(weekday: int, said_on: date, step: int) -> date:
    """The weekday before `said_on` (step -1) or the next one from it on (0: today counts, 1: after today)."""
    if step < 0:
        return said_on - timedelta(days=(said_on.weekday() - weekday - 1) % 7 + 1)
    ahead = (weekday - said_on.weekday()) % 7
    return said_on + timedelta(days=ahead or (7 if step > 0 else 0))


def _weekend(said_on: date, step: int) -> Period:
    """The last weekend that ended before `said_on`, or the one under way or coming (this, next)."""
    if step < 0:
        sunday = said_on - timedelta(days=(said_on.weekday() - 6 - 1) % 7 + 1)
        return weekend_period(sunday - timedelta(days=1))
    saturday = said_on - timedelta(days=1) if said_on.weekday() == 6 else _weekday(5, said_on, 0)
    return weekend_period(saturday)


def _season(name: str, said_on: date, step: int) -> Period:
    """Last: the latest such season that ended before `said_on`; this: the one of its year (winter: the one
    under way or next); next: the first that starts after `said_on`."""
    year = said_on.year
    if step < 0:
        for start in (year, year - 1, year - 2):
            period = season_period(name, start)
            if period.last < said_on:
                return period
    candidates = [season_period(name, y) for y in (year - 1, year, year + 1)]
    if step == 0:
        current = [p for p in candidates if p.first <= said_on <= p.last]
        return current[0] if current else next(p for p in candidates if p.first > said_on)
    return next(p for p in candidates if p.first > said_on)


def _counted(count: int, unit: str, said_on: date) -> Period | None:
    if unit == "day":
        return day_period(said_on + timedelta(days=count))
    if unit in ("week", "weekend"):
        return _around(said_on + timedelta(weeks=count))
    if unit == "month":
        return month_period(*_add_months(said_on.year, said_on.month, count))
    if unit == "year":
        return year_period(said_on.year + count)
    return None


def _around(day: date) -> Period:
    """A day counted in weeks: its week, labelled by the day itself."""
    week = week_period(day)
    return Period(week.first, week.last, f"around {day.isoformat()}")


# --- the period a question names ----------------------------------------------------------------------------

_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_YEAR = r"(?:19|20)\d\d"
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_ABSOLUTE = re.compile(
    rf"\b(?:(?P<iso>{_YEAR}-\d\d-\d\d)"
    rf"|(?P<dm_day>{_DAY}) (?:of )?(?P<dm_month>{_MONTH})\.?,? (?P<dm_year>{_YEAR})"
    rf"|(?P<md_month>{_MONTH})\.? (?P<md_day>{_DAY}),? (?P<md_year>{_YEAR})"
    rf"|(?:(?P<part>early|mid|late)[- ])?(?P<m_month>{_MONTH})\.?,? (?P<m_year>{_YEAR})"
    rf"|(?P<season>{_SEASON}) (?:of )?(?P<s_year>{_YEAR})"
    rf"|(?P<year>{_YEAR}))\b",
    re.IGNORECASE,
)
_AROUND = re.compile(r"\bthe (?P<unit>week|weekend|day|month) (?P<side>before|after|of)\s+$", re.IGNORECASE)


def question_period(question: str) -> Period | None:
    """The period a question names ("in May 2023", "on 7 May 2023", "the weekend before 10 April 2023"):
    the first absolute date or period in it, widened by "the week/weekend/day before/after/of" in front."""
    for match in _ABSOLUTE.finditer(question):
        period = _absolute(match)
        if period is None:
            continue
        around = _AROUND.search(question[: match.start()])
        return (
            _beside(period, around.group("unit").lower(), around.group("side").lower()) if around else period
        )
    return None


def _absolute(match: re.Match[str]) -> Period | None:
    g = {k: v for k, v in match.groupdict().items() if v is not None}
    try:
        if "iso" in g:
            return day_period(date.fromisoformat(g["iso"]))
        if "dm_day" in g:
            return day_period(date(int(g["dm_year"]), MONTHS[g["dm_month"].lower()], _day(g["dm_day"])))
        if "md_day" in g:
            return day_period(date(int(g["md_year"]), MONTHS[g["md_month"].lower()], _day(g["md_day"])))
    except ValueError:  # 31 June, 2023-02-30
        return None
    if "m_month" in g:
        return _month_part(month_period(int(g["m_year"]), MONTHS[g["m_month"].lower()]), g.get("part"))
    if "season" in g:
        return season_period(g["season"].lower(), int(g["s_year"]))
    return year_period(int(g["year"]))


def _day(text: str) -> int:
    return int(re.match(r"\d+", text).group())  # type: ignore[union-attr]  # _DAY starts with digits


def _month_part(month: Period, part: str | None) -> Period:
    """Early, mid or late in a month: its first, middle or last eleven days or so."""
    if part is None:
        return month
    first = {"early": 0, "mid": 10, "late": 20}[part.lower()]
    start = month.first + timedelta(days=first)
    end = month.last if part.lower() == "late" else start + timedelta(days=10)
    return Period(start, end, f"{part.lower()} {month.label}")


def _beside(period: Period, unit: str, side: str) -> Period:
    """The day, week, weekend or month before, after or of a date."""
    anchor = period.first if side == "before" else period.last
    if side == "of":
        anchor = period.first
    if unit == "day":
        return day_period(anchor + timedelta(days={"before": -1, "after": 1, "of": 0}[side]))
    if unit == "weekend":
        return _weekend(anchor, -1 if side == "before" else 0 if side == "of" else 1)
    if unit == "month":
        return month_period(
            *_add_months(anchor.year, anchor.month, {"before": -1, "after": 1, "of": 0}[side])
        )
    if side == "of":
        return week_period(anchor)
    if side == "before":
        return Period(anchor - timedelta(days=7), anchor - timedelta(days=1), f"the week before {anchor}")
    return Period(anchor + timedelta(days=1), anchor + timedelta(days=7), f"the week after {anchor}")
