"""API-key authentication for DRF: `Authorization: Bearer <key>` binds the request to one tenant."""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from providers.embeddings import query_cache_scope_set
from tenants.models import ApiKey, Tenant
from tenants.selectors import (
    api_key_cache_key,
    api_key_cache_seconds,
    api_key_cache_shared,
    api_key_resolve,
)


class ApiClient:
    """The caller behind an API key: authenticated, bound to exactly one tenant, never staff."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.tenant: Tenant = api_key.tenant
        self.pk = None

    def __str__(self) -> str:
        return f"api-key {self.api_key.prefix} ({self.tenant.slug})"


def bearer_token(header_value: str | bytes | None) -> str | None:
    if not header_value:
        return None
    if isinstance(header_value, bytes):
        header_value = header_value.decode("latin-1")
    scheme, _, token = header_value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def api_key_touch(api_key: ApiKey) -> None:
    """Record use, at most once per MNEMO_API_KEY_TOUCH_SECONDS, with a conditional update so concurrent
    requests do not all write."""
    now = timezone.now()
    interval = timedelta(seconds=settings.MNEMO_API_KEY_TOUCH_SECONDS)
    if api_key.last_used_at is not None and now - api_key.last_used_at < interval:
        return
    stale = ApiKey.objects.filter(pk=api_key.pk)
    if api_key.last_used_at is not None:
        stale = stale.filter(last_used_at__lte=now - interval)
    stale.update(last_used_at=now)
    api_key.last_used_at = now
    seconds = api_key_cache_seconds()
    if not seconds:
        return
    # The cached copy carries last_used_at too; refresh it or every request would try the update again.
    cache_key = api_key_cache_key(api_key.prefix)
    if not api_key_cache_shared():
        # Setting a process's own entry anew would stretch how late a revocation made elsewhere is seen:
        # drop it, and the next request reads the row (last_used_at included) once more.
        cache.delete(cache_key)
        return
    # Refresh the entry that is cached now, never write this request's copy back: the key or its tenant
    # may have changed since this request read it, and the change dropped the entry; writing the old copy
    # back would bring the old settings (or a revoked key) back until the entry expired.
    cached = cache.get(cache_key)
    if cached is not None and cached.pk == api_key.pk:
        cached.last_used_at = now
        cache.set(cache_key, cached, seconds)


def authenticate_raw_key(raw_key: str | None) -> ApiKey | None:
    """The active key, or None. Also binds the request to its tenant's query-embedding cache (none for a
    refused key): every API, proxy and socket request passes here first, on the thread that serves it."""
    api_key = api_key_resolve(raw_key=raw_key) if raw_key else None
    query_cache_scope_set(str(api_key.tenant_id) if api_key is not None else None)
    if api_key is not None:
        api_key_touch(api_key)
    return api_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[ApiClient, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        raw_key = bearer_token(header)
        if raw_key is None:
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        api_key = authenticate_raw_key(raw_key)
        if api_key is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        return ApiClient(api_key), api_key

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class HasTenant(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, ApiKey)
