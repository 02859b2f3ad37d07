"""The chat proxy: OpenAI- and Anthropic-compatible endpoints under /v1 that keep the conversation in Mnemo,
send the assembled context upstream and stream the reply back (docs/proxy.md)."""
