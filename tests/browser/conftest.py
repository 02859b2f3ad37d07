"""Browser tests: Playwright for Python drives Debian's Chromium against pytest-django's live
server. Without /usr/bin/chromium (or MNEMO_CHROMIUM) they skip, unless MNEMO_BROWSER_REQUIRED=1 (make
test-browser, which CI runs): then a missing browser, and any skip, is a failure. A failing test leaves a
screenshot of each of its pages next to the test report (the --junitxml folder, else var/test-reports/).
With MNEMO_DOC_SCREENSHOTS=1 the tests also rewrite the pictures of docs/admin.md (docs/img/)."""

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from tests.browser.seed import World, seed_world, session_cookie

CHROMIUM = os.environ.get("MNEMO_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("MNEMO_BROWSER_REQUIRED") == "1"
DOC_IMAGES = Path(settings.BASE_DIR) / "docs" / "img"
VIEWPORT = {"width": 1400, "height": 900}


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (MNEMO_BROWSER_REQUIRED=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    # Playwright's sync API keeps an event loop on this thread, which Django takes for an async context;
    # the ORM calls of these tests are synchronous, so the check is lifted for this module only.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class AdminPage:
    """One logged-in tab: `open` asserts the page answered 200 and the browser logged no error."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def open(self, path: str, *, status: int = 200) -> Any:
        url = path if path.startswith("http") else self.base_url + path
        response = self.page.goto(url)
        assert response is not None and response.status == status, (path, response and response.status)
        self.assert_clean(path)
        return response

    def assert_clean(self, where: str = "") -> None:
        errors, self.errors[:] = list(self.errors), []
        assert not errors, (where or self.page.url, errors)

    def text(self, selector: str = "body") -> str:
        """The text of every element `selector` matches, one per line."""
        return "\n".join(self.page.locator(selector).all_inner_texts())

    def submit(self, selector: str = "input[type=submit][name=_save]") -> Any:
        with self.page.expect_navigation():
            self.page.locator(selector).first.click()
        self.assert_clean()


def _seed_on_a_thread() -> World:
    try:
        return seed_world()
    finally:
        connections.close_all()


@pytest.fixture
def world(db: Any) -> World:
    # Off the test's thread, where Playwright's event loop would stop the API's async_to_sync event calls.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_seed_on_a_thread).result()


@pytest.fixture
def login(request: pytest.FixtureRequest, browser: Any, live_server: Any, world: World) -> Any:
    """login(role) -> AdminPage of a fresh browser context logged in as "superuser", "operator" or
    "support"; the pages are kept on the test item for the failure screenshots."""
    contexts: list[Any] = []
    pages = request.node.stash.setdefault(PAGES, [])

    def open_as(role: str, **options: Any) -> AdminPage:
        context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url, **options)
        host = re.sub(r"^https?://|:\d+$", "", live_server.url)
        cookie = session_cookie(world.users[role])
        context.add_cookies([{"name": "sessionid", "value": cookie, "domain": host, "path": "/"}])
        contexts.append(context)
        page = AdminPage(context.new_page(), live_server.url)
        pages.append(page.page)
        return page

    yield open_as
    for context in contexts:
        context.close()


PAGES = pytest.StashKey[list]()


def doc_screenshot(page: AdminPage, name: str, selector: str | None = None) -> None:
    """Rewrite docs/img/<name>.png when MNEMO_DOC_SCREENSHOTS=1 (CI leaves the committed files alone)."""
    if os.environ.get("MNEMO_DOC_SCREENSHOTS") != "1":
        return
    DOC_IMAGES.mkdir(parents=True, exist_ok=True)
    target = page.page.locator(selector).first if selector else page.page
    target.screenshot(path=str(DOC_IMAGES / f"{name}.png"))


def _report_dir(config: pytest.Config) -> Path:
    xml = getattr(config.option, "xmlpath", None)
    return Path(xml).resolve().parent if xml else Path(settings.BASE_DIR) / "var" / "test-reports"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped:
        # CI must not pass on a browser suite that did not run.
        report.outcome = "failed"
        report.longrepr = f"skipped under MNEMO_BROWSER_REQUIRED=1: {report.longrepr}"
    if report.failed and report.when == "call":
        folder = _report_dir(item.config)
        folder.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", item.nodeid)
        for index, page in enumerate(item.stash.get(PAGES, [])):
            path = folder / f"{name}-{index}.png"
            try:
                page.screenshot(path=str(path), full_page=True)
            except Exception as exc:  # a closed page or a crashed browser: the report still stands
                report.sections.append(("screenshot", f"{path}: {exc}"))
            else:
                report.sections.append(("screenshot", str(path)))
