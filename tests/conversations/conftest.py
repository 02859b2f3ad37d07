"""Fixtures of the conversation tests."""

import pytest

from conversations.models import Conversation
from tests.conversations.transcripts import rich_build


@pytest.fixture
def rich(owner) -> Conversation:
    """A conversation holding everything a transcript carries (tests.conversations.transcripts)."""
    return rich_build(owner)
