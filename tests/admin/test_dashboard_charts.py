"""#18 item 8 (part): the cache dashboard draws its days as server-side SVG (no script, no CDN) in colours
that hold in dark mode: tokens sent, cached and predicted, compactions a day, image storage by tier."""

import pytest
from django.urls import reverse

from tests.cold_storage.helpers import frame, image_part

pytestmark = pytest.mark.django_db


def test_the_dashboard_draws_tokens_compactions_and_storage_as_svg(client, owner, member, conversation):
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
    charts = html.split('id="dashboard-charts"')[1].split("</div>")[0]
    assert charts.count("<svg") == 3
    for series in ("prompt tokens", "cached (actual)", "cacheable (predicted)"):
        assert f'data-series="{series}"' in charts
    assert 'class="mnemo-bar"' in charts and "Compactions a day" in charts and "hot" in charts
    assert 'fill="currentColor"' in charts  # labels follow the theme's text colour
    assert "<script" not in charts and "http" not in charts.replace("http://www.w3.org/2000/svg", "")
