"""A small OpenAI-compatible chat-completions server for tests, on 127.0.0.1 with a free port, driven through
the real `openai` package. Each test scripts what the next requests get:

    llm_server.script("500", "good")          # first request 500, second a good reply
    llm_server.reply = "Decisions: use Redis."  # text of good replies
    llm_server.requests                         # JSON bodies received, in order

Behaviours: good, slow (sleeps `slow_seconds`, then good), 500, 429, 401, malformed (200 with a body that
is not JSON), empty (200 JSON without choices), no_usage (good, without a usage object), close (the
connection is closed without an answer). Unscripted requests get `default` (good).

A scripted dict is one reply with tool calls (and optional text), for the memory agent's tool loop:

    llm_server.script(tool_reply(tool_call("core_memory_append", {"label": "profile", "content": "…"})))
    llm_server.script(tool_reply(text="nothing to remember"))      # a reply without tool calls
    tool_call("x", "{not json")                                     # arguments sent verbatim when a str

Streaming and the Anthropic shape (the chat proxy's upstream): a request with `"stream": true` is answered
with server-sent events, the reply split into `stream_pieces` chunks; a POST to /v1/messages gets Anthropic's
Messages shape (JSON or its event stream). `pause` (after `pause_after` chunks, wait for `release` to be set,
then go on) and `cut` (after `pause_after` chunks, close the connection) act on streams. 429 answers carry
`retry-after: 7`; `cached_tokens` is reported as the provider reports cache reads."""

import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_call_ids = itertools.count(1)


def tool_call(name: str, arguments: dict[str, Any] | str, *, call_id: str | None = None) -> dict[str, Any]:
    """One function call as an OpenAI chat completion carries it (arguments JSON-encoded unless a str)."""
    return {
        "id": call_id or f"call_{next(_call_ids)}",
        "type": "function",
        "function": {
            "name": name,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def tool_reply(*calls: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    """A scripted reply: the assistant message with these tool calls (none: a plain text reply)."""
    return {"content": text, "tool_calls": list(calls)}


def client_config(server: "LLMServer", *, timeout: float = 1.0, retries: int = 2) -> Any:
    """An LLMConfig pointing the real client at this server, with short timeouts and backoff."""
    from providers.llm import LLMConfig

    return LLMConfig(
        base_url=server.base_url,
        api_key="k",
        model="test-model",
        timeout=timeout,
        max_retries=retries,
        backoff=0.01,
    )


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # socketserver's 5 refuses connections when 50 streams open at once


class LLMServer:
    def __init__(self) -> None:
        self.queue: deque[str | dict[str, Any]] = deque()
        self.default = "good"
        self.reply = "Summary: the user asked for a report."
        self.slow_seconds = 2.0
        self.prompt_tokens = 120
        self.completion_tokens = 30
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.cached_tokens = 0
        self.stream_pieces = 4
        self.pause_after = 3
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.requests.append(
                        {
                            "path": self.path,
                            "body": body,
                            "auth": self.headers.get("Authorization"),
                            "x_api_key": self.headers.get("x-api-key"),
                        }
                    )
                    behaviour = server.queue.popleft() if server.queue else server.default
                server.respond(self, behaviour, body)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *behaviours: str | dict[str, Any]) -> None:
        with self.lock:
            self.queue.extend(behaviours)

    def _completion(
        self, body: dict[str, Any], *, usage: bool = True, message: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        message = message or {"role": "assistant", "content": self.reply}
        out: dict[str, Any] = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body.get("model", "test-model"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
        }
        if usage:
            out["usage"] = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            }
            if self.cached_tokens:
                out["usage"]["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return out

    def respond(
        self, handler: BaseHTTPRequestHandler, behaviour: str | dict[str, Any], body: dict[str, Any]
    ) -> None:
        status, payload, content_type = 200, b"", "application/json"
        anthropic = handler.path.rstrip("/").endswith("/messages")
        streamed = body.get("stream") is True and behaviour in ("good", "slow", "pause", "cut")
        if (streamed or isinstance(behaviour, dict)) and body.get("stream") is True:
            self.stream(handler, behaviour, body, anthropic=anthropic)
            return
        if anthropic and behaviour in ("good", "slow"):
            if behaviour == "slow":
                time.sleep(self.slow_seconds)
            behaviour = {"anthropic": self._anthropic_message(body)}
        if isinstance(behaviour, dict) and "anthropic" in behaviour:
            payload = json.dumps(behaviour["anthropic"]).encode()
            behaviour = "scripted"
        elif isinstance(behaviour, dict):
            message = {"role": "assistant", "content": behaviour.get("content")}
            if behaviour.get("tool_calls"):
                message["tool_calls"] = behaviour["tool_calls"]
            payload = json.dumps(self._completion(body, message=message)).encode()
            behaviour = "scripted"  # the payload is ready
        if behaviour == "close":
            handler.close_connection = True
            try:
                handler.wfile.flush()
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if behaviour == "slow":
            time.sleep(self.slow_seconds)
            behaviour = "good"
        if behaviour == "scripted":
            pass
        elif behaviour == "good":
            payload = json.dumps(self._completion(body)).encode()
        elif behaviour == "no_usage":
            payload = json.dumps(self._completion(body, usage=False)).encode()
        elif behaviour in ("500", "429", "401"):
            status = int(behaviour)
            payload = json.dumps({"error": {"message": f"scripted {behaviour}", "type": "test"}}).encode()
        elif behaviour == "malformed":
            payload = b'{"id": "chatcmpl-test", "choices": [ this is not json'
        elif behaviour == "empty":
            payload = json.dumps({"id": "chatcmpl-test", "object": "chat.completion", "choices": []}).encode()
        else:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(payload)))
            if status == 429:
                handler.send_header("retry-after", "7")
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    # --- streams and the Anthropic shape ------------------------------------------------------------------

    def _usage(self, anthropic: bool) -> dict[str, Any]:
        if anthropic:
            return {
                "input_tokens": self.prompt_tokens - self.cached_tokens,
                "output_tokens": self.completion_tokens,
                "cache_read_input_tokens": self.cached_tokens,
                "cache_creation_input_tokens": 0,
            }
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _anthropic_message(self, body: dict[str, Any], calls: list[dict[str, Any]] | None = None) -> dict:
        content: list[dict[str, Any]] = [{"type": "text", "text": self.reply}] if self.reply else []
        for call in calls or []:
            content.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"]),
                }
            )
        return {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "test-model"),
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": self._usage(anthropic=True),
        }

    def pieces(self) -> list[str]:
        """The reply in `stream_pieces` chunks (joined, they are the reply)."""
        size = max(1, -(-len(self.reply) // self.stream_pieces))
        return [self.reply[i : i + size] for i in range(0, len(self.reply), size)]

    def _openai_events(self, body: dict[str, Any], calls: list[dict[str, Any]]) -> list[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps(
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion.chunk",
                    "created": 1700000000,
                    "model": body.get("model", "test-model"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in self.pieces()]
        for index, call in enumerate(calls):
            head = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            events.append(chunk({"tool_calls": [head]}))
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {"index": index, "function": {"arguments": call["function"]["arguments"]}}
                        ]
                    }
                )
            )
        events.append(chunk({}, "tool_calls" if calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                json.dumps(
                    {
                        "id": "chatcmpl-test",
                        "object": "chat.completion.chunk",
                        "created": 1700000000,
                        "model": body.get("model", "test-model"),
                        "choices": [],
                        "usage": self._usage(anthropic=False),
                    }
                )
            )
        return [f"data: {e}\n\n" for e in [*events, "[DONE]"]]

    def _anthropic_events(self, body: dict[str, Any], calls: list[dict[str, Any]]) -> list[str]:
        message = self._anthropic_message(body, calls)
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**message["usage"], "output_tokens": 1},
        }
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
        if self.reply:
            events.append(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            )
            events += [
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                for piece in self.pieces()
            ]
            events.append({"type": "content_block_stop", "index": 0})
        for block in message["content"]:
            if block["type"] != "tool_use":
                continue
            index = len([e for e in events if e["type"] == "content_block_start"])
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                }
            )
            events.append({"type": "content_block_stop", "index": index})
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": self.completion_tokens},
            }
        )
        events.append({"type": "message_stop"})
        return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]

    def stream(
        self, handler: BaseHTTPRequestHandler, behaviour: str | dict[str, Any], body: dict, *, anthropic: bool
    ) -> None:
        """A reply as server-sent events (HTTP/1.0: the stream ends when the connection closes)."""
        calls = behaviour.get("tool_calls", []) if isinstance(behaviour, dict) else []
        saved = self.reply
        if isinstance(behaviour, dict):
            self.reply = behaviour.get("content") or ""
        try:
            events = self._anthropic_events(body, calls) if anthropic else self._openai_events(body, calls)
        finally:
            self.reply = saved
        if behaviour == "slow":
            time.sleep(self.slow_seconds)
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.end_headers()
            for sent, event in enumerate(events):
                if behaviour in ("pause", "cut") and sent == self.pause_after:
                    if behaviour == "cut":
                        handler.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.release.wait(timeout=30)
                handler.wfile.write(event.encode())
                handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the proxy went away (a disconnect test)

    def start(self) -> "LLMServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def llm_server() -> Iterator[LLMServer]:
    server = LLMServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def llm_settings(settings, llm_server):
    """Mnemo pointed at the test server, with fast timeouts and backoff."""
    from providers.llm import _client

    settings.LLM_BASE_URL = llm_server.base_url
    settings.LLM_API_KEY = "test-key"
    settings.LLM_MODEL = "test-model"
    settings.LLM_TIMEOUT_SECONDS = 1
    settings.LLM_MAX_RETRIES = 2
    settings.LLM_RETRY_BACKOFF_SECONDS = 0.01
    settings.MNEMO_COMPACTION_SYNC_TIMEOUT_SECONDS = 1
    _client.cache_clear()
    yield settings
    _client.cache_clear()
