"""What follows every write of new messages, whichever path wrote them: the memory agent's trigger when an
exchange completed, the sockets' message.appended events, and the request for their retrieval vectors."""

import logging

from django.db import transaction

from conversations.events import event_publish
from conversations.models import Conversation, Message
from conversations.serializers import MessageOutputSerializer
from conversations.signals import exchange_completed
from conversations.tasks import message_vectors_request

logger = logging.getLogger(__name__)


def messages_announce(conversation: Conversation, created: list[Message], *, committed: bool = False) -> None:
    """After new messages are written: the memory agent's trigger and the sockets' events (both leave when
    the transaction commits). Once the write is committed a failing receiver is logged, not raised: the
    stored append must not answer 500 (the next completed exchange triggers the memory agent again)."""
    if any(m.role == Message.Role.ASSISTANT and m.completed for m in created):
        if committed:
            exchange_completed_send_robust(conversation)
        else:
            exchange_completed.send(sender=Message, conversation=conversation)
    messages_publish(conversation, created)
    transaction.on_commit(lambda: message_vectors_request(conversation_id=conversation.pk), robust=True)


def exchange_completed_send_robust(conversation: Conversation) -> None:
    """Tell exchange_completed's receivers, logging (not raising) what one of them raises."""
    for receiver, error in exchange_completed.send_robust(sender=Message, conversation=conversation):
        if isinstance(error, Exception):
            logger.error("exchange_completed receiver %r failed", receiver, exc_info=error)


def messages_publish(conversation: Conversation, messages: list[Message]) -> None:
    for message in messages:
        event_publish(
            tenant_id=conversation.tenant_id,
            conversation_id=conversation.pk,
            event="message.appended",
            data=MessageOutputSerializer(message).data,
        )
