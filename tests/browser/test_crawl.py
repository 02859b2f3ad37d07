"""Every page of the admin a role is offered renders without a server error or a browser console error:
from the index, each changelist and add page and custom view; from each changelist, its first
object's change page and its object tools (dashboards, the inspector)."""

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from tests.browser.conftest import AdminPage

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SKIP = ("/admin/logout/", "/admin/password_change/", "/admin/r/")
# Add pages and Django's history pages share their templates with the change pages crawled; leaving them out
# keeps the crawl inside the suite's time budget (the add forms that matter have tests of their own).
SKIP_ENDINGS = ("/add/", "/history/")


def _admin_links(page: AdminPage, selector: str) -> list[str]:
    hrefs = page.page.eval_on_selector_all(selector, "els => els.map(e => e.href)")
    paths = []
    for href in hrefs:
        parts = urlsplit(href)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        wanted = parts.path.startswith("/admin/") and not parts.path.startswith(SKIP)
        if wanted and not parts.path.endswith(SKIP_ENDINGS) and path not in paths:
            paths.append(path)
    return paths


def crawl(page: AdminPage, check: Callable[[str], None] = lambda path: None) -> list[str]:
    """The paths visited, each asserted 200 and clean, and passed to `check` while open."""
    seen: list[str] = []

    def visit(path: str) -> bool:
        if path in seen:
            return False
        page.open(path)
        seen.append(path)
        check(path)
        return True

    visit("/admin/")
    for path in _admin_links(page, "#content-main a"):
        if not visit(path):
            continue
        first = _admin_links(page, "#result_list tbody tr th a, #result_list tbody tr td a")[:1]
        for extra in [*first, *_admin_links(page, ".object-tools a")]:
            if visit(extra):
                # The change page's own tools (the inspector of a conversation…).
                for more in _admin_links(page, ".object-tools a"):
                    visit(more)
    return seen


def test_superuser_sees_every_page_render(login, world):
    seen = crawl(login("superuser"))
    for must in (
        "/admin/conversations/conversation/",
        "/admin/conversations/message/",
        "/admin/memory/corememoryblock/",
        "/admin/context/agentprofile/inspector/",
        "/admin/tenants/tenant/",
    ):
        assert must in seen
    assert any(p.startswith("/admin/conversations/conversation/") and "/change/" in p for p in seen)
    assert len(seen) > 30, seen


@pytest.mark.parametrize("role", ["operator", "support"])
def test_a_tenant_member_sees_every_offered_page_render_and_no_other_tenant(login, world, role):
    page = login(role)

    def no_other_tenant(path: str) -> None:
        html = page.page.content()
        assert "Globex" not in html and "globex" not in html and "mallory" not in html, path

    seen = crawl(page, no_other_tenant)
    assert "/admin/conversations/conversation/" in seen
    assert not any(p.startswith("/admin/tenants/membership/") for p in seen)
