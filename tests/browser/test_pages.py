"""Pages an operator works with, as the browser lays them out: the message list at 1,400 px,
a conversation's transcript, readable values."""

import pytest

from tests.browser.conftest import doc_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAYOUT = """() => {
    const table = document.querySelector("#result_list");
    const content = table.querySelector("td.field-preview");
    return {
        page: document.documentElement.scrollWidth,
        viewport: window.innerWidth,
        table: table.getBoundingClientRect().right,
        room: table.parentElement.getBoundingClientRect().right,
        content: content.getBoundingClientRect().width,
    };
}"""


def test_the_message_list_fits_1400_px_and_gives_the_content_room(login, world):
    page = login("superuser")
    page.open("/admin/conversations/message/")
    assert page.page.viewport_size["width"] == 1400
    layout = page.page.evaluate(LAYOUT)
    assert layout["page"] <= layout["viewport"], layout  # nothing cut off or scrolled sideways
    assert layout["table"] <= layout["room"] + 1, layout
    assert layout["content"] >= 220, layout  # it was 80 px


def test_a_conversation_page_reads_like_a_conversation(login, world):
    page = login("support")
    page.open(f"/admin/conversations/conversation/{world.conversation.pk}/change/?transcript_page=1")
    transcript = page.page.locator("#transcript")
    assert transcript.locator(".mnemo-boundary").count() == 1
    assert "partial: the reply was cut off" in transcript.inner_text()
    image = transcript.locator(".mnemo-images img").first
    image.scroll_into_view_if_needed()
    page.page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())
    page.assert_clean()
    doc_screenshot(page, "conversation")


def _luminance(css_color: str) -> float:
    red, green, blue = (int(v) for v in css_color[css_color.index("(") + 1 : -1].split(",")[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_cache_dashboard_charts_read_in_light_and_dark_mode(login, world, scheme):
    page = login("operator", color_scheme=scheme)
    page.open("/admin/prefix_cache/cacheusage/dashboard/")
    assert "gpt-4o" in page.text("#content")
    charts = page.page.locator("#dashboard-charts svg")
    # Tokens, compactions, context latency p50/p95, storage; the seed's context call took no fallback.
    assert charts.count() == 4
    assert page.page.locator("#no-degradations").count() == 1
    background = page.page.evaluate("getComputedStyle(document.body).backgroundColor")
    for chart in charts.all():
        label = chart.locator("text").first.evaluate("t => getComputedStyle(t).fill")
        assert abs(_luminance(label) - _luminance(background)) > 0.5, (label, background)
    if scheme == "light":
        doc_screenshot(page, "dashboard")
