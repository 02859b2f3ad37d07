"""Writes for tenants, API keys and end users."""

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from tenants.errors import ApplicationError
from tenants.models import ApiKey, EndUser, Tenant, hash_api_key
from tenants.receivers import api_keys_uncache
from tenants.settings_schema import SettingsInvalid, settings_validate
from tenants.validation import text_is_clean


@transaction.atomic
def tenant_create(*, slug: str, name: str = "", settings: dict | None = None) -> tuple[Tenant, str]:
    """A tenant with its first API key; returns the raw key, which is shown once and never stored."""
    if not slug or slugify(slug) != slug:
        raise ApplicationError(
            f"{slug!r} is not a valid slug (lowercase letters, digits, hyphens).", code="invalid_slug"
        )
    if Tenant.objects.filter(slug=slug).exists():
        raise ApplicationError(f"A tenant with slug {slug!r} exists.", code="tenant_exists", status_code=409)
    tenant = Tenant.objects.create(
        slug=slug, name=name or slug, settings=tenant_settings_check(settings or {})
    )
    _, raw_key = api_key_create(tenant=tenant, name="default")
    return tenant, raw_key


def tenant_settings_check(settings: object) -> dict:
    """Settings as they may be stored (tenants/settings_schema.py), else a 400 invalid_settings naming every
    unknown key and bad value in extra.fields: every writer of tenant settings goes through here or the
    admin's form, which checks the same schema."""
    try:
        return settings_validate(settings)
    except SettingsInvalid as exc:
        raise ApplicationError(
            f"Invalid tenant settings: {exc}", code="invalid_settings", extra={"fields": exc.errors}
        ) from None


def api_key_create(*, tenant: Tenant, name: str = "default") -> tuple[ApiKey, str]:
    # The lookup prefix is random; a collision is astronomically rare but cheap to retry.
    for _ in range(5):
        raw_key, lookup = ApiKey.generate()
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    tenant=tenant, name=name, prefix=lookup, hashed_key=hash_api_key(raw_key)
                )
        except IntegrityError:
            continue
        return key, raw_key
    raise RuntimeError("could not allocate a unique API key prefix")


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    api_keys_uncache([api_key.prefix])  # update() sends no signal
    api_key.refresh_from_db(fields=["revoked_at"])
    return api_key


def check_external_id(external_id: str) -> str:
    """An end user's id as a client may create it: 1..255 characters (the column), none of them NUL or a
    lone surrogate. PostgreSQL would refuse it with an error (500); SQLite would store it whole."""
    limit = EndUser._meta.get_field("external_id").max_length
    if not text_is_clean(external_id, max_length=limit):
        raise ApplicationError(
            f"An end user id is 1 to {limit} characters, without NUL or surrogate characters.",
            code="invalid_end_user_id",
            extra={"max_length": limit},
        )
    return external_id


def end_user_get_or_create(*, tenant: Tenant, external_id: str) -> EndUser:
    check_external_id(external_id)
    try:
        with transaction.atomic():
            end_user, _ = EndUser.objects.get_or_create(tenant=tenant, external_id=external_id)
    except IntegrityError:
        # Two requests created the same user at once; the other one won.
        end_user = EndUser.objects.get(tenant=tenant, external_id=external_id)
    return end_user
