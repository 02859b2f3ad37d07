"""The server's side of providers/lanes.py. A context call (FOREGROUND_PATH) runs in the foreground lane
and, under config.asgi, on threads of its own; every other request through Django's middleware runs in the
background lane: it steps aside before it starts and before each database statement it sends outside a
transaction while a foreground call runs in this process. The chat proxy's preparation, which is not served
through this middleware, declares itself (context.proxy.views)."""

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponseBase

from providers.lanes import background, foreground, step_aside

# The context call (context.apis.ContextApi): what an agent is blocked on before its next model call.
FOREGROUND_PATH = re.compile(r"/api/v1/conversations/[^/]+/context/?")


class LaneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if FOREGROUND_PATH.fullmatch(request.path_info):
            with foreground():
                return self.get_response(request)
        budget = settings.MNEMO_BACKGROUND_YIELD_MS / 1000
        if not budget:
            return self.get_response(request)
        with background(budget), connection.execute_wrapper(_statement_steps_aside):
            step_aside()
            return self.get_response(request)


def _statement_steps_aside(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
) -> Any:
    # Inside a transaction the request may hold a row lock, or SQLite's write lock, that the foreground call
    # is about to need: it finishes the transaction first and steps aside after.
    if not context["connection"].in_atomic_block:
        step_aside()
    return execute(sql, params, many, context)
