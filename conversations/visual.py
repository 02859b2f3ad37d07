"""Visual memory on the conversation side: image intake for appended messages, image token counts, and the
visual compaction policy applied when a turn ends. Bytes, hashes and tiers belong to cold_storage.

Compaction keeps the pixels of a turn's first image (anchor), its last (result) and its error frames (an
image marked role=error, or carried by an is_error message or an is_error tool result); every other image of
the turn becomes "[Visual_Placeholder: img_…]" and its bytes move to the cold tier. A kept image that
duplicates an earlier one keeps that original's pixels too, so "screen unchanged since img_…" always names
an image the model can see."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from cold_storage import services as images
from cold_storage.imaging import DecodedImage
from cold_storage.models import ArchivedImage
from cold_storage.selectors import image_previous, images_by_id
from cold_storage.tasks import images_move_to_cold
from conversations.models import Message, Turn
from conversations.parts import iter_image_parts
from conversations.tokens import message_token_count, parts_image_tokens
from tenants.errors import ApplicationError

ERROR_ROLE = "error"

logger = logging.getLogger(__name__)


# --- intake -----------------------------------------------------------------------------------------------


@dataclass
class PendingImage:
    part: dict[str, Any]  # the part inside the message's (copied) parts, rewritten in place when stored
    decoded: DecodedImage | None = None  # None: a reference to a stored image (image_id)
    is_error: bool = False


@dataclass
class MessageImages:
    pending: list[PendingImage] = field(default_factory=list)

    @property
    def has_new(self) -> bool:
        return any(p.decoded is not None for p in self.pending)


def _walk(parts: list[dict[str, Any]], *, in_error_result: bool = False) -> list[tuple[dict[str, Any], bool]]:
    found: list[tuple[dict[str, Any], bool]] = []
    for part in parts:
        if part.get("type") == "image":
            found.append((part, in_error_result))
        elif part.get("type") == "tool_result" and isinstance(part.get("content"), list):
            found += _walk(part["content"], in_error_result=in_error_result or bool(part.get("is_error")))
    return found


def intake_prepare(
    parts: list[dict[str, Any]], *, index: int, is_error: bool, uploads: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], MessageImages]:
    """Validate and hash the new images of one message (outside any lock: decoding is the slow part).
    Returns a copy of the parts whose image parts will be rewritten to their stored form, and what to store.
    Raises ApplicationError 400 (invalid_image, image_format_not_allowed, image_too_large, invalid_parts)."""
    if not any(True for _ in iter_image_parts(parts)):
        return parts, MessageImages()
    parts = copy.deepcopy(parts)
    result = MessageImages()
    for part, in_error_result in _walk(parts):
        if "duplicate_of" in part or "compacted" in part:
            raise ApplicationError(
                f"Message {index}: duplicate_of and compacted are set by the server.",
                code="invalid_parts",
                extra={"index": index},
            )
        error_frame = is_error or in_error_result or part.get("role") == ERROR_ROLE
        pending = PendingImage(part=part, is_error=error_frame)
        try:
            if "data" in part:
                pending.decoded = images.image_decode(data=part["data"], media_type=part.get("media_type"))
            elif "upload" in part:
                upload = (uploads or {}).get(part["upload"])
                if upload is None:
                    raise ApplicationError(
                        f"No uploaded file is named {part['upload']!r}.",
                        code="invalid_image",
                        extra={"reason": "no_such_upload", "upload": part["upload"]},
                    )
                pending.decoded = images.image_decode(data=_read_upload(upload))
        except ApplicationError as exc:
            exc.extra = {**exc.extra, "index": index}
            exc.message = f"Message {index}: {exc.message}"
            exc.args = (exc.message,)
            raise
        result.pending.append(pending)
    return parts, result


def _read_upload(upload: Any) -> bytes:
    limit = settings.MNEMO_IMAGE_MAX_BYTES
    if getattr(upload, "size", 0) > limit:
        raise ApplicationError(
            f"The uploaded image is {upload.size} bytes; the limit is {limit}.",
            code="image_too_large",
            extra={"size_bytes": upload.size, "limit_bytes": limit},
        )
    upload.seek(0)
    return upload.read()


def references_check(*, tenant_id: Any, batch: list[MessageImages]) -> dict[str, ArchivedImage]:
    """Every image_id a client sent must name an image of its own tenant (else 400 invalid_image)."""
    wanted = {p.part["image_id"] for m in batch for p in m.pending if p.decoded is None}
    found = images_by_id(tenant_id=tenant_id, image_ids=wanted)
    for index, message in enumerate(batch):
        for pending in message.pending:
            if pending.decoded is None and pending.part["image_id"] not in found:
                raise ApplicationError(
                    f"Message {index}: no image {pending.part['image_id']} in your tenant.",
                    code="invalid_image",
                    extra={
                        "index": index,
                        "reason": "unknown_image_id",
                        "image_id": pending.part["image_id"],
                    },
                )
    return found


def _stored_part(part: dict[str, Any], image: ArchivedImage) -> dict[str, Any]:
    stored: dict[str, Any] = {"type": "image", "image_id": image.id, "detail": part.get("detail", "auto")}
    for name in ("role", "description"):
        if name in part:
            stored[name] = part[name]
    if image.duplicate_of_id:
        stored["duplicate_of"] = image.duplicate_of_id
    return stored


@dataclass
class IntakeState:
    """Carried across the messages of one append batch, inside its transaction."""

    tenant_id: Any
    conversation_id: Any
    policy: images.ImagePolicy
    blobs: images.BlobWrites = field(default_factory=images.BlobWrites)
    previous: ArchivedImage | None = None
    loaded_previous: bool = False
    stored: list[ArchivedImage] = field(default_factory=list)


def intake_store(*, state: IntakeState, message: Any, message_images: MessageImages, model: str) -> int:
    """Store the message's new images (dedup against the conversation's previous image, which the batch
    advances) and rewrite its image parts to {"type":"image","image_id",…,"duplicate_of"?}. Returns the
    tokens its images add. Runs under the conversation's row lock."""
    sizes: dict[str, tuple[int, int]] = {}
    for position, pending in enumerate(message_images.pending):
        if pending.decoded is None:
            continue
        if not state.loaded_previous:
            state.previous = image_previous(conversation_id=state.conversation_id)
            state.loaded_previous = True
        image = images.image_store(
            tenant_id=state.tenant_id,
            conversation_id=state.conversation_id,
            turn_id=message.turn_id,
            message_id=message.id,
            message_seq=message.seq,
            part_index=position,
            decoded=pending.decoded,
            role=ArchivedImage.Role.ERROR if pending.is_error else ArchivedImage.Role.PROCESS,
            previous=state.previous,
            policy=state.policy,
            blobs=state.blobs,
        )
        state.previous = image
        state.stored.append(image)
        new_part = _stored_part(pending.part, image)
        pending.part.clear()
        pending.part.update(new_part)
        sizes[image.id] = (image.width, image.height)
    return parts_image_tokens(message.parts, tenant_id=state.tenant_id, model=model, sizes=sizes)


def comparable_parts(
    parts: list[dict[str, Any]], *, tenant_id: Any, pending: MessageImages | None = None
) -> Any:
    """Parts with each image reduced to its sha256 and options, so a retried append (same key, same image
    bytes) matches the message it stored even though the stored parts name image ids."""
    decoded = {id(p.part): p.decoded.sha256 for p in (pending.pending if pending else []) if p.decoded}
    ids = {p["image_id"] for p in iter_image_parts(parts) if "image_id" in p}
    own = ArchivedImage.objects.filter(tenant_id=tenant_id, pk__in=ids)
    shas = dict(own.values_list("pk", "sha256")) if ids else {}

    def reduce(items: list[dict[str, Any]]) -> list[Any]:
        out: list[Any] = []
        for part in items:
            if part.get("type") == "image":
                sha = decoded.get(id(part)) or shas.get(part.get("image_id", ""), part.get("image_id"))
                out.append(
                    ("image", sha, part.get("detail", "auto"), part.get("role"), part.get("description"))
                )
            elif part.get("type") == "tool_result" and isinstance(part.get("content"), list):
                out.append({**part, "content": reduce(part["content"])})
            else:
                out.append(part)
        return out

    return reduce(parts)


# --- compaction -------------------------------------------------------------------------------------------


@dataclass
class CompactionResult:
    kept: list[str] = field(default_factory=list)
    compacted: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    tokens_before: int = 0
    tokens_after: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "compacted": self.compacted,
            "duplicates": self.duplicates,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }


_Frame = tuple[Any, dict[str, Any], bool]  # (message, image part, is_error)


def turn_compact(*, turn: Any, model: str, now: Any) -> CompactionResult | None:
    """Apply the visual compaction policy to an ended turn (see the module docstring). Call with the
    conversation row locked; returns None when there is nothing to do (no images, or done already), so
    ending a turn twice, or from two requests at once, compacts it once."""
    if turn.status != Turn.Status.ENDED:
        return None
    frames = _turn_frames(turn)
    if not frames:
        return None
    result = CompactionResult()
    roles, keep = _frame_roles(frames)
    compacted, touched = _frames_compact(
        frames, keep=keep, low_detail=history_image_detail(turn) == "low", result=result
    )
    _messages_recount(touched, tenant_id=turn.conversation.tenant_id, model=model, result=result)

    own = set(ArchivedImage.objects.filter(pk__in=set(roles), turn_id=turn.pk).values_list("pk", flat=True))
    images.images_mark(roles={k: v for k, v in roles.items() if k in own}, compacted=compacted & own, now=now)
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.COMPACTED)
    turn.status = Turn.Status.COMPACTED
    to_move = sorted(compacted & own)
    if to_move:
        transaction.on_commit(lambda: _queue_move(to_move))
    return result


def _turn_frames(turn: Any) -> list[_Frame]:
    """Every stored image part of the turn's messages, in order."""
    messages = (
        Message.objects.filter(turn=turn)
        .order_by("seq")
        .only("id", "seq", "role", "content", "parts", "token_count", "is_error")
    )
    frames: list[_Frame] = []
    for message in messages:
        for part, in_error_result in _walk(message.parts):
            if "image_id" in part:
                error = message.is_error or in_error_result or part.get("role") == ERROR_ROLE
                frames.append((message, part, error))
    return frames


def _frame_roles(frames: list[_Frame]) -> tuple[dict[str, str], set[str]]:
    """(role of each image, the images kept): the first is the anchor, the last the result, errors are
    errors and kept with the anchor and result (and what they duplicate); the rest are process frames."""
    first, last = frames[0][1]["image_id"], frames[-1][1]["image_id"]
    roles: dict[str, str] = {}
    keep: set[str] = set()
    for _, part, error in frames:
        image_id = part["image_id"]
        if error:
            roles[image_id] = ArchivedImage.Role.ERROR
        elif image_id == first:
            roles[image_id] = ArchivedImage.Role.ANCHOR
        elif image_id == last:
            roles[image_id] = ArchivedImage.Role.RESULT
        else:
            roles.setdefault(image_id, ArchivedImage.Role.PROCESS)
        if error or image_id in (first, last):
            keep.add(image_id)
            if part.get("duplicate_of"):
                keep.add(part["duplicate_of"])
    return roles, keep


def _frames_compact(
    frames: list[_Frame], *, keep: set[str], low_detail: bool, result: CompactionResult
) -> tuple[set[str], dict[Any, Any]]:
    """Marks the parts of the frames not kept compacted (and kept ones low detail when that is the
    policy), recording each in `result`. Returns (the images compacted, the messages changed by pk)."""
    compacted: set[str] = set()
    touched: dict[Any, Any] = {}
    for message, part, _ in frames:
        image_id = part["image_id"]
        if image_id in keep or part.get("compacted"):
            (result.kept if image_id in keep else result.compacted).append(image_id)
            if (
                image_id in keep
                and low_detail
                and part.get("detail") != "low"
                and not part.get("duplicate_of")
            ):
                # A kept frame of an ended turn is context, not the screen being acted on: OpenAI's low
                # detail (one small fixed-size view) costs a fraction of a full-resolution frame.
                part["detail"] = "low"
                touched[message.pk] = message
            continue
        if part.get("duplicate_of"):
            result.duplicates.append(image_id)  # already one line; its row goes cold (it has no bytes)
        else:
            part["compacted"] = True
            result.compacted.append(image_id)
            touched[message.pk] = message
        compacted.add(image_id)
    return compacted, touched


def _messages_recount(
    touched: dict[Any, Any], *, tenant_id: Any, model: str, result: CompactionResult
) -> None:
    """Stores the changed messages' parts with their new token counts, adding both counts to `result`."""
    for message in touched.values():
        result.tokens_before += message.token_count
        message.token_count = _recount(message, tenant_id=tenant_id, model=model)
        result.tokens_after += message.token_count
        Message.objects.filter(pk=message.pk).update(parts=message.parts, token_count=message.token_count)


def history_image_detail(turn: Any) -> str:
    """Detail of the kept frames of ended turns: "low" (the default) or "keep" (as sent)."""
    tenant_settings = turn.conversation.tenant.settings or {}
    value = tenant_settings.get("history_image_detail") or settings.MNEMO_HISTORY_IMAGE_DETAIL
    return "keep" if value == "keep" else "low"


def _recount(message: Any, *, tenant_id: Any, model: str) -> int:
    return message_token_count(
        role=message.role,
        content=message.content,
        parts=message.parts,
        tenant_id=tenant_id,
        model=model,
        name=message.name,
    )


def _queue_move(image_ids: list[str]) -> None:
    try:
        images_move_to_cold.delay(image_ids)
    except Exception:
        # The compaction is committed; the daily retention task moves what is left in the hot tier.
        logger.exception("could not queue the cold-tier move of %s", image_ids)


def parts_without_payload(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The parts as they will be stored, near enough to size them: image bytes are not part of a message."""

    def strip(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for part in items:
            if part.get("type") == "image":
                out.append({k: v for k, v in part.items() if k not in ("data", "upload", "media_type")})
            elif part.get("type") == "tool_result" and isinstance(part.get("content"), list):
                out.append({**part, "content": strip(part["content"])})
            else:
                out.append(part)
        return out

    return strip(parts)


def parts_check_references(parts: list[dict[str, Any]], *, tenant_id: Any) -> None:
    """For an edit of stored parts: images must already be stored (no data/upload) in the tenant."""
    for part in iter_image_parts(parts):
        if "image_id" not in part:
            raise ApplicationError(
                "New images arrive with a new message; an edit can only name stored images (image_id).",
                code="invalid_parts",
            )
    wanted = {p["image_id"] for p in iter_image_parts(parts)}
    found = images_by_id(tenant_id=tenant_id, image_ids=wanted)
    for image_id in sorted(wanted - set(found)):
        raise ApplicationError(
            f"No image {image_id} in your tenant.",
            code="invalid_image",
            extra={"reason": "unknown_image_id", "image_id": image_id},
        )
