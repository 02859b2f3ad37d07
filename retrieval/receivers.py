"""Keeping this process's conversation indexes (retrieval.history) in step with the database, and the vector
engine, when MNEMO_VECTOR_STORE names one, in step with the rows that carry vectors (retrieval.vectors.follow:
nothing is done for the numpy backend)."""

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models.signals import post_delete, post_save, pre_delete
from django.dispatch import receiver

from conversations.models import Conversation
from conversations.signals import vectors_written
from knowledge.models import Chunk, Document
from memory.models import ArchivalMemory
from retrieval.history import conversation_index_drop, conversation_index_warm
from retrieval.vectors.current import vector_engine
from retrieval.vectors.follow import follow_delete, follow_end_user_delete, follow_rows
from retrieval.vectors.store import VectorFilters
from tenants.models import EndUser


@receiver(post_delete, sender=Conversation)
def forget_the_history_index(sender: object, *, instance: Conversation, **kwargs: Any) -> None:
    # This process's in-memory index of a deleted conversation goes with it (others drop it as it ages out;
    # nothing can query a deleted conversation).
    conversation_index_drop(instance.pk)
    follow_delete("message", tenant_id=instance.tenant_id, filters=VectorFilters(scopes=(str(instance.pk),)))


@receiver(vectors_written)
def bring_the_history_index_up_to_date(
    sender: object,
    *,
    conversation_id: uuid.UUID | str,
    message_ids: Sequence[Any] = (),
    **kwargs: Any,
) -> None:
    conversation_index_warm(conversation_id)
    if message_ids and vector_engine() is not None:
        tenant_id = (
            Conversation.objects.filter(pk=conversation_id).values_list("tenant_id", flat=True).first()
        )
        if tenant_id is not None:
            follow_rows("message", message_ids, tenant_id=tenant_id)


@receiver(post_save, sender=Document)
def send_a_ready_documents_chunks(sender: object, *, instance: Document, **kwargs: Any) -> None:
    # Processing writes the chunks and marks the document ready in one transaction.
    fields = kwargs.get("update_fields")
    if instance.status != Document.Status.READY or (fields is not None and "status" not in fields):
        return
    if vector_engine() is not None:
        ids = list(Chunk.objects.filter(document_id=instance.pk).values_list("id", flat=True))
        follow_rows("chunk", ids, tenant_id=instance.tenant_id)


@receiver(pre_delete, sender=Document)
def remove_a_documents_chunks(sender: object, *, instance: Document, **kwargs: Any) -> None:
    # Before the delete: its chunks, and so their ids, go with it.
    if vector_engine() is not None:
        ids = tuple(
            str(pk) for pk in Chunk.objects.filter(document_id=instance.pk).values_list("id", flat=True)
        )
        if ids:
            follow_delete("chunk", tenant_id=instance.tenant_id, filters=VectorFilters(ids=ids))


# A save of only these fields (a merge counting one more mention) leaves the memory's vector as it was.
_MEMORY_FIELDS_BESIDE_THE_VECTOR = frozenset({"mentions", "importance", "source_message_ids", "updated_at"})


@receiver(post_save, sender=ArchivalMemory)
def send_a_memory(sender: object, *, instance: ArchivalMemory, **kwargs: Any) -> None:
    # Inserted, re-embedded, invalidated or restored: added to the engine, or removed when not searchable.
    fields = kwargs.get("update_fields")
    if fields is not None and fields <= _MEMORY_FIELDS_BESIDE_THE_VECTOR:
        return
    follow_rows("memory", [instance.pk], tenant_id=instance.tenant_id)


@receiver(post_delete, sender=ArchivalMemory)
def remove_a_memory(sender: object, *, instance: ArchivalMemory, **kwargs: Any) -> None:
    follow_delete("memory", tenant_id=instance.tenant_id, filters=VectorFilters(ids=(str(instance.pk),)))


@receiver(post_delete, sender=EndUser)
def forget_an_end_user(sender: object, *, instance: EndUser, **kwargs: Any) -> None:
    # The data delete of an end user: whatever a failed delete above left behind of theirs goes too.
    follow_end_user_delete(tenant_id=instance.tenant_id, end_user_id=instance.pk)
