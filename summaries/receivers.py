"""Reactions to signals of lower apps."""

import uuid
from typing import Any

from django.dispatch import receiver

from conversations.models import Conversation
from conversations.readiness import readiness_check_register
from conversations.signals import transcript_imported, vectors_written
from summaries.services.compaction import compaction_settled, replay_pending, segments_replay_request

readiness_check_register("compaction", compaction_settled)


@receiver(vectors_written)
def compact_a_history_that_grew_past_its_budget(
    sender: object, *, conversation_id: uuid.UUID | str, **kwargs: Any
) -> None:
    # Vectors follow every append in the background: the moment to see whether the history outgrew its
    # budget without waiting for a context call to ask (a loaded history is compacted before its first one).
    conversation = Conversation.objects.select_related("tenant").filter(pk=conversation_id).first()
    if conversation is not None:
        compaction_settled(conversation)


@receiver(transcript_imported)
def replay_the_segments_of_an_imported_transcript(
    sender: object, *, conversation_id: uuid.UUID | str, **kwargs: Any
) -> None:
    # The transcript carries its compaction records but no segments: they are made in the background, so a
    # context call finds B4 as the exported conversation had it (readiness waits for it meanwhile).
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is not None and replay_pending(conversation):
        segments_replay_request(conversation_id=conversation_id)
