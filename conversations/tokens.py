"""Token counts of messages as the model sees them: text, speaker's name and images (by the model's provider
rule). Below the services and the visual policy, which both count."""

from typing import Any

from cold_storage.models import ArchivedImage
from conversations.parts import UNAVAILABLE, image_line, iter_image_parts, parts_token_text
from providers.images import image_tokens
from providers.tokens import count_message, count_text


def parts_image_tokens(
    parts: list[dict[str, Any]],
    *,
    tenant_id: Any,
    model: str,
    sizes: dict[str, tuple[int, int]] | None = None,
) -> int:
    """Tokens the images of these parts cost: a duplicate or a placeholder costs its line of text, a kept
    image its provider's rule (providers/images.py). Parts not stored yet (data/upload) count nothing here.
    Sizes are read inside the tenant only: another tenant's image counts as unavailable, so a count cannot
    tell whether that image exists or how large it is."""
    stored = [p for p in iter_image_parts(parts) if "image_id" in p]
    if not stored:
        return 0
    sizes = dict(sizes or {})
    missing = {p["image_id"] for p in stored if image_line(p) is None and p["image_id"] not in sizes}
    if missing:
        rows = ArchivedImage.objects.filter(tenant_id=tenant_id, pk__in=missing)
        for image_id, width, height in rows.values_list("pk", "width", "height"):
            sizes[image_id] = (width, height)
    total = 0
    for part in stored:
        line = image_line(part)
        if line is None and part["image_id"] not in sizes:
            line = UNAVAILABLE.format(image_id=part["image_id"])
        if line is not None:
            total += count_text(line, model=model) + 1  # the line break that joins it to the text
        else:
            width, height = sizes[part["image_id"]]
            total += image_tokens(width=width, height=height, model=model, detail=part.get("detail", "auto"))
    return total


def message_text_token_count(
    *, role: str, content: str, parts: list[dict[str, Any]], model: str, name: str = ""
) -> int:
    """Tokens of a message without its images (counted once they are stored)."""
    return count_message(
        role=role, content=content, name=name or None, model=model, extra_text=parts_token_text(parts)
    )


def message_token_count(
    *, role: str, content: str, parts: list[dict[str, Any]], tenant_id: Any, model: str, name: str = ""
) -> int:
    """Tokens of a message as the model sees it, its speaker's name and images included (by the model's
    provider rule; a duplicate or a compacted image costs its one line of text). Images are looked up in the
    tenant only."""
    text = message_text_token_count(role=role, content=content, parts=parts, model=model, name=name)
    return text + parts_image_tokens(parts, tenant_id=tenant_id, model=model)
