"""Querysets compiled once and run again with other values: for the reads every context call (and every
proxied turn) makes, where Django building and compiling the SQL anew cost more CPU than the database took
to answer (bench/context_latency.py --profile shows it).

The sibling of tenants.scoping.ScopedRowLookup, for any queryset whose SQL depends only on which values
are asked for, not on the values themselves (no None; an `__in` list only of a fixed length)."""

import contextlib
import contextvars
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    slots: tuple[tuple[str, int, Callable[[Any], Any]], ...]  # (name, position in params, its adapter)
    compiler: Any
    converters: dict[int, Any]
    model: type[Model] | None  # rows become instances of this model
    attnames: list[str]
    flat: bool
    annotations: tuple[tuple[str, int], ...] = ()  # model rows: (attribute, its column) set on each instance


class FixedQuery:
    """`build(**samples)` is compiled once per database vendor; each run swaps the samples' positions in its
    parameters for the values given, and converts the rows as the ORM would (values_list tuples, flat values,
    or model instances with their annotations, without select_related). An `__in` list compiles to one
    placeholder per value: it has a fixed number of slots (list_samples, list_values). The samples must be
    values no query would otherwise
    hold (a fresh UUID, an odd integer): each must be found among the compiled parameters, or compiling
    fails loudly."""

    def __init__(self, build: Callable[..., QuerySet[Any]], **samples: Any) -> None:
        self._build = build
        self._samples = samples
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()

    def _compile(self, using: str) -> _Compiled:
        queryset = self._build(**self._samples)
        compiler = queryset.query.get_compiler(using)
        sql, params = compiler.as_sql()
        slots = []
        for name, sample in self._samples.items():
            found = [(name, i, _cast(p, sample)) for i, p in enumerate(params) if _is_sample(p, sample)]
            if not found:
                raise ValueError(f"FixedQuery: the sample for {name!r} is not among the query's parameters")
            slots += found
        iterable = queryset._iterable_class
        if iterable not in (ModelIterable, ValuesListIterable, FlatValuesListIterable):
            raise ValueError(f"FixedQuery: {iterable.__name__} rows are not supported")
        fields = [s[0] for s in compiler.select[0 : compiler.col_count]]
        model, attnames, annotations = None, [], ()
        if iterable is ModelIterable:
            info = compiler.klass_info
            if info.get("related_klass_infos") or info["select_fields"][0] != 0:
                raise ValueError("FixedQuery: model rows without select_related or extra() only")
            model = queryset.model
            attnames = [f.target.attname for f in fields[: info["select_fields"][-1] + 1]]
            annotations = tuple(compiler.annotation_col_map.items())
        return _Compiled(
            sql, tuple(params), tuple(slots), compiler, compiler.get_converters(fields), model, attnames,
            iterable is FlatValuesListIterable, annotations,
        )  # fmt: skip

    def _prepared(self, using: str) -> _Compiled:
        key = (using, connections[using].vendor)
        compiled = self._compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(key) or self._compile(using)
                self._compiled[key] = compiled
        return compiled

    def bound(self, using: str, values: dict[str, Any]) -> tuple[_Compiled, list[Any]]:
        """The compiled statement and its parameters for these values."""
        compiled = self._prepared(using)
        params = list(compiled.params)
        for name, position, cast in compiled.slots:
            params[position] = cast(_like(self._samples[name], values[name]))
        return compiled, params

    def run(self, *, using: str = "default", **values: Any) -> list[Any]:
        compiled, params = self.bound(using, values)
        ahead = _read_ahead.get()
        if ahead is not None:
            fetched = ahead.pop((self, using, _key(params)), None)
            if fetched is not None:
                return _rows(compiled, using, fetched)
        with connections[using].cursor() as cursor:
            cursor.execute(compiled.sql, params)
            return _rows(compiled, using, cursor.fetchall())

    def first(self, *, using: str = "default", **values: Any) -> Any:
        """The first row, or None (the queryset should end in [:1])."""
        rows = self.run(using=using, **values)
        return rows[0] if rows else None


def list_samples(name: str, slots: int, first: int) -> dict[str, int]:
    """Samples for an `__in` list of integers with `slots` places: name0, name1, ... from `first` on."""
    return {f"{name}{i}": first + i for i in range(slots)}


def list_values(name: str, values: Sequence[Any], slots: int, filler: Any) -> dict[str, Any]:
    """The values of such a list: `values`, then `filler` (a value no row holds) in the places left."""
    if len(values) > slots:
        raise ValueError(f"FixedQuery: {len(values)} values for {slots} places")
    padded = [*values, *[filler] * (slots - len(values))]
    return {f"{name}{i}": value for i, value in enumerate(padded)}


def _rows(compiled: _Compiled, using: str, fetched: list[Any]) -> list[Any]:
    """Fetched rows as the ORM would give them."""
    rows: Any = fetched
    if compiled.converters:
        rows = compiled.compiler.apply_converters(fetched, compiled.converters)
    if compiled.model is not None:
        return [_instance(compiled, using, row) for row in rows]
    if compiled.flat:
        return [row[0] for row in rows]
    return [tuple(row) for row in rows] if compiled.converters else list(rows)


def _instance(compiled: _Compiled, using: str, row: Any) -> Model:
    """A model row as ModelIterable makes it: the model's columns first, then its annotations set on it."""
    assert compiled.model is not None
    instance = compiled.model.from_db(using, compiled.attnames, row[: len(compiled.attnames)])
    for name, column in compiled.annotations:
        setattr(instance, name, row[column])
    return instance


# --- read-ahead -------------------------------------------------------------------------------------------

Read = tuple[FixedQuery, dict[str, Any]]
# Rows fetched ahead in this thread (or task), by (query, database, its parameters); each is handed out once.
_read_ahead: ContextVar[dict[tuple[Any, ...], list[Any]] | None] = ContextVar(
    "mnemo_read_ahead", default=None
)


def _key(params: list[Any]) -> tuple[Any, ...]:
    return tuple(repr(p) if isinstance(p, list | dict) else p for p in params)


@contextlib.contextmanager
def read_ahead(reads: Iterable[Read], *, using: str = "default") -> Iterator[None]:
    """Within the block, each of these fixed reads answers from rows fetched on entering it, all in one round
    trip (PostgreSQL's pipeline mode), the first time it is run with the same values; a second run reads
    again. For a request that makes many small independent reads: under load each round trip waits for the
    database's process to be scheduled, and the waits added up to more than the reads cost. Elsewhere
    (SQLite answers in process) nothing is read ahead and every read runs where it is asked for. A read
    ahead that fails leaves its reads to run as asked for (the error, if it is real, is raised there)."""
    connection = connections[using]
    fetched: dict[tuple[Any, ...], list[Any]] = {}
    if connection.vendor == "postgresql":
        try:
            fetched = _pipelined(list(reads), using)
        except Exception:  # each read then runs on its own, and raises there if it must
            logger.warning("reading ahead failed; each read runs when asked for", exc_info=True)
            fetched = {}
    token = _read_ahead.set(fetched)
    try:
        yield
    finally:
        _read_ahead.reset(token)


@contextlib.contextmanager
def writes_pipelined(*, using: str = "default") -> Iterator[None]:
    """Within the block, statements go to PostgreSQL without waiting for each one's answer, and the answers
    come back together on leaving it (pipeline mode). Outside a transaction they run as one implicit
    transaction in one round trip; inside one (or when a statement opens one, as bulk_create does) psycopg
    waits for the BEGIN first. A statement whose result is read (a RETURNING, a row count) waits there. For
    writes whose only failure is the database's own (an INSERT … ON CONFLICT DO NOTHING, a row whose key is
    made here): an error surfaces at the block's end, not at its statement. Elsewhere (SQLite) nothing
    changes."""
    connection = connections[using]
    connection.ensure_connection()
    if connection.vendor != "postgresql":
        yield
        return
    # Django's error classes, as a statement's own failure would raise (an IntegrityError, not psycopg's).
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield


# --- reads beside the request ----------------------------------------------------------------------------

# Threads that run a request's independent reads, each on a pooled connection of its own (beside()).
BESIDE_THREADS = 8
_beside: ThreadPoolExecutor | None = None
_beside_lock = threading.Lock()


def beside(read: Callable[[], T], *, using: str = "default") -> Callable[[], T]:
    """Start `read` (a function that only reads the database) now, on another thread with a connection of
    its own, so that its round trips wait at the same time as the caller's instead of after them; the
    function returned gives its result (or raises its error). For a request's independent searches: under
    load each round trip waits for the database's process to be scheduled, and a call's waits added up.
    It runs in a copy of the caller's context (its read-ahead rows, tenant scope and fault list). Where
    another connection could not see what the caller's sees (inside a transaction: its uncommitted rows)
    or gains nothing (SQLite answers in process), `read` runs here, now. A read no thread has taken yet
    when its result is asked for runs then, in the caller: a busy pool never makes the caller wait."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        value = read()
        return lambda: value
    context = contextvars.copy_context()
    future = _beside_pool().submit(_on_own_connection, context, read, using)

    def result() -> T:
        if future.cancel():  # still queued: run it here rather than wait for a thread
            return read()
        return future.result()

    return result


def _beside_pool() -> ThreadPoolExecutor:
    global _beside
    with _beside_lock:
        if _beside is None:
            _beside = ThreadPoolExecutor(max_workers=BESIDE_THREADS, thread_name_prefix="mnemo-beside")
        return _beside


def _on_own_connection(context: contextvars.Context, read: Callable[[], T], using: str) -> T:
    try:
        return context.run(read)
    finally:
        connections[using].close()  # back to the pool, not held by an idle thread


def _pipelined(reads: list[Read], using: str) -> dict[tuple[Any, ...], list[Any]]:
    connection = connections[using]
    bound = [(query, *query.bound(using, values)) for query, values in reads]
    with contextlib.ExitStack() as stack:
        cursors = [stack.enter_context(connection.cursor()) for _ in bound]
        # Each execute only sends its statement; leaving the block syncs and receives every result.
        with connection.connection.pipeline():
            for cursor, (_, compiled, params) in zip(cursors, bound, strict=True):
                cursor.execute(compiled.sql, params)
        return {
            (query, using, _key(params)): cursor.fetchall()
            for cursor, (query, _, params) in zip(cursors, bound, strict=True)
        }


def _is_sample(param: Any, sample: Any) -> bool:
    """The compiled parameter stands for the sample: the value itself (or a backend's subclass of its type,
    psycopg's Int8), or a UUID's hex (SQLite)."""
    if isinstance(param, type(sample)) and param == sample:
        return True
    return isinstance(sample, uuid.UUID) and param == sample.hex


def _cast(param: Any, sample: Any) -> Callable[[Any], Any]:
    """How a value is sent where the compiled parameter stood: as the ORM sent the sample."""
    if isinstance(sample, uuid.UUID) and not isinstance(param, uuid.UUID):
        return lambda value: value.hex
    if type(param) is not type(sample):
        return type(param)  # e.g. Int8: the prepared statement's parameter type stays the same
    return lambda value: value


def _like(sample: Any, value: Any) -> Any:
    """The value as the sample's type (a conversation id may come as a string); None has no fixed SQL."""
    if value is None:
        raise TypeError("FixedQuery: None changes the SQL (IS NULL); use another query for it")
    if isinstance(value, Model):
        value = value.pk
    if isinstance(sample, uuid.UUID) and not isinstance(value, uuid.UUID):
        return uuid.UUID(str(value))
    if isinstance(sample, int) and not isinstance(sample, bool):
        return int(value)
    return value


_UUID_CHARACTERS = re.compile(r"[0-9a-fA-F,-]*")


def column_by_pk(
    model: type[Model], column: str, pks: list[str], *, using: str = "default"
) -> dict[str, Any]:
    """{str(pk): the row's `column`} for the rows of `model` (a UUID primary key) whose key is in `pks`; for
    a column the database returns as Python wants it (text, numbers). On PostgreSQL the keys go as one array
    parameter: with a few hundred of them (a context call's message hits), Django building and psycopg
    parsing one placeholder per key cost more than the database took to answer."""
    if not pks:
        return {}
    connection = connections[using]
    if connection.vendor != "postgresql":
        rows = model._default_manager.using(using).filter(pk__in=pks).values_list("pk", column)
        return {str(pk): value for pk, value in rows}
    from psycopg import sql

    meta = model._meta
    statement = sql.SQL("SELECT {key}, {column} FROM {table} WHERE {key} = ANY(%s::uuid[])").format(
        key=sql.Identifier(str(meta.pk.column)),
        column=sql.Identifier(str(meta.get_field(column).column)),  # type: ignore[union-attr]
        table=sql.Identifier(meta.db_table),
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [_uuid_array(pks)])
        return {str(pk): value for pk, value in cursor.fetchall()}


def _uuid_array(pks: list[str]) -> str:
    """The keys as one PostgreSQL array literal (cast to uuid[] by the statement): psycopg dumps a list of
    UUIDs one object at a time, and a context call's hits are hundreds. PostgreSQL refuses a malformed key;
    one with other characters than hex digits and hyphens goes through uuid.UUID first, so that no key can
    change the literal."""
    literal = ",".join(str(pk) for pk in pks)
    if not _UUID_CHARACTERS.fullmatch(literal):
        literal = ",".join(str(uuid.UUID(str(pk))) for pk in pks)
    return "{" + literal + "}"
