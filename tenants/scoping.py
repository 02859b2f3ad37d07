"""Fetching tenant objects. Every lookup goes through here so an object of another tenant is a 404,
never a 403 and never a leak."""

import uuid
from typing import TypeVar

from django.db import models
from django.http import Http404

from tenants.models import EndUser, Tenant

M = TypeVar("M", bound=models.Model)


def access_object(queryset: models.QuerySet[M], *, pk: object, **scope: object) -> M:
    """The object with this pk inside its scope (tenant=… or a parent already fetched through its
    tenant, e.g. conversation=…), else Http404, also for a malformed id."""
    if not scope:
        raise TypeError("access_object needs a scope, e.g. tenant=tenant")
    if isinstance(queryset.model._meta.pk, models.UUIDField) and not isinstance(pk, uuid.UUID):
        try:
            pk = uuid.UUID(str(pk))
        except ValueError:
            raise Http404 from None
    try:
        return queryset.get(pk=pk, **scope)
    except (queryset.model.DoesNotExist, ValueError, TypeError):
        raise Http404 from None


def access_end_user(*, tenant: Tenant, external_id: str) -> EndUser:
    try:
        return EndUser.objects.get(tenant=tenant, external_id=external_id)
    except EndUser.DoesNotExist:
        raise Http404 from None
