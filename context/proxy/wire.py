"""The two wire formats a client speaks to the proxy, read into one request: the client's own system text,
its messages as Mnemo message items (role, content, parts), and the options passed upstream unchanged."""

import re
from dataclasses import dataclass, field
from typing import Any

from context.proxy.errors import ProxyError
from conversations.services import message_name_check

OPENAI = "openai"
ANTHROPIC = "anthropic"
# Body fields the proxy consumes itself; every other field goes upstream as the client sent it.
_OWN_FIELDS = {
    OPENAI: {"model", "messages", "stream", "stream_options"},
    ANTHROPIC: {"model", "messages", "system", "stream"},
}
_DATA_URL = re.compile(r"^data:(?P<media>[\w/+.-]+);base64,(?P<data>.+)$", re.S)


@dataclass
class ProxyRequest:
    fmt: str
    model: str
    system: str
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    end_user: str | None = None


def _invalid(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(message, code="invalid_request", status=400, param=param)


def _unsupported(message: str, param: str | None = None) -> ProxyError:
    """A well-formed request asking for what the proxy does not do (the SDK's field is valid upstream)."""
    return ProxyError(message, code="unsupported", status=400, param=param)


_NO_FETCH = (
    "image URLs are not fetched (Mnemo stores an image's bytes as it arrives and does not call URLs a client "
    "names); send the image inline as base64"
)


def _item(
    role: str, content: str, parts: list[dict[str, Any]] | None = None, name: str = ""
) -> dict[str, Any]:
    item: dict[str, Any] = {"role": role, "content": content, "parts": parts or []}
    if name:
        item["name"] = name
    return item


def _common(body: Any, fmt: str) -> tuple[str, list[Any]]:
    if not isinstance(body, dict):
        raise _invalid("The request body must be a JSON object.")
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model.strip():
        raise _invalid("model is required.", "model")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages must be a non-empty list.", "messages")
    if not isinstance(body.get("stream", False), bool):
        raise _invalid("stream must be true or false.", "stream")
    return model.strip(), messages


# --- OpenAI Chat Completions --------------------------------------------------------------------------------


def _openai_image(part: dict[str, Any], where: str) -> dict[str, Any]:
    image_url = part.get("image_url")
    if not isinstance(image_url, dict):
        image_url = {}
    url = image_url.get("url", "")
    match = _DATA_URL.match(url) if isinstance(url, str) else None
    if match is None and isinstance(url, str) and url.lower().startswith(("http://", "https://")):
        raise _unsupported(f"{where}: {_NO_FETCH}, as a data: URL (data:image/png;base64,…).", where)
    if match is None:
        raise _invalid(f"{where}: an image_url must be a data: URL with base64 data.", where)
    image = {"type": "image", "data": match["data"], "media_type": match["media"]}
    detail = image_url.get("detail")
    if detail in ("auto", "low", "high"):
        image["detail"] = detail
    return image


def _openai_content(content: Any, where: str) -> tuple[str, list[dict[str, Any]]]:
    """(text, image parts) of a content field: a string, null, or a list of text / image_url parts."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise _invalid(f"{where}: content must be a string or a list of parts.", where)
    texts, images = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            images.append(_openai_image(part, where))
        else:
            raise _invalid(f"{where}: unsupported content part {kind!r}.", where)
    return "\n".join(texts), images


def _openai_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _invalid(f"{where}: tool_calls must be a list.", where)
    parts = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise _invalid(f"{where}: each tool call needs an id and a function.", where)
        arguments = function.get("arguments", "")
        parts.append(
            {
                "type": "tool_call",
                "id": call["id"],
                "name": str(function.get("name") or ""),
                "arguments": arguments if isinstance(arguments, str | dict) else str(arguments),
            }
        )
    return parts


def _openai_name(message: dict[str, Any], where: str) -> str:
    """The speaker a user or assistant message names (OpenAI's `name`), held to what the REST API takes."""
    try:
        return message_name_check(message.get("name"))
    except ValueError as exc:
        raise ProxyError(
            f"{where}.name {exc}", code="invalid_name", status=400, param=f"{where}.name"
        ) from None


def _openai_message(message: Any, index: int) -> tuple[str | None, dict[str, Any] | None]:
    """(system text, None) for a system or developer message, else (None, the Mnemo item). A system
    message's name goes nowhere: its text joins the client's system text, which is no one's turn."""
    where = f"messages.{index}"
    if not isinstance(message, dict):
        raise _invalid(f"{where} must be an object.", where)
    role = message.get("role")
    text, images = _openai_content(message.get("content"), where)
    if role in ("system", "developer"):
        return text, None
    if role == "user":
        return None, _item("user", text, images, _openai_name(message, where))
    if role == "assistant":
        calls = _openai_tool_calls(message["tool_calls"], where) if message.get("tool_calls") else []
        return None, _item("assistant", text, calls, _openai_name(message, where))
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise _invalid(f"{where}: a tool message needs tool_call_id.", where)
        return None, _item("tool", "", [{"type": "tool_result", "tool_call_id": call_id, "content": text}])
    raise _invalid(f"{where}: unsupported role {role!r}.", where)


def _check_choices(body: dict[str, Any]) -> None:
    """One choice only: a conversation stores one reply per turn, and a client that picked another of n
    choices and sent it back would give the stored history two different replies to the same turn."""
    n = body.get("n")
    if n is None:
        return
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise _invalid("n must be a positive integer.", "n")
    if n > 1:
        raise _unsupported(
            "n > 1 is not supported: a Mnemo conversation keeps one reply per turn. Send n=1 (or leave "
            "it out); for several candidates, call the model directly.",
            "n",
        )


def openai_request(body: Any, *, header_user: str | None) -> ProxyRequest:
    model, raw = _common(body, OPENAI)
    _check_choices(body)
    system, messages = [], []
    for index, message in enumerate(raw):
        text, item = _openai_message(message, index)
        if item is None:
            system.append(text or "")
        else:
            messages.append(item)
    stream_options = body.get("stream_options") or {}
    user = body.get("user")
    return ProxyRequest(
        fmt=OPENAI,
        model=model,
        system="\n\n".join(s for s in system if s),
        messages=messages,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
        options={k: v for k, v in body.items() if k not in _OWN_FIELDS[OPENAI]},
        end_user=header_user or (user if isinstance(user, str) and user else None),
    )


# --- Anthropic Messages -------------------------------------------------------------------------------------


def _anthropic_image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        source = {}
    if source.get("type") == "url":
        raise _unsupported(f"{where}: {_NO_FETCH}, as a base64 source.", where)
    if source.get("type") != "base64" or not isinstance(source.get("data"), str):
        raise _invalid(f"{where}: an image source must be base64 with its data.", where)
    return {"type": "image", "data": source["data"], "media_type": str(source.get("media_type") or "")}


def _anthropic_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content", "")
    if isinstance(content, list):
        inner: list[dict[str, Any]] = []
        for sub in content:
            if isinstance(sub, dict) and sub.get("type") == "text":
                inner.append({"type": "text", "text": str(sub.get("text", ""))})
            elif isinstance(sub, dict) and sub.get("type") == "image":
                inner.append(_anthropic_image(sub, where))
        content = inner
    elif not isinstance(content, str):
        content = str(content)
    part = {"type": "tool_result", "tool_call_id": str(block.get("tool_use_id", "")), "content": content}
    if block.get("is_error") is True:
        part["is_error"] = True
    return part


def _anthropic_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _invalid(f"{where}: content must be a string or a list of blocks.", where)
    return [b for b in content if isinstance(b, dict)]


def _anthropic_message(message: Any, index: int) -> list[dict[str, Any]]:
    """One Anthropic message as Mnemo items: tool results in a user turn become a tool message (ahead of
    any text in the same turn)."""
    where = f"messages.{index}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise _invalid(f"{where}: role must be user or assistant.", where)
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in _anthropic_blocks(message.get("content"), where):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "image":
            parts.append(_anthropic_image(block, where))
        elif kind == "tool_use" and message["role"] == "assistant":
            arguments = block.get("input") if isinstance(block.get("input"), dict) else {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": str(block.get("id", "")),
                    "name": str(block.get("name", "")),
                    "arguments": arguments,
                }
            )
        elif kind == "tool_result" and message["role"] == "user":
            results.append(_anthropic_result(block, where))
        else:
            raise _invalid(f"{where}: unsupported content block {kind!r}.", where)
    items = [_item("tool", "", results)] if results else []
    if texts or parts or not results:
        items.append(_item(message["role"], "\n".join(texts), parts))
    return items


def _anthropic_system(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list):
        return "\n\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    raise _invalid("system must be a string or a list of text blocks.", "system")


def anthropic_request(body: Any, *, header_user: str | None) -> ProxyRequest:
    model, raw = _common(body, ANTHROPIC)
    if not isinstance(body.get("max_tokens"), int):
        raise _invalid("max_tokens is required.", "max_tokens")
    messages = [item for index, message in enumerate(raw) for item in _anthropic_message(message, index)]
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    user = metadata.get("user_id")
    return ProxyRequest(
        fmt=ANTHROPIC,
        model=model,
        system=_anthropic_system(body.get("system")),
        messages=messages,
        stream=bool(body.get("stream", False)),
        include_usage=True,
        options={k: v for k, v in body.items() if k not in _OWN_FIELDS[ANTHROPIC]},
        end_user=header_user or (user if isinstance(user, str) and user else None),
    )
