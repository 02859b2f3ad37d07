"""The data the browser tests look at, written the way clients write it: through the API (messages with an
image and a partial reply, a compaction, memory, a document, a context call and its usage report) for two
tenants, and the admin users of the admin test cast: a superuser, an operator and a support member of Acme."""

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from conversations.models import Conversation
from tenants.models import Membership, Tenant
from tenants.services import tenant_create
from tests.cold_storage.helpers import frame, image_part
from tests.factories import MembershipFactory

PASSWORD = "browser-pass-1"


@dataclass
class World:
    acme: Tenant
    globex: Tenant
    conversation: Conversation
    other: Conversation
    users: dict[str, Any]


def _api(tenant_slug: str, name: str) -> tuple[Tenant, APIClient]:
    tenant, raw_key = tenant_create(slug=tenant_slug, name=name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return tenant, client


def _ok(response: Any) -> Any:
    assert response.status_code < 300, (response.status_code, response.content[:500])
    return response.json() if response.content else None


def _conversation(api: APIClient, user: str, title: str, turns: int) -> str:
    conversation = _ok(api.post("/api/v1/conversations", {"end_user": user, "title": title}, format="json"))
    url = f"/api/v1/conversations/{conversation['id']}/messages"
    for i in range(turns):
        _ok(api.post(url, {"role": "user", "content": f"Step {i}: deploy build {4100 + i}?"}, format="json"))
        reply = f"Deployed build {4100 + i} to staging.\nChecks:\n- smoke tests pass\n- config /etc/app.yaml"
        _ok(api.post(url, {"role": "assistant", "content": reply}, format="json"))
    return conversation["id"]


def _acme_activity(api: APIClient, conversation_id: str) -> None:
    base = f"/api/v1/conversations/{conversation_id}"
    _ok(api.post(f"{base}/compact", {}, format="json"))
    parts = [{"type": "text", "text": "Here is the dashboard:"}, image_part(frame(7))]
    _ok(api.post(f"{base}/messages", {"role": "user", "content": "", "parts": parts}, format="json"))
    partial = {"role": "assistant", "content": "The dashboard shows", "completed": False}
    _ok(api.post(f"{base}/messages", partial, format="json"))
    _ok(api.put("/api/v1/users/alice/memory/blocks/preferences", {"value": "Likes tea."}, format="json"))
    _ok(api.post("/api/v1/users/alice/memories", {"content": "Alice deploys on Fridays."}, format="json"))
    _ok(api.post("/api/v1/agent-profiles", {"name": "ops", "policy": "Be brief."}, format="json"))
    context = _ok(api.post(f"{base}/context", {"user_message": "Which build?"}, format="json"))
    usage = {"prompt_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 1024}}
    _ok(api.post(f"{base}/usage", {"usage": usage, "context_id": context["context_id"]}, format="json"))


def _document(api: APIClient) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    text = b"# Runbook\n\nRestart the worker with `make run`.\n"
    _ok(api.post("/api/v1/documents", {"file": [SimpleUploadedFile("runbook.md", text)]}, format="multipart"))


def _users(acme: Tenant) -> dict[str, Any]:
    user_model = get_user_model()
    superuser = user_model.objects.create_superuser("root", "root@example.com", PASSWORD)
    operator = MembershipFactory(tenant=acme, role=Membership.Role.OPERATOR).user
    support = MembershipFactory(tenant=acme, role=Membership.Role.SUPPORT).user
    return {"superuser": superuser, "operator": operator, "support": support}


def seed_world() -> World:
    acme, acme_api = _api("acme", "Acme Corp")
    globex, globex_api = _api("globex", "Globex Hidden Name")
    conversation_id = _conversation(acme_api, "alice", "Deploys", turns=14)
    _acme_activity(acme_api, conversation_id)
    _document(acme_api)
    other_id = _conversation(globex_api, "mallory", "Globex plans", turns=2)
    _ok(globex_api.put("/api/v1/users/mallory/memory/blocks/persona", {"value": "Secret."}, format="json"))
    return World(
        acme=acme,
        globex=globex,
        conversation=Conversation.objects.get(pk=conversation_id),
        other=Conversation.objects.get(pk=other_id),
        users=_users(acme),
    )


def session_cookie(user: Any) -> str:
    """A logged-in session for `user` (the login form is django-axes' business, tested elsewhere)."""
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value
