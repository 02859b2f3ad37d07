"""the cache dashboard draws its days as server-side SVG (no script, no CDN) in colours that
hold in dark mode: tokens sent, cached and predicted, compactions a day, context latency p50/p95,
degradations by code and image storage by tier; a scoped user sees only their tenants' series."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from prefix_cache.services import context_call_record
from tests.cold_storage.helpers import frame, image_part

pytestmark = pytest.mark.django_db


def charts_of(html: str) -> str:
    return html.split('id="dashboard-charts"')[1].split("</div>")[0]


def figure(charts: str, title: str) -> str:
    """The <figure> of the chart titled `title`."""
    return "<figure" + next(f for f in charts.split("<figure") if f'aria-label="{title}' in f)


def test_the_dashboard_draws_tokens_compactions_latency_and_storage_as_svg(
    client, owner, member, conversation
):
    base = f"/api/v1/conversations/{conversation.id}"
    items = [{"role": "user", "content": f"Message {i} about build {4100 + i}."} for i in range(40)]
    for item in items:
        owner.client.post(f"{base}/messages", item, format="json")
    owner.client.post(f"{base}/compact", {}, format="json")
    parts = [image_part(frame(2))]
    owner.client.post(f"{base}/messages", {"role": "user", "content": "", "parts": parts}, format="json")
    context = owner.client.post(f"{base}/context", {"user_message": "Which?"}, format="json").json()
    usage = {"prompt_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 1024}}
    owner.client.post(f"{base}/usage", {"usage": usage, "context_id": context["context_id"]}, format="json")
    client.force_login(member.user)
    html = client.get(reverse("admin:prefix_cache_dashboard")).content.decode()
    charts = charts_of(html)
    assert charts.count("<svg") == 4  # the context call made no degradation: no chart for them
    assert 'id="no-degradations"' in charts
    for series in ("prompt tokens", "cached (actual)", "cacheable (predicted)", "p50 (ms)", "p95 (ms)"):
        assert f'data-series="{series}"' in charts
    assert 'class="mnemo-bar"' in charts and "Compactions a day" in charts and "hot" in charts
    assert 'fill="currentColor"' in charts  # labels follow the theme's text colour
    assert "<script" not in charts and "http" not in charts.replace("http://www.w3.org/2000/svg", "")


def test_latency_and_degradation_charts_draw_the_recorded_days(client, owner, member):
    today = timezone.now()
    record = context_call_record
    for ms in (10, 20, 30, 40, 400):
        record(tenant_id=owner.tenant.pk, milliseconds=ms, degradation_codes=["unknown_model"], at=today)
    record(tenant_id=owner.tenant.pk, milliseconds=8, degradation_codes=[], at=today - timedelta(days=1))
    for code in ("a_code", "b_code", "c_code", "d_code", "e_code"):  # past the palette: the last is "other"
        record(tenant_id=owner.tenant.pk, milliseconds=8, degradation_codes=[code], at=today)
    record(
        tenant_id=owner.tenant.pk, milliseconds=8, degradation_codes=["old"], at=today - timedelta(days=91)
    )

    client.force_login(member.user)
    charts = charts_of(client.get(reverse("admin:prefix_cache_dashboard")).content.decode())
    latency = figure(charts, "Context call latency a day")
    assert latency.count("<circle") == 4  # two series, two days (the 91-day-old hour is left out)
    assert 'data-series="p50 (ms)"' in latency and 'data-series="p95 (ms)"' in latency
    assert "<text" in latency and 'fill="currentColor"' in latency
    degradations = figure(charts, "Context calls a day that took a fallback")
    series = [s.split('"')[0] for s in degradations.split('data-series="')[1:]]
    assert series == ["unknown_model", "a_code", "b_code", "c_code", "other"]
    assert "(5 on the last day)" in degradations and "(2 on the last day)" in degradations  # other: d, e
    assert "old" not in series and 'id="no-degradations"' not in charts


def test_a_scoped_user_sees_only_their_tenants_series(client, owner, outsider, member):
    now = timezone.now()
    context_call_record(tenant_id=owner.tenant.pk, milliseconds=12, degradation_codes=["owner_code"], at=now)
    context_call_record(
        tenant_id=outsider.tenant.pk, milliseconds=900, degradation_codes=["secret_code"], at=now
    )
    client.force_login(member.user)
    for query in ("", "?tenant=outsider"):  # naming another tenant falls back to the user's own
        html = client.get(reverse("admin:prefix_cache_dashboard") + query).content.decode()
        charts = charts_of(html)
        assert 'data-series="owner_code"' in charts
        assert "secret_code" not in html and "outsider" not in html.split('id="content"')[1]
        latency = figure(charts, "Context call latency a day")
        assert ">12</text>" in latency and ">900</text>" not in latency  # the y axis tops at the owner's
