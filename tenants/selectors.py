"""Reads for tenants and API keys."""

import hmac

from tenants.models import ApiKey, hash_api_key, split_api_key


def api_key_resolve(*, raw_key: str) -> ApiKey | None:
    """The active key matching raw_key (with its tenant loaded), or None."""
    lookup = split_api_key(raw_key)
    if lookup is None:
        return None
    key = ApiKey.objects.active().select_related("tenant").filter(prefix=lookup).first()
    if key is None or not hmac.compare_digest(key.hashed_key, hash_api_key(raw_key)):
        return None
    return key
