"""Cache invalidation: a cached API key (with its tenant) is dropped when the key or its tenant changes."""

from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

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
