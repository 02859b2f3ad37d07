"""How this conversation's hits are shown (retrieval.this_conversation)."""

from datetime import UTC, datetime
from types import SimpleNamespace

from providers.dates import mentions
from retrieval.history import IndexedMessage
from retrieval.this_conversation import _turn

SAID = datetime(2023, 5, 8, 10, 0, tzinfo=UTC)
TEXT = "I went to the pottery class yesterday."


def message(text: str, *, completed: bool = True) -> IndexedMessage:
    """A message as the index holds it: its relative dates read from `text` when it was indexed."""
    periods = tuple(m.period for m in mentions(text, SAID.date()))
    return IndexedMessage("m1", 5, "user", SAID, 9, completed, passages=[0], periods=periods)


def shown(indexed: IndexedMessage, text: str, *, whole_text: bool) -> str:
    return _turn(SimpleNamespace(by_seq={5: 0}), indexed, text, whole_text=whole_text).text


def test_a_whole_message_is_shown_with_its_relative_dates_resolved_or_as_it_is():
    resolved = "I went to the pottery class yesterday (2023-05-07)."
    assert shown(message(TEXT), TEXT, whole_text=True) == resolved
    assert shown(message("Plain words."), "Plain words.", whole_text=True) == "Plain words."


def test_an_excerpt_or_a_message_still_being_written_is_read_for_dates_again():
    # The index found no date in what it read; the text shown may hold one it did not read.
    before = message("I went to the pottery class.")
    assert "(2023-05-07)" in shown(before, TEXT, whole_text=False)
    assert "(2023-05-07)" in shown(message("I went", completed=False), TEXT, whole_text=True)
