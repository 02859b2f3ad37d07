"""Signals conversations owns so that higher apps can react without this app importing them."""

from django.dispatch import Signal

# Sent inside the append transaction for an assistant message that arrived with the provider's usage
# object; receivers may raise ApplicationError to refuse the whole append.
# kwargs: conversation, message, usage (dict as the provider returned it)
assistant_usage_reported = Signal()

# Sent inside the write transaction when a completed assistant message closes an exchange (appended
# completed, or a cut-off reply marked completed). kwargs: conversation
exchange_completed = Signal()

# Sent after a background run wrote retrieval vectors for a conversation's messages (committed).
# kwargs: conversation_id, message_ids (the messages whose vectors were written)
vectors_written = Signal()

# Sent after a transcript import committed (a new conversation, possibly with compaction records but none of
# the rows higher apps make from them). kwargs: conversation_id
transcript_imported = Signal()
