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
    assert response.json() == {"error": {"code": "not_found", "message": "No such endpoint.", "extra": {}}}


def test_a_cached_key_costs_no_query_and_any_change_to_it_takes_effect_at_once(
    owner, django_assert_num_queries
):
    owner.client.get(URL)  # fills the cache (and records the use)
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
