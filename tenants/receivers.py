"""Cache invalidation: a cached API key (with its tenant) is dropped when the key or its tenant changes; and
each request starts outside every tenant's query-embedding cache."""

from typing import Any

from django.core.cache import cache
from django.core.signals import request_started
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from providers.embeddings import query_cache_scope_set
from tenants.models import ApiKey, Tenant
from tenants.selectors import api_key_cache_key


def api_keys_uncache(prefixes: list[str]) -> None:
    keys = [api_key_cache_key(p) for p in prefixes]
    if not keys:
        return
    cache.delete_many(keys)
    # Once more when the change commits (at once outside a transaction): until then other connections still
    # read the old row, and a request that authenticated meanwhile cached it again (the admin saves inside a
    # transaction). Without this, a settings change or a revocation could wait for the entry to expire.
    transaction.on_commit(lambda: cache.delete_many(keys))


@receiver([post_save, post_delete], sender=ApiKey)
def _api_key_changed(sender: Any, instance: ApiKey, **kwargs: Any) -> None:
    api_keys_uncache([instance.prefix])


@receiver([post_save, post_delete], sender=Tenant)
def _tenant_changed(sender: Any, instance: Tenant, **kwargs: Any) -> None:
    api_keys_uncache(list(ApiKey.objects.filter(tenant_id=instance.pk).values_list("prefix", flat=True)))


@receiver(request_started)
def _request_started(sender: Any, **kwargs: Any) -> None:
    # Server threads are reused: a request that never authenticates with a key (the admin's context
    # inspector) must not cache its queries under the tenant of the thread's previous request.
    query_cache_scope_set(None)
