"""A server's first proxied call: the `openai` package it calls with is imported off the event loop (which
carries every other request of the process), and a starting server imports it before any request. Each
probe runs in a fresh interpreter, where nothing has imported the package yet."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FIRST_CALL = """
import asyncio, sys, threading
import django
django.setup()
from context.proxy.upstream import Upstream, _openai_send
from tests.llm_server import LLMServer

server = LLMServer().start()
on_loop = set()

def audit(event, args):
    if event == "import" and threading.current_thread() is threading.main_thread():
        on_loop.add(args[0])

async def first_call():
    sys.addaudithook(audit)  # from here on the main thread is the event loop's
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    raw = await _openai_send(Upstream("openai", server.base_url, "k", False), body)
    return raw.status_code

print(asyncio.run(first_call()))
print(sorted(m for m in on_loop if m.split(".")[0] == "openai"))
server.stop()
"""

WARM = """
import sys
import django
django.setup()
from config.startup import _caches_warm
before = "openai.resources.chat" in sys.modules
_caches_warm(0)
print(before, "openai.resources.chat" in sys.modules)
"""


def probe(code: str) -> list[str]:
    env = {"DJANGO_SETTINGS_MODULE": "config.django.test", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_the_first_proxied_call_imports_the_client_package_off_the_event_loop():
    status, imported_on_loop = probe(FIRST_CALL)
    assert status == "200"
    assert imported_on_loop == "[]"


def test_a_starting_server_imports_the_client_package_before_any_request():
    assert probe(WARM) == ["False True"]
