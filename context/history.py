"""B6, the history since the last compaction boundary: reading its rows (newest first, only as far back as
its allowance could use) and cutting the window when it is over its allowance."""

import dataclasses
import functools
import json
import uuid
from typing import Any

from django.db.models import Count, Min, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from context.dropped import HistoryCut, ShortenedMessage
from context.images import attach_images
from context.lines import SPOKEN_ROLES, turn_text
from context.models import ConversationContext
from context.state import ContextState
from conversations.models import Message
from prefix_cache.accounting import count_cached
from prefix_cache.rendering import HistoryMessage
from providers.tokens import MESSAGE_OVERHEAD_TOKENS, count_message, truncate_text
from tenants.statements import FixedQuery

# The newest exchanges B6 always shows (shortened, when even they do not fit their share).
PROTECTED_EXCHANGES = 1
# A shortened history message keeps at least this many tokens (its head).
MIN_CUT_TOKENS = 48
# The end of a history that does not stop before a stored question (within the column's range).
NO_END = 2**62
# A B6 row as _history_rows reads it (tuples, not model instances: at a large window these are thousands).
# The parts come as text: most messages have none ("[]"), and decoding each through the JSON field's
# converter was a measurable share of reading a large window.
HISTORY_COLUMNS = (
    "id", "seq", "role", "content", "parts_text", "token_count", "is_error", "completed", "name", "created_at"
)  # fmt: skip
HISTORY_TEXT = {"parts_text": Cast("parts", TextField())}


# --- reading ----------------------------------------------------------------------------------------------


def history_load(state: ContextState, *, until_seq: int | None) -> None:
    """B6: messages after the boundary (and after the window start), read newest first and only as far back
    as the budget could possibly use, so a conversation of any length costs what its window costs."""
    start = max(state.boundary_seq, state.context.window_start_seq)
    state.history_start = start
    state.history_unread_to = None
    allowance = state.shares.history_allowance
    rows = _history_rows(state, start, NO_END if until_seq is None else until_seq + 1, allowance)
    if not rows:
        return
    user_seqs = [row[1] for row in rows if row[2] == Message.Role.USER]
    state.protected_from_seq = (
        user_seqs[-PROTECTED_EXCHANGES] if len(user_seqs) >= PROTECTED_EXCHANGES else rows[0][1]
    )
    state.layout.history = _history_messages(state, rows)
    attach_images(state)  # image bytes, read only for the images the prompt shows as pixels


def _history_messages(state: ContextState, rows: list[tuple[Any, ...]]) -> list[HistoryMessage]:
    """B6's messages as the prompt shows them (context.lines): speaker names, date lines where the day
    changes, relative dates resolved. A turn's tokens grow by what that adds. The history of today alone
    needs no date line (the first turn of an older day, or of a history spanning days, gets one)."""
    messages, day = [], timezone.now().date()
    for pk, seq, role, content, parts, tokens, is_error, completed, name, created_at in rows:
        new_day = created_at.date() != day
        text = turn_text(content, role=role, name=name, created_at=created_at, new_day=new_day)
        if role in SPOKEN_ROLES and content:
            day = created_at.date()
        # The stored count holds the name already (counted as the provider counts a message's name): only
        # the date line and the resolved dates are new tokens.
        unnamed = turn_text(content, role=role, name="", created_at=created_at, new_day=new_day)
        if unnamed != content:
            tokens += count_cached(unnamed, model=state.model) - count_cached(content, model=state.model)
        messages.append(HistoryMessage(str(pk), seq, role, text, _parts(parts), tokens, is_error, completed))
    return messages


def _parts(text: str | None) -> list[dict[str, Any]]:
    if not text or text == "[]":  # the column is never null; most messages have no parts
        return []
    parts: list[dict[str, Any]] = json.loads(text)
    return parts


# The end of a history that does not stop before a stored question (within the column's range).


@functools.lru_cache(maxsize=32)
def _history_page(page_size: int) -> FixedQuery:
    """B6 rows after `after` and before `before`, newest first (the page size is part of the SQL)."""
    return FixedQuery(
        lambda conversation_id, after, before: (
            Message.objects.filter(
                conversation_id=conversation_id, seq__gt=after, seq__lt=before, kind=Message.Kind.MESSAGE
            )
            .annotate(**HISTORY_TEXT)
            .order_by("-seq")
            .values_list(*HISTORY_COLUMNS)[:page_size]
        ),
        conversation_id=uuid.uuid4(),
        after=7_123_456_789_001,
        before=7_123_456_789_003,
    )


def _history_rows(state: ContextState, after: int, before: int, allowance: int) -> list[tuple[Any, ...]]:
    """The rows of B6 (seq after `after` and before `before`), oldest first: pages newest first until they
    hold more than the allowance. Each page reads whole rows: every row a page brings is shown or cut by the
    budget stage, and reading their tokens first and their content in a second query (as before) cost a
    round trip and a query's compilation on every call for the same rows."""
    # Sized so that one page usually covers the allowance (a message is some tens of tokens): a large window
    # is thousands of messages, and each page is a query.
    page_size = min(5000, max(500, allowance // 40))
    query = _history_page(page_size)
    rows: list[tuple[Any, ...]] = []
    total = 0
    cursor = before
    while True:
        page = query.run(conversation_id=state.conversation.pk, after=after, before=cursor)
        rows += page
        total += sum(row[5] for row in page)
        if len(page) < page_size:
            break
        if total > allowance:
            # Anything older than what was read cannot fit; the budget stage reports it as dropped.
            state.history_unread_to = page[-1][1] - 1
            break
        cursor = page[-1][1]
    rows.reverse()
    return rows


# --- the window cut ---------------------------------------------------------------------------------------


def history_fit(state: ContextState) -> int:
    """B6 within its allowance; returns its tokens. Cut in one step from the oldest end (the window start
    moves past the cut and stays there, see budget.WINDOW_REFILL), never into the newest exchange, which is
    shortened instead when it alone is over."""
    layout = state.layout
    allowance = state.shares.history_allowance
    history_tokens = sum(m.token_count for m in layout.history)
    if history_tokens <= allowance:
        if state.history_unread_to is not None:
            _cut_history(state, [], kept_tokens=history_tokens)
        return history_tokens
    keep_from, kept = window_keep_from(
        layout.history, target=state.shares.window_target, protected_from_seq=state.protected_from_seq
    )
    # The window starts on a user message: never with a tool result whose call was cut (providers refuse
    # that) or with an answer whose question was cut.
    while (
        keep_from < len(layout.history)
        and layout.history[keep_from].role != Message.Role.USER
        and layout.history[keep_from].seq < state.protected_from_seq
    ):
        kept -= layout.history[keep_from].token_count
        keep_from += 1
    _cut_history(state, layout.history[:keep_from], kept_tokens=kept)
    layout.history = layout.history[keep_from:]
    if kept > allowance:
        kept = _shorten_newest(state, allowance)
    return kept


def window_keep_from(
    messages: list[HistoryMessage], *, target: int, protected_from_seq: int
) -> tuple[int, int]:
    """(the index of the oldest message a forced cut keeps, the tokens kept): from the newest end, the
    protected newest exchange and what fits the target."""
    keep_from, kept = len(messages), 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.seq >= protected_from_seq or kept + message.token_count <= target:
            kept += message.token_count
            keep_from = index
        else:
            break
    return keep_from, kept


def _cut_history(state: ContextState, cut: list[HistoryMessage], *, kept_tokens: int) -> int:
    """List what the cut leaves out (with the older history that was never read) as one B6 drop, move the
    window start past it, and return the tokens the history keeps."""
    messages, tokens = len(cut), sum(m.token_count for m in cut)
    from_seq = cut[0].seq if cut else None
    if state.history_unread_to is not None:
        unread = Message.objects.filter(
            conversation=state.conversation,
            kind=Message.Kind.MESSAGE,
            seq__gt=state.history_start,
            seq__lte=state.history_unread_to,
        ).aggregate(n=Count("id"), tokens=Sum("token_count"), first=Min("seq"))
        if unread["n"]:
            messages += unread["n"]
            tokens += unread["tokens"] or 0
            from_seq = unread["first"]
    if from_seq is None:
        return kept_tokens
    new_start = cut[-1].seq if cut else state.history_unread_to
    assert new_start is not None  # from_seq is set by a cut or by unread messages up to history_unread_to
    state.dropped.append(
        HistoryCut(
            block="B6", reason="budget", tokens=tokens, from_seq=from_seq, to_seq=new_start, messages=messages
        )
    )
    state.writes.append(functools.partial(_window_start_move, state.conversation.pk, new_start))
    state.context.window_start_seq = new_start
    return kept_tokens


def _shorten_newest(state: ContextState, allowance: int) -> int:
    """The newest exchange alone is over the allowance (a long reply, a pasted file): each text message
    longer than an even share keeps its head, marked as cut (the whole message stays retrievable, and its
    part that matches the question can come back through B5)."""
    layout = state.layout
    share = max(MIN_CUT_TOKENS, allowance // max(1, len(layout.history)))
    shortened = []
    for message in layout.history:
        text_only = all(p.get("type") == "text" for p in message.parts)
        if message.token_count <= share or not text_only:
            shortened.append(message)
            continue
        head = truncate_text(message.content, share - MESSAGE_OVERHEAD_TOKENS - 16, model=state.model)
        cut = message.token_count - share
        content = f"{head}\n[… message #{message.seq} shortened here: about {cut} more tokens]"
        tokens = count_message(role=message.role, content=content, model=state.model)
        shortened.append(dataclasses.replace(message, content=content, parts=[], token_count=tokens))
        state.dropped.append(
            ShortenedMessage(block="B6", reason="shortened", tokens=cut, seq=message.seq, id=message.id)
        )
    layout.history = shortened
    return sum(m.token_count for m in shortened)


def _window_start_move(conversation_id: Any, start: int) -> None:
    """The window start only moves forward (a concurrent call may have moved it further)."""
    ConversationContext.objects.filter(conversation_id=conversation_id, window_start_seq__lt=start).update(
        window_start_seq=start, updated_at=timezone.now()
    )
