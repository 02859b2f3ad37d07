"""Creating, editing and deleting a conversation (its messages and images go with it)."""

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cold_storage.services import images_delete_for_conversation
from conversations.models import Conversation, Message
from tenants.models import Tenant
from tenants.services import end_user_get_or_create
from tenants.settings_schema import tenant_setting


def default_model(tenant: Tenant) -> str:
    # A stored value the settings schema refuses (not text, a NUL) is not a model: the server default applies.
    return tenant_setting(tenant.settings, "default_model") or settings.MNEMO_DEFAULT_MODEL


def conversation_create(
    *,
    tenant: Tenant,
    end_user_external_id: str | None = None,
    model: str | None = None,
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> Conversation:
    end_user = (
        end_user_get_or_create(tenant=tenant, external_id=end_user_external_id)
        if end_user_external_id
        else None
    )
    return Conversation.objects.create(
        tenant=tenant,
        end_user=end_user,
        model=model or default_model(tenant),
        title=title,
        metadata=metadata or {},
    )


def conversation_update(*, conversation: Conversation, **fields: Any) -> Conversation:
    """Change title, model, metadata or the archived flag; other fields are not client-editable."""
    allowed = {"title", "model", "metadata", "archived"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"not editable: {sorted(unknown)}")
    if "archived" in fields:
        archived = fields.pop("archived")
        if archived and conversation.archived_at is None:
            conversation.archived_at = timezone.now()
        elif not archived:
            conversation.archived_at = None
        fields["archived_at"] = conversation.archived_at
    for name, value in fields.items():
        setattr(conversation, name, value)
    conversation.updated_at = timezone.now()
    conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    """Purge the conversation and its whole transcript. This is the explicit delete; compaction never
    removes raw messages."""
    Message.objects.filter(conversation=conversation).delete()
    # The image rows go now, their bytes when this transaction commits.
    images_delete_for_conversation(conversation_id=conversation.id)
    conversation.delete()
