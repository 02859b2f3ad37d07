"""Validation of a message's multimodal `parts` and the text they contribute to token counts."""

import json
import re
from collections.abc import Iterator
from typing import Any

from rest_framework.exceptions import ErrorDetail, ValidationError

IMAGE_ID_RE = re.compile(r"^img_[0-9a-zA-Z]{6,64}$")
IMAGE_DETAILS = ("auto", "low", "high")

# type -> (required fields with their types, optional fields with their types)
_SCHEMAS: dict[str, tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]] = {
    "text": ({"text": (str,)}, {}),
    # Exactly one source: image_id (a stored image), data (base64, with media_type) or upload (a multipart
    # file field). duplicate_of and compacted are written by the server (and kept by transcripts).
    "image": (
        {},
        {
            "image_id": (str,),
            "data": (str,),
            "media_type": (str,),
            "upload": (str,),
            "detail": (str,),
            "role": (str,),
            "description": (str,),
            "duplicate_of": (str,),
            "compacted": (bool,),
        },
    ),
    "tool_call": ({"id": (str,), "name": (str,), "arguments": (str, dict)}, {}),
    "tool_result": ({"tool_call_id": (str,), "content": (str, list)}, {"is_error": (bool,), "name": (str,)}),
}
PART_TYPES = tuple(_SCHEMAS)


def _fail(index: int, message: str) -> ValidationError:
    return ValidationError({"parts": {str(index): [ErrorDetail(message, code="invalid_parts")]}})


def parts_validate(parts: Any) -> list[dict[str, Any]]:
    """The parts list as stored, or a ValidationError with code invalid_parts naming the bad part."""
    if not isinstance(parts, list):
        raise ValidationError({"parts": [ErrorDetail("Must be a list of parts.", code="invalid_parts")]})
    clean: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        if not isinstance(part, dict):
            raise _fail(index, "Each part must be an object.")
        part_type = part.get("type")
        if not isinstance(part_type, str) or part_type not in _SCHEMAS:  # {"type": {}} is not hashable
            raise _fail(index, f"Unknown part type {part_type!r}; expected one of {', '.join(PART_TYPES)}.")
        required, optional = _SCHEMAS[part_type]
        unknown = set(part) - set(required) - set(optional) - {"type"}
        if unknown:
            raise _fail(index, f"Unknown field(s) for a {part_type} part: {', '.join(sorted(unknown))}.")
        for name, types in required.items():
            if name not in part:
                raise _fail(index, f"A {part_type} part needs {name!r}.")
            if not isinstance(part[name], types):
                raise _fail(index, f"{name!r} of a {part_type} part has the wrong type.")
        for name, types in optional.items():
            if name in part and not isinstance(part[name], types):
                raise _fail(index, f"{name!r} of a {part_type} part has the wrong type.")
        if part_type == "image":
            _check_image_part(part, index)
        if part_type == "tool_result" and isinstance(part["content"], list):
            part = {**part, "content": parts_validate(part["content"])}
        clean.append(part)
    return clean


IMAGE_SOURCES = ("image_id", "data", "upload")
IMAGE_PART_ROLES = ("error",)


def _check_image_part(part: dict[str, Any], index: int) -> None:
    sources = [name for name in IMAGE_SOURCES if name in part]
    if len(sources) != 1:
        raise _fail(index, "An image part needs exactly one of image_id, data (base64) or upload.")
    if "image_id" in part and not IMAGE_ID_RE.match(part["image_id"]):
        raise _fail(index, "image_id must look like img_<letters and digits>.")
    if "duplicate_of" in part and not IMAGE_ID_RE.match(part["duplicate_of"]):
        raise _fail(index, "duplicate_of must look like img_<letters and digits>.")
    if ("duplicate_of" in part or "compacted" in part) and "image_id" not in part:
        raise _fail(index, "duplicate_of and compacted describe a stored image (image_id).")
    if "media_type" in part and "data" not in part:
        raise _fail(index, "media_type goes with data.")
    if part.get("detail", "auto") not in IMAGE_DETAILS:
        raise _fail(index, f"detail must be one of {', '.join(IMAGE_DETAILS)}.")
    if "role" in part and part["role"] not in IMAGE_PART_ROLES:
        raise _fail(index, "role of an image part can only be 'error' (marks an error frame).")


PLACEHOLDER = "[Visual_Placeholder: {image_id}]"
UNCHANGED = "screen unchanged since {image_id}"
UNAVAILABLE = "[Image unavailable: {image_id}]"


def image_line(part: dict[str, Any]) -> str | None:
    """The one line a stored image part stands as when the model does not get its pixels: a duplicate of
    the previous screen, or an image compacted away. None when its pixels are shown."""
    if part.get("duplicate_of"):
        return UNCHANGED.format(image_id=part["duplicate_of"])
    if part.get("compacted"):
        return PLACEHOLDER.format(image_id=part["image_id"])
    return None


def iter_image_parts(parts: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Image parts in order, including those inside a tool result's content."""
    for part in parts:
        if part.get("type") == "image":
            yield part
        elif part.get("type") == "tool_result" and isinstance(part.get("content"), list):
            yield from iter_image_parts(part["content"])


def parts_text(parts: list[dict[str, Any]]) -> str:
    """The text of text parts, joined: what a message's `content` is when the client sent only parts."""
    return "\n".join(p["text"] for p in parts if p.get("type") == "text")


def parts_token_text(parts: list[dict[str, Any]]) -> str:
    """Text the model sees from tool calls and tool results, for token counting. Text parts are not
    included (they are the message content); image tokens are counted by the image rules."""
    chunks: list[str] = []
    for part in parts:
        if part["type"] == "tool_call":
            arguments = part["arguments"]
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
            chunks.append(f"{part['name']}({arguments})")
        elif part["type"] == "tool_result":
            content = part["content"]
            chunks.append(content if isinstance(content, str) else parts_text(content))
    return "\n".join(chunks)
