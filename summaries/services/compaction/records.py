"""What compaction shows outside its tables: a segment as the API and the sockets show it, the
compact_summary record that carries a segment in the transcript, and the events to the conversation's
sockets."""

from typing import Any

from conversations.events import event_publish
from conversations.models import Conversation, Message
from summaries.models import SummarySegment

BOUNDARY_TEXT = "Conversation compacted"


def segment_data(segment: SummarySegment) -> dict[str, Any]:
    """A segment as the API and the socket show it."""
    return {
        "id": str(segment.id),
        "start_seq": segment.start_seq,
        "end_seq": segment.end_seq,
        "level": segment.level,
        "source": segment.source,
        "built_from": segment.built_from,
        "model": segment.model,
        "template_version": segment.template_version,
        "token_count": segment.token_count,
        "facts_checked": segment.facts_checked,
        "facts_missing": segment.facts_missing,
        "text": segment.text,
        "superseded_by": str(segment.superseded_by_id) if segment.superseded_by_id else None,
        "created_at": segment.created_at.isoformat().replace("+00:00", "Z"),
    }


def summary_record(segment: SummarySegment, *, supersedes: list[str]) -> dict[str, Any]:
    """The compact_summary message of a segment: its text, and in its metadata what a transcript import
    needs to make the segment again (summaries.services.compaction.replay)."""
    return {
        "role": Message.Role.USER,
        "kind": Message.Kind.COMPACT_SUMMARY,
        "content": segment.text,
        "metadata": {
            "segment": {
                "id": str(segment.id),
                "startSeq": segment.start_seq,
                "endSeq": segment.end_seq,
                "level": segment.level,
                "source": segment.source,
                "builtFrom": segment.built_from,
                "model": segment.model,
                "templateVersion": segment.template_version,
                "factsChecked": segment.facts_checked,
                "factsMissing": segment.facts_missing,
            },
            "supersedes": supersedes,
        },
    }


def publish(conversation: Conversation, event: str, data: dict[str, Any]) -> None:
    event_publish(tenant_id=conversation.tenant_id, conversation_id=conversation.id, event=event, data=data)
