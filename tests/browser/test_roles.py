"""What each role does in the admin, in Chromium: support edits a memory block (the version
moves, an over-limit value and a stale form are refused), support is offered no key revocation and a forged
one revokes nothing, invalid tenant settings are refused, and the inspector assembles a context."""

import pytest

from memory.models import CoreMemoryBlock
from tenants.models import ApiKey, Tenant
from tests.browser.conftest import doc_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _block_url(world, label="preferences"):
    block = CoreMemoryBlock.objects.get(end_user__tenant=world.acme, label=label)
    return block, f"/admin/memory/corememoryblock/{block.pk}/change/"


def test_support_edits_a_memory_block_and_stale_or_oversized_edits_are_refused(login, world):
    support, operator = login("support"), login("operator")
    block, url = _block_url(world)
    support.open(url)
    support.page.fill("#id_value", "Likes green tea.")
    support.page.fill("#id_reason", "asked by phone")
    support.submit()
    assert "was changed successfully" in support.text(".messagelist")
    block.refresh_from_db()
    assert (block.value, block.version) == ("Likes green tea.", 2)

    support.open(url)
    support.page.fill("#id_value", "x" * (block.char_limit + 1))
    support.submit()
    assert "over the block's limit" in support.text(".errornote, .errorlist")
    block.refresh_from_db()
    assert block.version == 2

    # Both open version 2; the operator saves first, the support's older form is refused.
    support.open(url)
    operator.open(url)
    operator.page.fill("#id_value", "Likes coffee now.")
    operator.submit()
    support.page.fill("#id_value", "Likes tea, strongly.")
    support.submit()
    assert "Someone changed this block" in support.text(".errornote, .errorlist")
    block.refresh_from_db()
    assert (block.value, block.version) == ("Likes coffee now.", 3)
    support.open(url)
    doc_screenshot(support, "memory-block", "#content")


def test_support_is_offered_no_key_revocation_and_a_forged_one_revokes_nothing(login, world):
    support = login("support")
    support.open("/admin/tenants/apikey/")
    options = support.page.eval_on_selector_all("select[name=action] option", "os => os.map(o => o.value)")
    assert "revoke" not in options
    key = ApiKey.objects.get(tenant=world.acme)
    status = support.page.evaluate(
        """async (pk) => {
            const body = new URLSearchParams({action: "revoke", _selected_action: pk, index: "0",
                csrfmiddlewaretoken: document.cookie.match(/csrftoken=([^;]+)/)?.[1] ?? ""});
            const r = await fetch("/admin/tenants/apikey/", {method: "POST", body});
            return r.status;
        }""",
        str(key.pk),
    )
    assert status < 500
    key.refresh_from_db()
    assert key.revoked_at is None
    filters = support.text("#changelist-filter") if support.page.locator("#changelist-filter").count() else ""
    assert "globex" not in filters.lower()


def test_operator_is_refused_invalid_tenant_settings(login, world):
    operator = login("operator")
    operator.open(f"/admin/tenants/tenant/{world.acme.pk}/change/")
    # The browser's own checks (min, max, type) are switched off so the server's are the ones tested.
    operator.page.evaluate("document.querySelector('#tenant_form').noValidate = true")
    operator.page.fill("#id_token_budget", "12")
    operator.page.fill("#id_image_dedup_threshold", "65")
    operator.submit()
    errors = operator.text(".errornote")
    assert "correct the error" in errors.lower()
    assert "256" in operator.text(".field-token_budget")
    assert "64" in operator.text(".field-image_dedup_threshold")
    assert Tenant.objects.get(pk=world.acme.pk).settings == world.acme.settings


def test_the_inspector_assembles_a_context_and_shows_its_blocks(login, world):
    operator = login("operator")
    operator.open("/admin/context/agentprofile/inspector/")
    operator.page.select_option("#id_conversation", str(world.conversation.pk))
    operator.page.fill("#id_user_message", "Which build is on staging?")
    operator.submit("input[type=submit][value=Assemble]")
    assert "Tokens:" in operator.text("#content")
    blocks = operator.page.eval_on_selector_all(
        "#inspector-blocks tbody tr td:first-child", "cells => cells.map(c => c.textContent)"
    )
    assert {"B4", "B6", "user"} <= set(blocks)
    assert "Deployed build" in operator.text("#content")
    doc_screenshot(operator, "inspector", "#content")
