"""AgentProfile (B1) and the per-conversation context state the pipeline keeps."""

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from conversations.models import Conversation
from tenants.models import Tenant


class AgentProfile(models.Model):
    """Who the agent is and what it may do: the first block of every system message."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agent_profiles")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=500, blank=True, help_text="What the agent is responsible for.")
    policy = models.TextField(blank=True, help_text="Behaviour rules and boundaries.")
    is_default = models.BooleanField(default=False, help_text="Used by conversations that name no profile.")
    # Bumped whenever the rendered text changes, so a cache miss can be traced to an edit.
    version = models.PositiveIntegerField(default=1, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="agentprofile_name_unique"),
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(is_default=True), name="agentprofile_one_default_per_tenant"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def validate_constraints(self, exclude: Any = None) -> None:
        # Form validation would refuse a second default; the service instead releases the previous default
        # in the same transaction, so that constraint is left to it (and to the database).

        try:
            super().validate_constraints(exclude=exclude)
        except ValidationError as exc:
            errors = {
                field: [e for e in messages if "agentprofile_one_default_per_tenant" not in str(e)]
                for field, messages in exc.message_dict.items()
            }
            errors = {field: messages for field, messages in errors.items() if messages}
            if errors:
                raise ValidationError(errors) from None

    def render(self) -> str:
        """B1 text. A pure function of the profile's fields: no dates, no ids."""
        lines = [f"You are {self.name}" + (f", responsible for {self.scope}." if self.scope else ".")]
        if self.policy:
            lines.append(f"Policy:\n{self.policy.strip()}")
        return "\n".join(lines)


class ConversationContext(models.Model):
    """The context pipeline's state for one conversation: its agent profile and where the prompt's history
    window starts when the budget forced older messages out (the window moves in steps, not per turn)."""

    conversation = models.OneToOneField(
        Conversation, on_delete=models.CASCADE, primary_key=True, related_name="context_state"
    )
    agent_profile = models.ForeignKey(AgentProfile, on_delete=models.SET_NULL, null=True, blank=True)
    window_start_seq = models.PositiveBigIntegerField(
        default=0, help_text="History at or before this seq is left out of the prompt (never deleted)."
    )
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"context of {self.conversation_id}"
