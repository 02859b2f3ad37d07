"""Streams through the chat proxy and straight to the upstream: sequential rounds, concurrent streams, and the
pipeline's share of a turn."""

from __future__ import annotations

import asyncio
import random
import re
import time

import httpx

from bench._common import log
from bench._proxy.seed import sentence
from bench._server import HOST
from context.pipeline import context_assemble
from context.state import ContextRequest
from conversations.models import Conversation


def timed_stream(client, url: str, body: dict, headers: dict) -> tuple[float, float, dict[str, float], bool]:
    """(seconds to the first body byte, seconds in all, Server-Timing values, whether the stream ended with
    [DONE])."""
    started = time.perf_counter()
    first = None
    tail = b""
    with client.stream("POST", url, json=body, headers=headers) as response:
        for chunk in response.iter_raw():
            if first is None:
                first = time.perf_counter()
            tail = (tail + chunk)[-64:]
        timing = {
            m[0]: float(m[1])
            for m in re.findall(r"mnemo-(\w+);dur=([\d.]+)", response.headers.get("server-timing", ""))
        }
        ok = response.status_code == 200 and b"[DONE]" in tail
    end = time.perf_counter()
    return (first or end) - started, end - started, timing, ok


def sequential(
    port: int, key: str, conversation: str, upstream, rounds: int, rng: random.Random
) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {
        k: []
        for k in (
            "proxy_total",
            "proxy_first",
            "direct_total",
            "direct_first",
            "append",
            "context",
            "upstream",
        )
    }
    proxy_headers = {"Authorization": f"Bearer {key}", "X-Mnemo-Conversation": conversation}
    with httpx.Client(timeout=60) as client:
        for index in range(rounds + 3):  # three warm-up rounds
            body = {
                "model": "gpt-4o",
                "stream": True,
                "messages": [{"role": "user", "content": sentence(rng, 20)}],
            }
            first, total, timing, ok = timed_stream(
                client, f"http://{HOST}:{port}/v1/chat/completions", body, proxy_headers
            )
            if not ok:
                raise RuntimeError("a proxy stream failed")
            sent = next(r["body"] for r in reversed(upstream.requests) if r["body"].get("stream"))
            d_first, d_total, _, d_ok = timed_stream(
                client, f"{upstream.base_url}/chat/completions", sent, {"Authorization": "Bearer k"}
            )
            if not d_ok:
                raise RuntimeError("a direct stream failed")
            if index < 3:
                continue
            series["proxy_first"].append(first)
            series["proxy_total"].append(total)
            series["direct_first"].append(d_first)
            series["direct_total"].append(d_total)
            series["append"].append(timing.get("append", 0) / 1000)
            series["context"].append(timing.get("context", 0) / 1000)
            series["upstream"].append(timing.get("upstream", 0) / 1000)
    return series


def pipeline(conversation_id: str, rounds: int, rng: random.Random) -> list[float]:
    """The context pipeline alone on the same conversation, in this process (no HTTP, no proxy): what
    POST …/context costs, the baseline for the proxy's context time."""
    conversation = Conversation.objects.select_related("tenant").get(pk=conversation_id)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        context_assemble(
            conversation=conversation,
            request=ContextRequest(user_message=sentence(rng, 20), model="gpt-4o", format="openai"),
        )
        times.append(time.perf_counter() - started)
    return times


async def concurrent(port: int, key: str, streams: int) -> tuple[int, float]:
    async def one(client: httpx.AsyncClient, index: int) -> bool:
        body = {
            "model": "gpt-4o",
            "stream": True,
            "messages": [{"role": "user", "content": f"stream {index}: hello"}],
        }
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                data = b"".join([chunk async for chunk in response.aiter_raw()])
        except httpx.HTTPError as exc:
            log(f"  stream {index}: {type(exc).__name__}: {exc}")
            return False
        if response.status_code == 200 and b"[DONE]" in data:
            return True
        log(f"  stream {index}: HTTP {response.status_code}: {data[-300:]!r}")
        return False

    limits = httpx.Limits(max_connections=streams)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=f"http://{HOST}:{port}", headers=headers, timeout=120, limits=limits
    ) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(one(client, i) for i in range(streams)))
    return results.count(False), time.perf_counter() - started
