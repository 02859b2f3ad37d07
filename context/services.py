"""Writes: agent profiles and their assignment to conversations."""

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import status

from context.models import AgentProfile, ConversationContext
from conversations.models import Conversation
from tenants.errors import ApplicationError
from tenants.models import Tenant

_TEXT_FIELDS = ("name", "scope", "policy")


def _save_profile(profile: AgentProfile) -> AgentProfile:
    try:
        with transaction.atomic():
            if profile.is_default:
                # One default per tenant: taking it releases the previous holder in the same transaction.
                AgentProfile.objects.filter(tenant=profile.tenant, is_default=True).exclude(
                    pk=profile.pk
                ).update(is_default=False)
            profile.save()
    except IntegrityError:
        raise ApplicationError(
            f"An agent profile named {profile.name!r} exists.",
            code="agent_profile_exists",
            status_code=status.HTTP_409_CONFLICT,
        ) from None
    return profile


def agent_profile_create(
    *, tenant: Tenant, name: str, scope: str = "", policy: str = "", is_default: bool = False
) -> AgentProfile:
    return _save_profile(
        AgentProfile(tenant=tenant, name=name, scope=scope, policy=policy, is_default=is_default)
    )


def agent_profile_update(*, profile: AgentProfile, **fields: Any) -> AgentProfile:
    changed_text = any(name in fields and fields[name] != getattr(profile, name) for name in _TEXT_FIELDS)
    for name, value in fields.items():
        setattr(profile, name, value)
    if changed_text:
        profile.version += 1
    profile.updated_at = timezone.now()
    return _save_profile(profile)


def conversation_agent_profile_set(
    *, conversation: Conversation, profile: AgentProfile | None
) -> ConversationContext:
    state, _ = ConversationContext.objects.get_or_create(conversation=conversation)
    state.agent_profile = profile
    state.updated_at = timezone.now()
    state.save(update_fields=["agent_profile", "updated_at"])
    return state
