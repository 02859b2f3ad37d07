"""Schemathesis hooks for make schema-check: transcript import bodies are JSON Lines, sent as text."""

import schemathesis

schemathesis.serializer.alias("application/x-ndjson", "text/plain")
