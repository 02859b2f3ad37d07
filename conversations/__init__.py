"""Conversations, turns and messages: the raw transcript, its export/import and its WebSocket events."""
