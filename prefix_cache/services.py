"""Writes: PrefixHint bookkeeping, CacheUsage (predicted on assembly, actual when usage arrives) and the
hourly rollups of context calls the dashboard draws."""

import atexit
import logging
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections, connection, models, transaction
from django.db.models import F, FloatField, Value
from django.db.models.constants import OnConflict
from django.db.models.functions import Greatest
from django.db.models.sql import InsertQuery
from django.utils import timezone
from rest_framework import status

from conversations.models import Conversation
from prefix_cache.models import (
    CacheUsage,
    ContextCallHour,
    DegradationHour,
    PrefixHint,
    latency_bucket_field,
)
from prefix_cache.usage import usage_parse
from providers.metrics import cache_usage_observe
from providers.model_table import model_info
from tenants.errors import ApplicationError
from tenants.models import Tenant
from tenants.statements import FixedQuery

logger = logging.getLogger(__name__)

# Hourly context-call rollups older than this are deleted by the daily prune (prefix_cache.tasks).
CONTEXT_STATS_DAYS = 90


@dataclass(frozen=True)
class PrefixLevel:
    level: str
    hash: str
    tokens: int


@dataclass(frozen=True)
class PrefixMatch:
    level: str | None  # the deepest whole level sent before, or None
    chain_index: int | None  # the last history message up to which this prompt was sent before
    seen: frozenset[tuple[str, str]] = frozenset()  # (level, hash) of the whole levels sent before


# Where the chain is looked up first: a prompt usually extends one sent a turn ago, so the longest prefix
# sent before ends among the newest messages, and the IN list stays short at a 128k window of thousands.
CHAIN_PROBE = 64
CHAIN_LEVELS = (PrefixHint.Level.B6, PrefixHint.Level.PROMPT)


def _hints_known(tenant: Tenant, *, levels: list[PrefixLevel], chain: list[str]) -> set[tuple[str, str]]:
    """(level, hash) of the tenant's hints among these levels and history-chain hashes. The statement is
    written out, not a queryset: with its IN lists (up to CHAIN_PROBE hashes) Django's compilation cost
    several times the query's round trip, on every context call. The same SQL the queryset made."""
    groups = [([str(level) for level in CHAIN_LEVELS], chain)]
    if levels:
        groups.append(([lv.level for lv in levels], [lv.hash for lv in levels]))
    groups = [(names, hashes) for names, hashes in groups if hashes]  # an empty IN matches nothing
    if not groups:
        return set()
    quote = connection.ops.quote_name
    level, hash_ = quote("level"), quote("hash")
    tenant_field = PrefixHint._meta.get_field("tenant")
    params: list[Any] = [tenant_field.get_db_prep_value(tenant.pk, connection)]
    wanted = []
    for names, hashes in groups:
        names, hashes = list(dict.fromkeys(names)), list(dict.fromkeys(hashes))
        wanted.append(f"({level} IN ({_marks(names)}) AND {hash_} IN ({_marks(hashes)}))")
        params += [*names, *hashes]
    sql = (
        f"SELECT {level}, {hash_} FROM {quote(PrefixHint._meta.db_table)} "  # noqa: S608 - names from the model
        f"WHERE {quote(tenant_field.column)} = %s AND ({' OR '.join(wanted)})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {(row[0], row[1]) for row in cursor.fetchall()}


def _marks(values: list[str]) -> str:
    return ", ".join(["%s"] * len(values))


def _hints_count(tenant: Tenant, *, seen: set[str], now: datetime) -> None:
    """One more hit for each hint seen again: statistics for the admin, which no prompt depends on, so they
    are buffered with the context-call statistics (_StatsBuffer) instead of costing the call an UPDATE
    (written now when MNEMO_CONTEXT_STATS_FLUSH_SECONDS is 0)."""
    if not seen:
        return
    if settings.MNEMO_CONTEXT_STATS_FLUSH_SECONDS <= 0:
        _hints_add_hits(tenant.pk, dict.fromkeys(seen, 1), now=now)
        return
    _buffer.add_hits(tenant.pk, seen, now)


def _hints_add_hits(tenant_id: Any, hits: dict[str, int], *, now: datetime) -> None:
    """Add hits to the tenant's hints with these hashes. Rows another transaction holds (a context call's
    new hints until it commits) are skipped, the count is approximate, so nothing waits on them here, let
    alone deadlocks (seen with 50 concurrent proxied streams). In a transaction of its own when the caller
    has none (select_for_update needs one)."""
    by_count: dict[int, list[str]] = defaultdict(list)
    for hash_, count in hits.items():
        by_count[count].append(hash_)
    with transaction.atomic(savepoint=False):
        for count, hashes in sorted(by_count.items()):
            free = PrefixHint.objects.filter(tenant_id=tenant_id, hash__in=hashes).select_for_update(
                skip_locked=True
            )
            PrefixHint.objects.filter(pk__in=free.values("pk")).update(hits=F("hits") + count, last_seen=now)


def _hints_add(tenant: Tenant, new: list[PrefixLevel], *, now: datetime) -> None:
    """Insert the hints not seen before. Two calls may race to create the same hint: the second waits for
    the first and inserts nothing. Rows go in one order everywhere, so two such waits never form a cycle."""
    if not new:
        return
    rows: list[models.Model] = [
        PrefixHint(
            tenant=tenant, level=lv.level, hash=lv.hash, token_count=lv.tokens, first_seen=now, last_seen=now
        )
        for lv in sorted(new, key=lambda lv: (lv.level, lv.hash))
    ]
    # bulk_create's statement without the transaction bulk_create wraps it in: a context call sends these rows
    # with its CacheUsage row in one round trip (context/writes.py), which a BEGIN and a COMMIT would triple.
    query = InsertQuery(PrefixHint, on_conflict=OnConflict.IGNORE)
    query.insert_values([f for f in PrefixHint._meta.concrete_fields if not f.primary_key], rows)
    with connection.cursor() as cursor:
        for sql, params in query.get_compiler(connection=connection).as_sql():
            cursor.execute(sql, params)


def prefix_hints_find(
    *, tenant: Tenant, levels: list[PrefixLevel], chain: list[str] | None = None
) -> PrefixMatch:
    """Find what the tenant sent before of this request's prefixes (reads only): the deepest whole level,
    and along the hash chain of the history (one hash per stored message, each over the one before) the
    longest prefix some earlier prompt carried — the part a provider can serve from its cache. One query
    (two when the newest part of the chain was never sent)."""
    chain = chain or []
    head, tail = chain[:-CHAIN_PROBE], chain[-CHAIN_PROBE:]
    known = _hints_known(tenant, levels=levels, chain=tail)
    hit = None
    for lv in levels:
        if (lv.level, lv.hash) not in known:
            break  # a deeper level cannot match when a shallower one did not
        hit = lv.level
    seen_chain = {h for level, h in known if level in CHAIN_LEVELS}
    if head and not seen_chain.intersection(tail):
        # Only when the newest part of the history was never sent (a first call, a moved window).
        seen_chain = {h for _, h in _hints_known(tenant, levels=[], chain=head)}
    chain_index = next((i for i in range(len(chain) - 1, -1, -1) if chain[i] in seen_chain), None)
    seen = frozenset((lv.level, lv.hash) for lv in levels if (lv.level, lv.hash) in known)
    return PrefixMatch(level=hit, chain_index=chain_index, seen=seen)


def prefix_hints_record(*, tenant: Tenant, levels: list[PrefixLevel], match: PrefixMatch) -> None:
    """Count this request's prefixes (the writes of prefix_hints_find's outcome): one more hit for each level
    seen before, a new hint for each level not. Two queries."""
    now = timezone.now()
    _hints_count(tenant, seen={lv.hash for lv in levels if (lv.level, lv.hash) in match.seen}, now=now)
    _hints_add(tenant, [lv for lv in levels if (lv.level, lv.hash) not in match.seen], now=now)


def cache_usage_open(
    *,
    conversation: Conversation,
    provider: str,
    model: str,
    predicted_prompt_tokens: int,
    predicted_cacheable_tokens: int,
    prefix_hash: str,
    hint_level: str | None,
) -> CacheUsage:
    return CacheUsage.objects.create(
        tenant_id=conversation.tenant_id,
        conversation=conversation,
        provider=provider,
        model=model,
        predicted_prompt_tokens=predicted_prompt_tokens,
        predicted_cacheable_tokens=predicted_cacheable_tokens,
        prefix_hash=prefix_hash,
        hint_level=hint_level or "",
    )


# The context call a usage report names, locked: every proxied reply reports one, so a fixed statement
# (tenants.statements). Only the usage fields change on a matched row.
_CONTEXT_CALL = FixedQuery(
    lambda conversation_id, context_id: (
        CacheUsage.objects.select_for_update()
        .filter(conversation_id=conversation_id, pk=context_id)
        .order_by()[:1]
    ),
    conversation_id=uuid.uuid4(),
    context_id=uuid.uuid4(),
)
USAGE_FIELDS = (
    "provider", "prompt_tokens", "cached_tokens", "cache_write_tokens", "completion_tokens", "reported_at",
)  # fmt: skip


def cache_usage_report(
    *, conversation: Conversation, usage: object, provider: str | None = None, context_id: object = None
) -> CacheUsage:
    """Record the provider's usage against the context call it answers: the one named by context_id, else
    the conversation's latest call still waiting for usage, else a new row with no prediction."""
    info = model_info(conversation.model)
    default_provider = {"anthropic": "anthropic", "google": "gemini"}.get(info.provider, "openai")
    parsed = usage_parse(usage, provider=provider, default_provider=default_provider)
    with transaction.atomic():
        pending = CacheUsage.objects.select_for_update().filter(conversation=conversation)
        if context_id is not None:
            row = _CONTEXT_CALL.first(conversation_id=conversation.pk, context_id=context_id)
            if row is None:
                raise ApplicationError(
                    "No context call with that id in this conversation.",
                    code="not_found",
                    status_code=status.HTTP_404_NOT_FOUND,
                )
            if row.reported_at is not None:
                raise ApplicationError(
                    "Usage for this context call was already reported.",
                    code="usage_already_reported",
                    status_code=status.HTTP_409_CONFLICT,
                )
        else:
            row = pending.filter(reported_at__isnull=True).order_by("-created_at").first()
            if row is None:
                row = CacheUsage(
                    tenant_id=conversation.tenant_id, conversation=conversation, model=conversation.model
                )
        matched = not row._state.adding  # a context call's row, with its prediction
        row.provider = parsed.provider
        row.prompt_tokens = parsed.prompt_tokens
        row.cached_tokens = parsed.cached_tokens
        row.cache_write_tokens = parsed.cache_write_tokens
        row.completion_tokens = parsed.completion_tokens
        row.reported_at = timezone.now()
        row.save(update_fields=USAGE_FIELDS if matched else None)
    cache_usage_observe(
        provider=row.provider,
        matched=matched,
        predicted_tokens=row.predicted_cacheable_tokens,
        cached_tokens=row.cached_tokens,
    )
    return row


# --- Context-call rollups: latency and degradations per tenant and hour -------------------------------------


def _bump(
    model: type[models.Model], key: dict[str, Any], increments: dict[str, Any], first: dict[str, Any]
) -> None:
    """Add to the counters of the row at `key`, creating it with `first` when it is missing. Race-safe on
    SQLite and PostgreSQL alike: the UPDATE is atomic in the database, and a creation that loses to another
    process's (the unique key) falls back to the UPDATE."""
    if model._default_manager.filter(**key).update(**increments):
        return
    try:
        with transaction.atomic():
            model._default_manager.create(**key, **first)
            return
    except IntegrityError:
        pass
    model._default_manager.filter(**key).update(**increments)


def context_call_record(
    *, tenant_id: Any, milliseconds: float, degradation_codes: Iterable[str], at: datetime | None = None
) -> None:
    """Count one finished context call in its tenant's hour (written now; context_call_note buffers)."""
    hour = (at or timezone.now()).replace(minute=0, second=0, microsecond=0)
    _record_calls(tenant_id, hour, [(milliseconds, tuple(degradation_codes))])


def _record_calls(tenant_id: Any, hour: datetime, calls: list[tuple[float, tuple[str, ...]]]) -> None:
    """Add calls (milliseconds, degradation codes) to the tenant's hour: one UPDATE once the hour's row
    exists, and one more per degradation code. Statistics never fail the call they describe: a database
    error here is logged and dropped."""
    durations = [round(max(ms, 0.0), 3) for ms, _ in calls]
    buckets = Counter(latency_bucket_field(ms) for ms in durations)
    codes = Counter(code[:64] for _, call_codes in calls for code in set(call_codes))
    slowest = max(durations)
    try:
        with transaction.atomic():
            _bump(
                ContextCallHour,
                {"tenant_id": tenant_id, "hour": hour},
                {
                    "calls": F("calls") + len(calls),
                    **{field: F(field) + n for field, n in buckets.items()},
                    "latency_ms_sum": F("latency_ms_sum") + sum(durations),
                    "latency_ms_max": Greatest(
                        F("latency_ms_max"), Value(slowest, output_field=FloatField())
                    ),
                },
                {"calls": len(calls), **buckets, "latency_ms_sum": sum(durations), "latency_ms_max": slowest},
            )
            for code, n in sorted(codes.items()):
                _bump(
                    DegradationHour,
                    {"tenant_id": tenant_id, "hour": hour, "code": code},
                    {"count": F("count") + n},
                    {"count": n},
                )
    except DatabaseError:
        logger.warning("context call statistics not recorded for tenant %s", tenant_id, exc_info=True)


class _StatsBuffer:
    """Context calls and prefix-hint hits counted in this process and written together every
    MNEMO_CONTEXT_STATS_FLUSH_SECONDS by a thread of their own (and at exit): a context call pays a
    dictionary update, not a committed write that would wait for the database's write lock (SQLite's is
    shared with the background embedding runs). A crash loses at most that many seconds of statistics."""

    def __init__(self) -> None:
        self._calls: dict[tuple[Any, datetime], list[tuple[float, tuple[str, ...]]]] = defaultdict(list)
        self._hits: dict[Any, Counter[str]] = defaultdict(Counter)  # tenant -> hint hash -> hits
        self._seen: dict[Any, datetime] = {}  # tenant -> when its hints were last seen
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, tenant_id: Any, milliseconds: float, codes: tuple[str, ...]) -> None:
        hour = timezone.now().replace(minute=0, second=0, microsecond=0)
        with self._lock:
            self._calls[(tenant_id, hour)].append((milliseconds, codes))
            self._start()

    def add_hits(self, tenant_id: Any, hashes: Iterable[str], now: datetime) -> None:
        with self._lock:
            self._hits[tenant_id].update(hashes)
            self._seen[tenant_id] = now
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mnemo-context-stats", daemon=True)
            self._thread.start()
            atexit.register(self.flush)

    def flush(self) -> None:
        with self._lock:
            pending, self._calls = self._calls, defaultdict(list)
            hits, self._hits, seen, self._seen = self._hits, defaultdict(Counter), self._seen, {}
        for (tenant_id, hour), calls in pending.items():
            _record_calls(tenant_id, hour, calls)
        for tenant_id, counts in hits.items():
            try:
                _hints_add_hits(tenant_id, dict(counts), now=seen[tenant_id])  # in a transaction of its own
            except DatabaseError:
                logger.warning("prefix-hint hits not recorded for tenant %s", tenant_id, exc_info=True)

    def _run(self) -> None:
        while True:
            time.sleep(settings.MNEMO_CONTEXT_STATS_FLUSH_SECONDS)
            try:
                close_old_connections()
                self.flush()
            except Exception:  # never let the thread die: the next round tries again
                logger.exception("context call statistics flush failed")


_buffer = _StatsBuffer()


def context_call_note(*, tenant_id: Any, milliseconds: float, degradation_codes: Iterable[str]) -> None:
    """Count a finished context call for the dashboard: buffered in this process and written within
    MNEMO_CONTEXT_STATS_FLUSH_SECONDS (0: written now, as the tests want)."""
    if settings.MNEMO_CONTEXT_STATS_FLUSH_SECONDS <= 0:
        context_call_record(
            tenant_id=tenant_id, milliseconds=milliseconds, degradation_codes=degradation_codes
        )
        return
    _buffer.add(tenant_id, milliseconds, tuple(degradation_codes))


def context_calls_flush() -> None:
    """Write what this process has buffered now (tests, and a process about to stop)."""
    _buffer.flush()


def context_stats_prune(*, now: datetime | None = None, days: int = CONTEXT_STATS_DAYS) -> int:
    """Delete context-call rollups older than `days`; returns the rows deleted."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    calls, _ = ContextCallHour.objects.filter(hour__lt=cutoff).delete()
    degradations, _ = DegradationHour.objects.filter(hour__lt=cutoff).delete()
    return calls + degradations
