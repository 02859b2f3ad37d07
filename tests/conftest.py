"""The cast every test module starts from: an owner tenant with its API key and an operator member, and
an outsider tenant with a key of its own."""

import re
import threading
from dataclasses import dataclass

import pytest
from celery._state import _set_task_join_will_block
from rest_framework.test import APIClient

from conversations.models import Conversation
from conversations.services import conversation_create
from providers import embeddings, lanes
from tenants.models import ApiKey, Membership, Tenant
from tenants.services import tenant_create
from tests.factories import MembershipFactory


@dataclass
class Actor:
    tenant: Tenant
    raw_key: str
    client: APIClient

    @property
    def api_key(self) -> ApiKey:
        return self.tenant.api_keys.get()


def _actor(slug: str) -> Actor:
    tenant, raw_key = tenant_create(slug=slug, name=slug.title())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return Actor(tenant=tenant, raw_key=raw_key, client=client)


@pytest.fixture
def owner(db) -> Actor:
    return _actor("owner")


@pytest.fixture
def outsider(db) -> Actor:
    return _actor("outsider")


@pytest.fixture
def member(owner) -> Membership:
    """An operator of the owner tenant (a staff user without superuser rights)."""
    return MembershipFactory(tenant=owner.tenant, role=Membership.Role.OPERATOR)


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


@pytest.fixture
def conversation(owner) -> Conversation:
    return conversation_create(
        tenant=owner.tenant, end_user_external_id="alice", title="Owner's conversation"
    )


@pytest.fixture
def outsider_conversation(outsider) -> Conversation:
    return conversation_create(tenant=outsider.tenant, end_user_external_id="mallory", title="Outsider's")


@pytest.fixture
def lexical_only(settings):
    """Retrieval without vectors (MNEMO_EMBEDDINGS=none)."""
    settings.MNEMO_EMBEDDINGS = "none"
    embeddings._build.cache_clear()
    yield
    embeddings._build.cache_clear()


@pytest.fixture
def local_embeddings(settings):
    """The local embedding model (skipped where it is not installed)."""
    if embeddings._local_model_path() is None:
        pytest.skip("no local embedding model")
    settings.MNEMO_EMBEDDINGS = "local"
    embeddings._build.cache_clear()
    yield
    embeddings._build.cache_clear()


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many tests the run skipped for want of PostgreSQL (or Redis): `make test` runs on SQLite, and
    those tests run only in `make test-services` (CI's second pass)."""
    skipped = terminalreporter.stats.get("skipped", [])
    needs: dict[str, int] = {}
    for report in skipped:  # each skip counted once, under the first service its reason names
        reason = _skip_reason(report)
        for service, pattern in (("PostgreSQL", "postgres|DATABASE_URL"), ("Redis", "redis|REDIS_URL")):
            if re.search(pattern, reason, re.IGNORECASE):
                needs[service] = needs.get(service, 0) + 1
                break
    for service, count in needs.items():
        terminalreporter.write_line(
            f"{count} skipped: need {service} (make test-services runs them)", yellow=True
        )


@pytest.fixture
def held():
    """A foreground call (providers.lanes) running on another thread until the test sets the event it
    yields."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        with lanes.foreground():
            started.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert started.wait(5)
    yield release
    release.set()
    thread.join()


@pytest.fixture(autouse=True)
def _celery_join_allowed():
    """Celery marks "a result's get() would block" in one flag for the whole process while an eager task
    runs, and puts back what it found: two eager tasks overlapping on two threads (a test's server thread and
    its own) can leave it set for good, and every later test of the process calling get() on a result then
    fails with "Never call result.get() within a task!". Each test starts with it clear."""
    _set_task_join_will_block(False)
