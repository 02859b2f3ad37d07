"""The OpenAI-compatible test server (tests/llm_server.py) as fixtures for this folder."""

from tests.llm_server import llm_server, llm_settings  # noqa: F401
