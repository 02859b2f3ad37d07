"""A conversation's stored attachments and the priority each has for the next model call (the decay
engine's input; context/decay.py fits them under the budget). Attachments are the documents uploaded to a
conversation and the images its user messages carried; they persist with the conversation.

- P0: attached to this turn (a document uploaded since the last assistant reply, an image on the question
  or on a user message after that reply): full content (documents) or description (images);
- P1: referenced again (its name or id in the user message, or re-attached by name): full description;
- P2: attached earlier in this conversation: a short summary;
- P3: from the end user's other conversations: name only.

Each attachment carries its text at every level (content, description, summary, name) so the decay stage
can step an item down when the budget is short. Images on tool results and assistant messages are visual
memory (placeholders and anchors, conversations.visual), not attachments, unless named by id."""

import datetime
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, Q, QuerySet, Value, When

from cold_storage.models import ArchivedImage
from conversations.models import Conversation, Message
from conversations.parts import iter_image_parts
from knowledge.models import Chunk, Document
from knowledge.vision import descriptions_by_sha256, human_size, offline_description
from providers.tokens import truncate_text
from tenants.statements import FixedQuery, Read

PRIORITIES = ("P0", "P1", "P2", "P3")
LEVELS = ("content", "description", "summary", "name")
START_LEVEL = {"P0": "content", "P1": "description", "P2": "summary", "P3": "name"}
# How many of each kind are considered at all (newest first); older ones are only counted.
THIS_CONVERSATION_LIMIT = 30
OTHER_CONVERSATIONS_LIMIT = 15
NAME_CANDIDATES_LIMIT = 300
# Images read per scope (this conversation; the end user's RECENT_CONVERSATIONS latest other ones), newest
# first, before the user's own are kept: the rest are tool output and screenshots (visual memory).
IMAGE_SCAN = 200
RECENT_CONVERSATIONS = 5
SUMMARY_TOKENS = 60
DESCRIPTION_TOKENS = 250
OUTLINE_ITEMS = 12
OUTLINE_CHUNKS = 60
IMAGE_ID = re.compile(r"\bimg_[0-9a-zA-Z]{6,64}\b")


@dataclass(frozen=True)
class AttachmentQuery:
    conversation: Conversation
    user_message: str
    model: str
    current_message_id: uuid.UUID | None = None  # the stored question: its images are this turn's
    history_until: int | None = None  # the history stops here (the stored question's seq - 1)
    shown_image_ids: frozenset[str] = frozenset()  # images the prompt already shows as pixels
    reattached: frozenset[str] = frozenset()  # names (lower case) of attachments sent with the request
    content_tokens: int = 4000  # a P0 document's content is read up to this many tokens


@dataclass
class Attachment:
    kind: str  # "document" or "image"
    id: str
    name: str
    priority: str
    reason: str  # this_turn, referenced, reattached, this_conversation, other_conversation
    created_at: datetime.datetime
    texts: dict[str, str] = field(default_factory=dict)  # by level
    described: str = ""  # images: "llm", "client" or "offline"
    image: ArchivedImage | None = None  # the image whose bytes are described (the original of a duplicate)

    @property
    def order(self) -> tuple[int, float, str]:
        """Rendering order: by priority, then oldest first (stable across requests)."""
        return PRIORITIES.index(self.priority), self.created_at.timestamp(), self.id


@dataclass
class Found:
    attachments: list[Attachment]
    not_considered: int  # beyond the limits above: not even named


def conversation_attachments(query: AttachmentQuery) -> Found:
    """Every attachment the next call should know of, with its priority and texts."""
    documents_stored, images_stored = _stored(query.conversation)
    if not documents_stored and not images_stored:
        return Found([], 0)
    rows, skipped = _document_candidates(query) if documents_stored else ([], 0)
    image_rows = _image_candidates(query) if images_stored else _ImageRows([], 0, {})
    if not rows and not image_rows.rows:  # most conversations: no reply to look up, nothing to describe
        return Found([], skipped + image_rows.skipped)
    reply_seq, reply_at = _last_reply(query)
    documents = _documents(query, rows, reply_at)
    images = _images(query, image_rows, reply_seq)
    return Found(documents + images, skipped + image_rows.skipped)


def attachments_reads(conversation: Conversation) -> list[Read]:
    """_stored's reads (any document, any image), also for reading them ahead (tenants.statements)."""
    own, tenant_id, end_user_id = conversation.pk, conversation.tenant_id, conversation.end_user_id
    if end_user_id is None:
        return [
            (_CONVERSATION_DOCUMENT, {"conversation_id": own, "tenant_id": tenant_id}),
            (_CONVERSATION_IMAGE, {"conversation_id": own, "tenant_id": tenant_id}),
        ]
    return [
        (_END_USER_DOCUMENT, {"conversation_id": own, "tenant_id": tenant_id, "end_user_id": end_user_id}),
        (_END_USER_IMAGE, {"tenant_id": tenant_id, "end_user_id": end_user_id}),
    ]


def _stored(conversation: Conversation) -> tuple[bool, bool]:
    """Whether the conversation or its end user has any document, and any image. Most have neither, many
    only one kind, and a plain EXISTS costs a fraction of a kind's candidate reads below (ordered, joined,
    several queries)."""
    documents, images = (bool(query.run(**values)) for query, values in attachments_reads(conversation))
    return documents, images


# _stored's reads, as fixed statements (tenants.statements): run on every context call, where Django
# compiling them cost more than the database answering. values_list(pk)[:1] is what exists() asks.
def _one(queryset: QuerySet[Any]) -> QuerySet[Any]:
    return queryset.order_by().values_list("pk", flat=True)[:1]


def _documents_of(scope: Q, tenant_id: Any) -> QuerySet[Any]:
    return _one(Document.objects.filter(scope, tenant_id=tenant_id))


def _images_of(scope: Q, tenant_id: Any) -> QuerySet[Any]:
    return _one(ArchivedImage.objects.filter(scope, tenant_id=tenant_id))


def _their_conversations(tenant_id: Any, end_user_id: Any) -> Q:
    theirs = Conversation.objects.filter(tenant_id=tenant_id, end_user_id=end_user_id)
    return Q(conversation_id__in=theirs.values("pk"))


_SAMPLES = {"conversation_id": uuid.uuid4(), "tenant_id": uuid.uuid4()}
_CONVERSATION_DOCUMENT = FixedQuery(
    lambda conversation_id, tenant_id: _documents_of(Q(conversation_id=conversation_id), tenant_id),
    **_SAMPLES,
)
_CONVERSATION_IMAGE = FixedQuery(
    lambda conversation_id, tenant_id: _images_of(Q(conversation_id=conversation_id), tenant_id), **_SAMPLES
)
_END_USER_DOCUMENT = FixedQuery(
    lambda conversation_id, tenant_id, end_user_id: _documents_of(
        Q(conversation_id=conversation_id) | Q(end_user_id=end_user_id), tenant_id
    ),
    **_SAMPLES,
    end_user_id=7_123_456_789_005,
)
_END_USER_IMAGE = FixedQuery(
    lambda tenant_id, end_user_id: _images_of(_their_conversations(tenant_id, end_user_id), tenant_id),
    tenant_id=_SAMPLES["tenant_id"],
    end_user_id=7_123_456_789_005,
)


def _candidates_of(scope: Q, conversation_id: Any, tenant_id: Any) -> QuerySet[Any]:
    """_document_candidates' read: this conversation's documents first, then the newest."""
    own_first = Case(When(conversation_id=conversation_id, then=Value(0)), default=Value(1))
    return Document.objects.filter(scope, tenant_id=tenant_id).order_by(own_first, "-created_at", "-id")[
        : THIS_CONVERSATION_LIMIT + NAME_CANDIDATES_LIMIT
    ]


# Read on every context call of a conversation with documents: fixed statements, as _stored's.
_CONVERSATION_DOCUMENTS = FixedQuery(
    lambda conversation_id, tenant_id: _candidates_of(
        Q(conversation_id=conversation_id), conversation_id, tenant_id
    ),
    **_SAMPLES,
)
_END_USER_DOCUMENTS = FixedQuery(
    lambda conversation_id, tenant_id, end_user_id: _candidates_of(
        Q(conversation_id=conversation_id) | Q(end_user_id=end_user_id), conversation_id, tenant_id
    ),
    **_SAMPLES,
    end_user_id=7_123_456_789_005,
)


def _last_reply(query: AttachmentQuery) -> tuple[int, datetime.datetime | None]:
    """The seq and time of the last assistant reply before the question: what came after is this turn's."""
    replies = Message.objects.filter(
        conversation=query.conversation, role=Message.Role.ASSISTANT, kind=Message.Kind.MESSAGE
    )
    if query.history_until is not None:
        replies = replies.filter(seq__lte=query.history_until)
    last = replies.order_by("-seq").values_list("seq", "created_at").first()
    return (last[0], last[1]) if last else (0, None)


# --- documents --------------------------------------------------------------------------------------------


def _mentions(lowered: str, word: str) -> bool:
    # The substring test first: most names are not in the text at all, and each name's pattern is new to
    # re's cache (uploads have many names), so compiling it cost more than the rest of the lookup.
    if word and word not in lowered:
        return False
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", lowered) is not None


def _referenced(text: str, *, name: str, ids: tuple[str, ...]) -> bool:
    """Named in the text: by id, by its whole file name, or by its stem when that is distinctive (5+
    characters), each as a whole word ("a.md" is not found in "data.md")."""
    lowered = text.lower()
    if any(i and i.lower() in lowered for i in ids):
        return True
    if _mentions(lowered, name.lower()):
        return True
    stem = name.rsplit(".", 1)[0].lower()
    return len(stem) >= 5 and _mentions(lowered, stem)


def _named(document: Document, query: AttachmentQuery) -> str:
    """Why the user points at this document ("reattached", "referenced"), or ""."""
    if document.name.lower() in query.reattached:
        return "reattached"
    if _referenced(query.user_message, name=document.name, ids=(str(document.pk), document.pk.hex)):
        return "referenced"
    return ""


def _document_priority(document: Document, query: AttachmentQuery, reply_at: Any) -> tuple[str, str]:
    own = document.conversation_id == query.conversation.pk
    if own and (reply_at is None or document.created_at > reply_at):
        return "P0", "this_turn"  # uploaded since the last reply, whatever else is said of it
    named = _named(document, query)
    if named:
        return "P1", named
    return ("P2", "this_conversation") if own else ("P3", "other_conversation")


def _document_candidates(query: AttachmentQuery) -> tuple[list[Document], int]:
    """This conversation's documents (the newest THIS_CONVERSATION_LIMIT), then the end user's others: of
    their other conversations (P3, the newest OTHER_CONVERSATIONS_LIMIT; P1 when named) and of their library
    (only when named). One query, this conversation's first."""
    conversation = query.conversation
    values: dict[str, Any] = {"conversation_id": conversation.pk, "tenant_id": conversation.tenant_id}
    if conversation.end_user_id is None:
        documents = _CONVERSATION_DOCUMENTS.run(**values)
    else:
        documents = _END_USER_DOCUMENTS.run(**values, end_user_id=conversation.end_user_id)
    rows: list[Document] = []
    own = others = skipped = 0
    for document in documents:
        named = bool(_named(document, query))
        if document.conversation_id == conversation.pk:
            own += 1
            keep = own <= THIS_CONVERSATION_LIMIT or named
        else:
            keep = named or (document.conversation_id is not None and others < OTHER_CONVERSATIONS_LIMIT)
            others += keep and not named
        if keep:
            rows.append(document)
        elif document.conversation_id is not None:
            skipped += 1
    return rows, skipped


def _documents(query: AttachmentQuery, rows: list[Document], reply_at: Any) -> list[Attachment]:
    found = []
    for document in rows:
        priority, reason = _document_priority(document, query, reply_at)
        attachment = Attachment(
            "document", str(document.pk), document.name, priority, reason, document.created_at
        )
        found.append((document, attachment))
    # Outlines and openings of every document shown above its name, in two queries whatever their number.
    described = [d.pk for d, a in found if a.priority != "P3" and d.status == Document.Status.READY]
    outlines, openings = _outlines(described), _openings(described)
    for document, attachment in found:
        attachment.texts = _document_texts(
            document, query, outline=outlines.get(document.pk, ""), opening=openings.get(document.pk, "")
        )
        if attachment.priority == "P0" and document.status == Document.Status.READY:
            attachment.texts["content"] = _document_content(document, query)
    return [attachment for _, attachment in found]


def _header(document: Document) -> str:
    parts = [document.format.upper() if document.kind == Document.Kind.DOCUMENT else "code"]
    pages, files = document.details.get("pages"), document.details.get("files")
    if pages:
        parts.append(f"{pages} page{'s' if pages != 1 else ''}")
    if files:
        parts.append(f"{files} file{'s' if files != 1 else ''}")
    parts.append(human_size(document.size))
    if document.status == Document.Status.PENDING:
        parts.append("still being processed")
    elif document.status == Document.Status.FAILED:
        parts.append(f"could not be read: {document.error or document.error_code}")
    return f"{document.name} ({', '.join(parts)})"


def _outlines(document_ids: list[Any]) -> dict[Any, str]:
    """Per document, the headings (documents) or files and symbols (code) of its first OUTLINE_CHUNKS
    chunks, in order, without repeats."""
    labels: dict[Any, dict[str, None]] = {}
    if not document_ids:
        return {}
    rows = (
        Chunk.objects.filter(document_id__in=document_ids, ordinal__lt=OUTLINE_CHUNKS)
        .order_by("document_id", "ordinal")
        .values_list("document_id", "heading", "sheet", "path", "symbol")
    )
    for document_id, heading, sheet, path, symbol in rows:
        seen = labels.setdefault(document_id, {})
        label = f"{path}: {symbol}" if path and symbol else heading or sheet or symbol
        if label and len(seen) < OUTLINE_ITEMS:
            seen[label] = None
    return {document_id: "; ".join(seen) for document_id, seen in labels.items()}


def _openings(document_ids: list[Any]) -> dict[Any, str]:
    if not document_ids:
        return {}
    rows = Chunk.objects.filter(document_id__in=document_ids, ordinal=0).values_list("document_id", "content")
    return {document_id: content.strip() for document_id, content in rows}


def _document_texts(
    document: Document, query: AttachmentQuery, *, outline: str, opening: str
) -> dict[str, str]:
    header, model = _header(document), query.model
    summary_body = truncate_text(outline or opening, SUMMARY_TOKENS, model=model)
    lines = [f"- {header}"]
    if outline:
        lines.append(f"  Contents: {outline}")
    if opening:
        lines.append("  " + truncate_text(opening, DESCRIPTION_TOKENS, model=model))
    return {
        "name": f"- {document.name}{_elsewhere(document, query)}",
        "summary": f"- {header}" + (f": {summary_body}" if summary_body else ""),
        "description": "\n".join(lines),
    }


def _elsewhere(document: Document, query: AttachmentQuery) -> str:
    if document.conversation_id == query.conversation.pk:
        return ""
    if document.conversation_id is None:
        return " (the user's library)"
    return f" (earlier conversation, {document.created_at.date().isoformat()})"


def _document_content(document: Document, query: AttachmentQuery) -> str:
    """The document's text in order, up to content_tokens (consecutive chunks overlap a little; the overlap
    is kept rather than guessed away). Pages are marked where they change."""
    lines, used, page = [f"- {_header(document)}"], 0, None
    rows = (
        Chunk.objects.filter(document=document)
        .order_by("ordinal")
        .values_list("content", "token_count", "page")
    )
    for content, tokens, chunk_page in rows.iterator(chunk_size=50):
        if used + tokens > query.content_tokens:
            left = document.token_count - used
            lines.append(f"[… about {left} more tokens; the rest is searchable]")
            break
        if chunk_page is not None and chunk_page != page:
            lines.append(f"[page {chunk_page}]")
            page = chunk_page
        lines.append(content.strip())
        used += tokens
    return "\n".join(lines)


# --- images -----------------------------------------------------------------------------------------------


def _newest_images(**where: Any) -> QuerySet[ArchivedImage]:
    return ArchivedImage.objects.select_related("duplicate_of").filter(**where)


@dataclass
class _ImageRows:
    rows: list[ArchivedImage]
    skipped: int
    client: dict[str, str]  # descriptions the client sent with the image parts, by image id


def _image_candidates(query: AttachmentQuery) -> _ImageRows:
    """The newest IMAGE_SCAN images of this conversation and of the end user's RECENT_CONVERSATIONS latest
    other ones (read through the conversation indexes, so a long computer-use session costs what its
    newest images cost), and those named by id; then one read of their messages keeps the user's (and the
    named) ones."""
    conversation, tenant_id = query.conversation, query.conversation.tenant_id
    own = _newest_images(tenant_id=tenant_id, conversation_id=conversation.pk)
    if query.history_until is not None:
        own = own.filter(message_seq__lte=query.history_until + 1)
    scanned = list(own.order_by("-message_seq", "-part_index")[:IMAGE_SCAN])
    named = set(IMAGE_ID.findall(query.user_message)) | {n for n in query.reattached if IMAGE_ID.fullmatch(n)}
    if conversation.end_user_id is not None:
        theirs = Conversation.objects.filter(tenant_id=tenant_id, end_user_id=conversation.end_user_id)
        recent = (
            theirs.exclude(pk=conversation.pk).order_by("-created_at").values("pk")[:RECENT_CONVERSATIONS]
        )
        others = _newest_images(tenant_id=tenant_id, conversation_id__in=recent)
        scanned += list(others.order_by("-created_at")[:IMAGE_SCAN])
        if named - {i.id for i in scanned}:
            scanned += list(
                _newest_images(tenant_id=tenant_id, conversation_id__in=theirs.values("pk"), pk__in=named)
            )
    elif named - {i.id for i in scanned}:
        scanned += list(_newest_images(tenant_id=tenant_id, conversation_id=conversation.pk, pk__in=named))
    return _user_sent(conversation, scanned, named)


def _user_sent(conversation: Conversation, scanned: list[ArchivedImage], named: set[str]) -> _ImageRows:
    message_ids = {i.message_id for i in scanned if i.message_id}
    messages = Message.objects.filter(pk__in=message_ids).values_list("id", "role", "parts")
    by_id = {pk: (role, parts) for pk, role, parts in messages} if message_ids else {}
    rows, skipped, own, others, seen = [], 0, 0, 0, set()
    for image in scanned:
        role, _ = by_id.get(image.message_id, ("", None)) if image.message_id else ("", None)
        if image.id in seen or (role != Message.Role.USER and image.id not in named):
            continue
        seen.add(image.id)
        mine = image.conversation_id == conversation.pk
        count = own if mine else others
        limit = THIS_CONVERSATION_LIMIT if mine else OTHER_CONVERSATIONS_LIMIT
        if count >= limit and image.id not in named:
            skipped += mine
            continue
        own, others = (own + 1, others) if mine else (own, others + 1)
        rows.append(image)
    client = {}
    for _, parts in by_id.values():
        for part in _image_parts(parts):
            if part.get("image_id") and isinstance(part.get("description"), str):
                client[part["image_id"]] = part["description"].strip()
    return _ImageRows(rows, skipped, client)


def _image_priority(image: ArchivedImage, query: AttachmentQuery, reply_seq: int) -> tuple[str, str]:
    own = image.conversation_id == query.conversation.pk
    if own and (image.message_id == query.current_message_id or image.message_seq > reply_seq):
        return "P0", "this_turn"
    if image.id.lower() in query.reattached:
        return "P1", "reattached"
    if image.id in query.user_message:
        return "P1", "referenced"
    return ("P2", "this_conversation") if own else ("P3", "other_conversation")


def _image_parts(parts: Any) -> list[dict[str, Any]]:
    return list(iter_image_parts(parts)) if isinstance(parts, list) else []


def _images(query: AttachmentQuery, found: _ImageRows, reply_seq: int) -> list[Attachment]:
    rows, client = found.rows, found.client
    described = descriptions_by_sha256(
        tenant_id=query.conversation.tenant_id, sha256s={(i.duplicate_of or i).sha256 for i in rows}
    )
    out, seen = [], set()
    for image in rows:
        source = image.duplicate_of or image
        if source.id in seen:  # the same bytes twice are one attachment
            continue
        seen.add(source.id)
        priority, reason = _image_priority(image, query, reply_seq)
        # Pixels the prompt shows need no words, unless the user names the image (the description carries
        # its id, which the pixels do not).
        if {image.id, source.id} & query.shown_image_ids and priority != "P1":
            continue
        row = described.get(source.sha256)
        text, how = (row.text, "llm") if row else (client.get(image.id, ""), "client")
        if not text:
            how = "offline"
        attachment = Attachment("image", image.id, image.id, priority, reason, image.created_at)
        attachment.described, attachment.image = how, source
        attachment.texts = _image_texts(image, text, query)
        out.append(attachment)
    return out


def _image_texts(image: ArchivedImage, description: str, query: AttachmentQuery) -> dict[str, str]:
    label = f"- image {offline_description(image)}"
    full = f"{label}\n  {description}" if description else label
    first = re.split(r"(?<=[.!?])\s", description, maxsplit=1)[0] if description else ""
    short = truncate_text(first, SUMMARY_TOKENS, model=query.model)
    where = ""
    if image.conversation_id != query.conversation.pk:
        where = f" (earlier conversation, {image.created_at.date().isoformat()})"
    return {
        "content": full,
        "description": full,
        "summary": f"{label}: {short}" if short else label,
        "name": f"- image {image.id}{where}",
    }
