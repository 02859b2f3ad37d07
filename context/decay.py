"""The decay stage: attachments into the current message by priority, under the budget. What the request
sends is P0; the stored ones (knowledge.attachments) come with their own priority. Each item starts at the
level its priority gives (P0 content, P1 description, P2 summary, P3 name) and, when they do not fit their
share of the budget, the lowest-value item (lowest priority, then oldest) steps down first: a long content
is cut to what fits, then description → summary → name, and P2/P3 items are dropped at last. Every item
that was shortened is listed in `dropped`; images described offline are reported as a degradation."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from context.budget import SEPARATOR_TOKENS
from context.dropped import DecayedAttachment, Dropped, DroppedCount
from context.history import window_keep_from
from conversations.parts import iter_image_parts
from knowledge.attachments import (
    LEVELS,
    PRIORITIES,
    START_LEVEL,
    Attachment,
    AttachmentQuery,
    conversation_attachments,
)
from knowledge.tasks import image_descriptions_request
from knowledge.vision import vision_status
from prefix_cache.accounting import count_cached
from prefix_cache.provenance import (
    AttachmentSource,
    ImageDescriptionSource,
    ItemSource,
    StoredAttachmentSource,
)
from prefix_cache.rendering import Item
from providers.tokens import truncate_text

if TYPE_CHECKING:
    from context.state import ContextState

# A P0 content cut shorter than this is not worth it: the item falls back to its description.
MIN_CONTENT_TOKENS = 64
CUT_MARKER = "\n[… shortened here to fit the token budget]"


@dataclass
class Entry:
    """One attachment on its way into the prompt: its texts by level and the level it stands at."""

    priority: str
    order: tuple[Any, ...]
    texts: dict[str, str]
    source: AttachmentSource
    start: str
    level: str | None = None  # None: dropped
    cut: bool = False
    tokens: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.level = self.start

    def floor(self) -> str | None:
        """P0 and P1 keep at least their name (the user is pointing at them); P2 and P3 may go."""
        return "name" if self.priority in ("P0", "P1") else None

    def lower(self) -> str | None:
        """The next level down that this entry has text for (None: dropped)."""
        assert self.level is not None
        for level in LEVELS[LEVELS.index(self.level) + 1 :]:
            if level in self.texts:
                return level
        return None


def attachments_decay(state: ContextState) -> None:
    """The decay stage (context/pipeline.py)."""
    allowance = state.shares.attachments_allowance(state.layout, has_hits=bool(state.candidates))
    shown = _shown_image_ids(state)
    entries = _entries(state, content_tokens=allowance, shown=shown)
    _fit(entries, allowance=allowance, model=state.model, dropped=state.dropped)
    kept = sorted((e for e in entries if e.level is not None), key=lambda e: e.order)
    # A retrieved image (knowledge.retrieval) the prompt already shows, or describes here, is not repeated.
    described = {
        e.source.id
        for e in kept
        if e.level in ("content", "description") and isinstance(e.source, StoredAttachmentSource)
    }
    state.candidates = [c for c in state.candidates if not _shown_already(c.source, shown | described)]
    state.layout.attachments = [
        Item(
            text=e.texts[e.level],
            tokens=_tokens(e, state.model),
            source=dataclasses.replace(e.source, level=e.level),
        )
        for e in kept
        if e.level is not None
    ]


def _shown_already(source: ItemSource, images: set[str]) -> bool:
    return isinstance(source, ImageDescriptionSource) and source.image in images


# --- the entries ------------------------------------------------------------------------------------------


def _request_entry(index: int, attachment: dict[str, Any]) -> Entry:
    """An attachment sent with the request: P0, its content as sent."""
    name, description = attachment["name"], attachment.get("description") or ""
    head = [f"- {name}"] + ([f"  {description}"] if description else [])
    texts = {"name": f"- {name}", "description": "\n".join(head)}
    texts["summary"] = texts["description"]
    if attachment.get("content"):
        texts["content"] = "\n".join([*head, attachment["content"]])
    start = "content" if "content" in texts else "description"
    return Entry("P0", (0, -1.0, index), texts, AttachmentSource(name=name, priority="P0"), start)


def _entries(state: ContextState, *, content_tokens: int, shown: set[str]) -> list[Entry]:
    sent = state.request.attachments
    # A name sent alone re-attaches a stored attachment (P1, its stored description); sent with content or
    # a description it is this turn's own, and a stored one of the same name is not listed twice.
    bare = {a["name"].lower() for a in sent if not a.get("content") and not a.get("description")}
    full = {a["name"].lower() for a in sent} - bare
    found = conversation_attachments(
        AttachmentQuery(
            conversation=state.conversation,
            user_message=state.layout.user_message,
            model=state.model,
            current_message_id=state.request.user_message_id,
            history_until=state.history_until,
            shown_image_ids=frozenset(shown),
            reattached=frozenset(bare),
            content_tokens=max(0, content_tokens),
        )
    )
    stored = [a for a in found.attachments if a.name.lower() not in full]
    matched = {a.name.lower() for a in stored if a.name.lower() in bare}
    entries = [_request_entry(i, a) for i, a in enumerate(sent) if a["name"].lower() not in matched]
    for attachment in stored:
        source = StoredAttachmentSource(
            name=attachment.name,
            priority=attachment.priority,
            attachment=attachment.kind,
            id=attachment.id,
            reason=attachment.reason,
            described=attachment.described if attachment.kind == "image" else None,
        )
        start = START_LEVEL[attachment.priority]
        if start not in attachment.texts:  # a P0 document not yet readable: its description
            start = next(level for level in LEVELS if level in attachment.texts)
        entries.append(Entry(attachment.priority, attachment.order, attachment.texts, source, start))
    if found.not_considered:
        state.dropped.append(
            DroppedCount(block="attachments", reason="limit", tokens=0, items=found.not_considered)
        )
    _describe_images(state, [a for a in stored if a.kind == "image"])
    return entries


def _shown_image_ids(state: ContextState) -> set[str]:
    """Images whose pixels the history will show (not duplicates, not compacted to a placeholder), in the
    messages the budget stage will keep: all of B6 when it fits its allowance, else (as the window cut does)
    the newest exchange and what fits the share of the allowance a cut keeps."""
    messages = state.layout.history
    if sum(m.token_count for m in messages) > state.shares.history_allowance:
        keep_from, _ = window_keep_from(
            messages, target=state.shares.window_target, protected_from_seq=state.protected_from_seq
        )
        messages = messages[keep_from:]
    shown = set()
    for message in messages:
        for part in iter_image_parts(message.parts):
            if "image_id" in part and not part.get("duplicate_of") and not part.get("compacted"):
                shown.add(part["image_id"])
    return shown


def _describe_images(state: ContextState, images: list[Attachment]) -> None:
    """Images described offline are reported; with a vision model, those not described yet are queued
    (those whose bytes retention deleted cannot be described any more)."""
    offline = [a for a in images if a.described == "offline"]
    if not offline:
        return
    status = vision_status(state.conversation.tenant)
    gone = [a for a in offline if a.image is None or a.image.purged_at is not None or not a.image.storage_key]
    waiting = [a for a in offline if a not in gone] if status.config is not None else []
    if len(waiting) < len(offline):
        reason = status.reason or "their bytes were deleted by retention"
        state.degrade(
            "decay",
            "image_description_offline",
            f"{len(offline) - len(waiting)} image(s) described by id, format, size and role only: {reason}.",
        )
    if not waiting:
        return
    state.writes.append(
        functools.partial(
            image_descriptions_request,
            tenant=state.conversation.tenant,
            images=[a.image for a in waiting if a.image is not None],
        )
    )
    assert status.config is not None
    state.degrade(
        "decay",
        "image_description_pending",
        f"{len(waiting)} image(s) not described by {status.config.model} yet (queued); described by id, "
        "format, size and role meanwhile.",
    )


# --- fitting ----------------------------------------------------------------------------------------------


def _tokens(entry: Entry, model: str) -> int:
    assert entry.level is not None
    text = entry.texts[entry.level]
    if text not in entry.tokens:
        entry.tokens[text] = count_cached(text, model=model)
    return entry.tokens[text]


def _total(entries: list[Entry], model: str) -> int:
    return sum(_tokens(e, model) + SEPARATOR_TOKENS for e in entries if e.level is not None)


def _victim(entries: list[Entry]) -> Entry | None:
    """The lowest-value entry that can still give way: lowest priority first, then the oldest."""
    movable = [e for e in entries if e.level is not None and e.level != e.floor()]
    if not movable:
        return None
    return min(movable, key=lambda e: (-PRIORITIES.index(e.priority), e.order))


def _fit(entries: list[Entry], *, allowance: int, model: str, dropped: list[Dropped]) -> None:
    before = {id(e): _tokens(e, model) for e in entries}
    total = _total(entries, model)
    while total > allowance:
        victim = _victim(entries)
        if victim is None:
            break
        if victim.level == "content" and not victim.cut:
            _cut_content(victim, room=allowance - (total - _tokens(victim, model)), model=model)
        else:
            victim.level = victim.lower()
        total = _total(entries, model)
    for entry in entries:
        if entry.level == entry.start and not entry.cut:
            continue
        after = _tokens(entry, model) if entry.level is not None else 0
        dropped.append(
            DecayedAttachment(
                block="attachments",
                reason="decay",
                tokens=before[id(entry)] - after,
                source=entry.source,
                from_level=entry.start,
                to_level=entry.level or "dropped",
                shortened=entry.cut,
            )
        )


def _cut_content(entry: Entry, *, room: int, model: str) -> None:
    """Keep the head of the content that fits, or (too little room) step down to the description."""
    keep = room - SEPARATOR_TOKENS - count_cached(CUT_MARKER, model=model)
    if keep < MIN_CONTENT_TOKENS:
        entry.level = entry.lower()
        return
    entry.cut = True
    entry.texts = {
        **entry.texts,
        "content": truncate_text(entry.texts["content"], keep, model=model) + CUT_MARKER,
    }
