"""Fetching tenant objects. Every lookup goes through here so an object of another tenant is a 404,
never a 403 and never a leak."""

import uuid
from typing import Any, Generic, TypeVar

from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import connections, models
from django.http import Http404

from tenants.models import EndUser, Tenant
from tenants.validation import text_is_clean

M = TypeVar("M", bound=models.Model)


def _pk_or_404(model: type[models.Model], pk: object) -> object:
    """The primary key as its field's Python value; a malformed id is a 404, not a 500."""
    field = model._meta.pk
    try:
        if isinstance(field, models.UUIDField) and not isinstance(pk, uuid.UUID):
            return uuid.UUID(str(pk))  # not to_python: it would read an integer as a UUID
        return field.to_python(pk)
    except (ValueError, TypeError, ValidationError):
        raise Http404 from None


def access_object(queryset: models.QuerySet[M], *, pk: object, **scope: object) -> M:
    """The object with this pk inside its scope (tenant=… or a parent already fetched through its
    tenant, e.g. conversation=…), else Http404, also for a malformed id."""
    if not scope:
        raise TypeError("access_object needs a scope, e.g. tenant=tenant")
    pk = _pk_or_404(queryset.model, pk)
    try:
        return queryset.get(pk=pk, **scope)
    except (ObjectDoesNotExist, ValueError, TypeError):  # the model's DoesNotExist subclasses it
        raise Http404 from None


class ScopedRowLookup(Generic[M]):
    """One row by primary key inside a scope column, with the row of one nullable foreign key joined, as a
    fixed statement built once from the models' metadata: what access_object(qs.select_related(fk), pk=…,
    scope=…) does, for the lookups every request of an endpoint family starts with. Django compiles a
    queryset anew on every call (for a conversation with its end user, several times the round trip in CPU);
    the values go through the same database converters the ORM applies.

    Kept because a benchmark shows it pays (bench/append.py; docs/benchmarks.md, Appends over HTTP).
    Without that margin, access_object(select_related) does the same."""

    def __init__(self, model: type[M], *, scope: str, related: str) -> None:
        self.model = model
        scope_field = model._meta.get_field(scope)
        related_field = model._meta.get_field(related)
        if not isinstance(scope_field, models.Field) or not isinstance(related_field, models.ForeignKey):
            raise TypeError(f"{model.__name__}: {scope} must be a column and {related} a foreign key")
        related_model = related_field.related_model
        if not isinstance(related_model, type):  # "self" or a name: the models are not loaded yet
            raise TypeError(f"{model.__name__}.{related}: its model is not resolved")
        self.scope_field: models.Field[Any, Any] = scope_field
        self.related_field: models.ForeignKey[Any, Any] = related_field
        self.related_model = related_model
        self._related_pk_index = list(self.related_model._meta.concrete_fields).index(
            self.related_model._meta.pk
        )
        self._prepared: dict[str, tuple[str, list[Any], list[Any]]] = {}

    def _prepare(self, connection: Any) -> tuple[str, list[Any], list[Any]]:
        quote = connection.ops.quote_name
        own = self.model._meta.concrete_fields
        joined = self.related_model._meta.concrete_fields
        columns = [f"o.{quote(f.column)}" for f in own] + [f"r.{quote(f.column)}" for f in joined]
        sql = (
            f"SELECT {', '.join(columns)} FROM {quote(self.model._meta.db_table)} o "  # noqa: S608
            f"LEFT OUTER JOIN {quote(self.related_model._meta.db_table)} r "
            f"ON r.{quote(self.related_model._meta.pk.column)} = o.{quote(self.related_field.column)} "
            f"WHERE o.{quote(self.model._meta.pk.column)} = %s AND o.{quote(self.scope_field.column)} = %s"
        )

        def converters(fields: Any, alias: str) -> list[Any]:
            out = []
            for field in fields:
                col = field.get_col(alias)
                found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
                out.append((field.attname, col, found))
            return out

        return sql, converters(own, "o"), converters(joined, "r")

    def get(self, *, pk: object, scope_value: object, using: str = "default") -> M:
        """The row, else Http404 (also for a malformed pk)."""
        connection = connections[using]
        params = [
            self.model._meta.pk.get_db_prep_value(_pk_or_404(self.model, pk), connection),
            self.scope_field.get_db_prep_value(scope_value, connection),
        ]
        prepared = self._prepared.get(connection.vendor)
        if prepared is None:
            prepared = self._prepared[connection.vendor] = self._prepare(connection)
        sql, own, joined = prepared
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            raise Http404
        obj: M = self._build(self.model, own, row[: len(own)], connection, using)
        related_values = row[len(own) :]
        related = None
        if related_values[self._related_pk_index] is not None:  # else no related row (a NULL key)
            related = self._build(self.related_model, joined, related_values, connection, using)
        self.related_field.set_cached_value(obj, related)
        return obj

    @staticmethod
    def _build(model: Any, fields: list[Any], values: Any, connection: Any, using: str) -> Any:
        converted = []
        for (_attname, col, found), value in zip(fields, values, strict=True):
            for converter in found:
                value = converter(value, col, connection)
            converted.append(value)
        return model.from_db(using, [attname for attname, _col, _found in fields], converted)


def access_end_user(*, tenant: Tenant, external_id: str) -> EndUser:
    """The tenant's end user with this id, else Http404, also for an id no end user can have (too long for
    the column, a NUL), which is not sent to the database."""
    if not text_is_clean(external_id, max_length=EndUser._meta.get_field("external_id").max_length):
        raise Http404
    try:
        return EndUser.objects.get(tenant=tenant, external_id=external_id)
    except EndUser.DoesNotExist:
        raise Http404 from None
