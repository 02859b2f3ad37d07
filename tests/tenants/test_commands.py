import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tenants.models import ApiKey, Tenant

pytestmark = pytest.mark.django_db


def test_create_tenant_json_prints_exactly_one_object_with_a_working_key():
    out = StringIO()
    call_command("create_tenant", "acme", "--name", "Acme Inc", "--json", stdout=out)
    payload = json.loads(out.getvalue())  # the whole output is one JSON document
    assert set(payload) == {"tenant_id", "slug", "api_key"}
    tenant = Tenant.objects.get(pk=payload["tenant_id"])
    assert (tenant.slug, tenant.name) == ("acme", "Acme Inc")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {payload['api_key']}")
    assert client.get("/api/v1/conversations").status_code == 200


def test_create_tenant_refuses_duplicates_and_bad_slugs():
    call_command("create_tenant", "acme", stdout=StringIO())
    with pytest.raises(CommandError, match="exists"):
        call_command("create_tenant", "acme", stdout=StringIO())
    with pytest.raises(CommandError, match="not a valid slug"):
        call_command("create_tenant", "Not A Slug", stdout=StringIO())
    assert Tenant.objects.count() == 1
    assert ApiKey.objects.count() == 1


def test_bootstrap_demo_creates_once(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    out = StringIO()
    call_command("bootstrap_demo", stdout=out)
    assert "MNEMO_API_KEY=mnemo_" in out.getvalue()
    credentials = (tmp_path / "demo-credentials.env").read_text()
    assert (tmp_path / "demo-credentials.env").stat().st_mode & 0o777 == 0o600
    key = next(
        line.split("=", 1)[1] for line in credentials.splitlines() if line.startswith("MNEMO_API_KEY=")
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/conversations").status_code == 200

    again = StringIO()
    call_command("bootstrap_demo", stdout=again)
    assert "exists" in again.getvalue()
    assert Tenant.objects.filter(slug="demo").count() == 1
    assert ApiKey.objects.count() == 1
