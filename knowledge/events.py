"""document.updated: a conversation's sockets hear when one of its documents changes status (pending,
ready, failed). Documents of an end user or the whole tenant have no socket; clients poll
GET /api/v1/documents/{id}."""

from conversations.events import event_publish
from knowledge.models import Document


def document_event(document: Document) -> None:
    if document.conversation_id is None:
        return
    event_publish(
        tenant_id=document.tenant_id,
        conversation_id=document.conversation_id,
        event="document.updated",
        data={
            "id": str(document.pk),
            "name": document.name,
            "kind": document.kind,
            "status": document.status,
            "error_code": document.error_code,
            "error": document.error,
            "chunk_count": document.chunk_count,
        },
    )
