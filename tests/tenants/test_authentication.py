from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.models import ApiKey
from tenants.services import api_key_create, api_key_revoke

pytestmark = pytest.mark.django_db

URL = "/api/v1/conversations"


def test_missing_key_is_401_with_bearer_challenge(anonymous):
    response = anonymous.get(URL)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header",
    [
        "Token abc",
        "Bearer",
        "Bearer mnemo_short_x",
        "Bearer mnemo_abcdefgh_wrongsecret",
        "Basic dXNlcjpwdw==",
    ],
)
def test_malformed_or_unknown_key_is_401(anonymous, owner, header):
    anonymous.credentials(HTTP_AUTHORIZATION=header)
    response = anonymous.get(URL)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_key_with_right_prefix_and_wrong_secret_is_refused(anonymous, owner):
    tampered = owner.raw_key[:-4] + ("aaaa" if not owner.raw_key.endswith("aaaa") else "bbbb")
    anonymous.credentials(HTTP_AUTHORIZATION=f"Bearer {tampered}")
    assert anonymous.get(URL).status_code == 401


def test_revoked_key_is_refused_and_other_keys_still_work(owner):
    _, second_raw = api_key_create(tenant=owner.tenant, name="second")
    api_key_revoke(api_key=owner.tenant.api_keys.get(name="default"))
    assert owner.client.get(URL).status_code == 401
    owner.client.credentials(HTTP_AUTHORIZATION=f"Bearer {second_raw}")
    assert owner.client.get(URL).status_code == 200


def test_only_a_hash_is_stored(owner):
    key = ApiKey.objects.get(tenant=owner.tenant)
    secret = owner.raw_key.split("_")[2]
    assert secret not in key.hashed_key
    assert key.prefix == owner.raw_key.split("_")[1]
    assert len(key.hashed_key) == 64


def test_last_used_at_is_recorded_and_throttled(owner, settings):
    settings.MNEMO_API_KEY_TOUCH_SECONDS = 60
    settings.MNEMO_API_KEY_CACHE_SECONDS = 0  # the test moves last_used_at in the database
    key = ApiKey.objects.get(tenant=owner.tenant)
    assert key.last_used_at is None
    owner.client.get(URL)
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None
    owner.client.get(URL)
    key.refresh_from_db()
    assert key.last_used_at == first  # within the interval: no second write
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now() - timedelta(minutes=5))
    owner.client.get(URL)
    key.refresh_from_db()
    assert key.last_used_at > first - timedelta(minutes=4)


def test_schema_and_docs_are_public(anonymous):
    schema = anonymous.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/conversations/{conversation_id}/messages" in schema.content
    assert b"ErrorBody" in schema.content  # error responses are documented
    assert anonymous.get("/api/docs/").status_code == 200


def test_unknown_api_path_answers_in_the_error_shape(owner, settings):
    settings.DEBUG = False
    response = owner.client.get("/api/v1/nothing-here")
    assert response.status_code == 404
    request_id = response["X-Request-Id"]
    assert response.json() == {
        "error": {"code": "not_found", "message": "No such endpoint.", "extra": {}, "request_id": request_id}
    }


def test_a_cached_key_costs_no_query_and_any_change_to_it_takes_effect_at_once(
    owner, django_assert_num_queries
):
    owner.client.get(URL)  # records the use
    owner.client.get(URL)  # fills the cache, the use recorded
    from tenants.selectors import api_key_resolve

    with django_assert_num_queries(0):
        assert api_key_resolve(raw_key=owner.raw_key) is not None
    key = ApiKey.objects.get(tenant=owner.tenant)
    key.revoked_at = timezone.now()
    key.save()  # as the admin's change form does
    assert owner.client.get(URL).status_code == 401


def test_tenant_changes_reach_cached_keys(owner):
    owner.client.get(URL)
    owner.tenant.settings = {"default_model": "gpt-4.1"}
    owner.tenant.save()
    assert owner.client.post(URL, {}, format="json").json()["model"] == "gpt-4.1"


def test_a_key_cached_again_before_a_change_commits_is_dropped_when_it_commits(
    owner, django_capture_on_commit_callbacks
):
    """The admin saves inside a transaction. Until it commits, other connections still read the old row, and
    a request that authenticates meanwhile caches it again: the change must still reach the next request."""
    from django.core.cache import cache

    from tenants.selectors import api_key_cache_key, api_key_resolve

    owner.client.get(URL)
    before = api_key_resolve(raw_key=owner.raw_key)  # as another connection reads it before the commit
    with django_capture_on_commit_callbacks(execute=True):
        owner.tenant.settings = {"default_model": "gpt-4.1"}
        owner.tenant.save()
        cache.set(api_key_cache_key(before.prefix), before, 300)  # that request caches the old row
    assert owner.client.post(URL, {}, format="json").json()["model"] == "gpt-4.1"

    key = ApiKey.objects.get(tenant=owner.tenant)
    with django_capture_on_commit_callbacks(execute=True):
        api_key_revoke(api_key=key)
        cache.set(api_key_cache_key(before.prefix), before, 300)
    assert owner.client.get(URL).status_code == 401


def test_recording_a_keys_use_does_not_bring_back_settings_changed_meanwhile(owner, settings):
    """A request read the key (and its tenant), then the operator changed the tenant's settings, then the
    request records the key's use: that must not write the request's old copy back into the cache."""
    from tenants.authentication import api_key_touch
    from tenants.selectors import api_key_resolve

    settings.MNEMO_API_KEY_TOUCH_SECONDS = 60
    owner.client.get(URL)
    in_flight = api_key_resolve(raw_key=owner.raw_key)
    in_flight.last_used_at = timezone.now() - timedelta(minutes=5)  # due for a touch
    owner.tenant.settings = {"default_model": "gpt-4.1"}
    owner.tenant.save()
    api_key_touch(in_flight)
    assert owner.client.post(URL, {}, format="json").json()["model"] == "gpt-4.1"


LOCAL_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "keys"}}


def test_a_key_revoked_by_another_process_stops_working_within_seconds(owner, monkeypatch, settings):
    """Without Redis each process caches keys in its own memory, and a revocation drops only the entry of
    the process that made it: the others must see it within PROCESS_CACHE_KEY_SECONDS, on every surface."""
    import time

    from django.core.cache.backends import locmem
    from django.test import Client

    from tenants.selectors import PROCESS_CACHE_KEY_SECONDS

    settings.CACHES = LOCAL_CACHE  # as without REDIS_URL
    proxy = Client(headers={"Authorization": f"Bearer {owner.raw_key}"})
    assert owner.client.get(URL).status_code == 200
    assert proxy.get("/v1/models").status_code == 200  # both answer from this process's cache now
    # What the revocation in the other process leaves here: the row changed, this cache not told.
    ApiKey.objects.filter(tenant=owner.tenant).update(revoked_at=timezone.now())
    later = time.time() + PROCESS_CACHE_KEY_SECONDS + 0.5
    monkeypatch.setattr(locmem.time, "time", lambda: later)
    assert owner.client.get(URL).status_code == 401
    assert proxy.get("/v1/models").status_code == 401


def test_a_shared_cache_keeps_keys_as_long_as_configured(settings):
    from tenants.selectors import api_key_cache_seconds

    settings.MNEMO_API_KEY_CACHE_SECONDS = 300
    settings.CACHES = LOCAL_CACHE
    assert api_key_cache_seconds() <= 5
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache"}}
    assert api_key_cache_seconds() == 300  # every process drops the entry a revocation drops
