"""The two tenants of the isolation tests, each with one object of every kind the API has, built through
the API as a client app would; and what of the owner's must never reach the outsider."""

from dataclasses import dataclass, field
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile

from tests.cold_storage.helpers import frame, image_part
from tests.conftest import Actor
from tests.security.sweep import ID_KINDS

OWNER_MARK = "Zanzibar7431"  # in every text the owner writes; never in an answer to the outsider
OUTSIDER_MARK = "Quokka2208"


@dataclass
class World:
    """One tenant's objects, by kind: ids, and names of its own (end user, block label, client keys)."""

    actor: Actor
    mark: str
    values: dict[str, str] = field(default_factory=dict)


def _ok(response: Any) -> Any:
    assert response.status_code < 300, response.content[:400]
    return response.json()


def world_build(actor: Actor, *, mark: str, user: str, seed: int) -> World:
    """Through the API, as the client app would: a conversation with a turn, messages (one with an image),
    a context call, a task-state event, a memory block, an archival memory, an agent profile, a document."""
    client, world = actor.client, World(actor=actor, mark=mark)

    def post(path: str, body: Any = None, **extra: Any) -> Any:
        return _ok(client.post(f"/api/v1/{path}", body, format="json", **extra))

    conversation = post("conversations", {"end_user": user, "title": f"{mark} release plan"})["id"]
    base = f"conversations/{conversation}"
    turn = post(f"{base}/turns")["id"]
    key, request_id = f"{mark}-key", f"{mark}-request"
    first = {"role": "user", "content": f"{mark}: ship the billing fix on Tuesday", "idempotency_key": key}
    post(f"{base}/messages", {"messages": [first, {"role": "assistant", "content": f"Noted, {mark}."}]})
    shot = [{"type": "text", "text": f"{mark} screen"}, image_part(frame(seed))]
    # Not completed: the one message whose parts may still change (PATCH names images too).
    message = post(f"{base}/messages", {"role": "user", "parts": shot, "completed": False})
    image = next(p["image_id"] for p in message["parts"] if p["type"] == "image")
    context = post(f"{base}/context", {"user_message": f"When does {mark} ship?"})["context_id"]
    event = {"expected_epoch": 0, "request_id": request_id, "event_type": "set", "payload": {"path": "plan"}}
    post(f"{base}/state/events", event | {"payload": {"path": "plan", "value": mark}})
    label = f"{mark.lower()}-notes"
    _ok(client.put(f"/api/v1/users/{user}/memory/blocks/{label}", {"value": f"{mark} notes"}, format="json"))
    memory = post(f"users/{user}/memories", {"content": f"{mark} prefers PostgreSQL"})["memory"]["id"]
    profile = post("agent-profiles", {"name": f"{mark} agent", "policy": f"{mark} policy"})["id"]
    upload = SimpleUploadedFile("notes.md", f"# {mark}\n\nThe {mark} runbook.".encode(), "text/markdown")
    document = _ok(client.post("/api/v1/documents", {"file": [upload], "conversation": conversation}))
    world.values = {
        "conversation": conversation,
        "turn": turn,
        "message": message["id"],
        "image": image,
        "context": context,
        "memory": memory,
        "profile": profile,
        "document": document["documents"][0]["id"],
        "user": user,
        "label": label,
        "idempotency": key,
        "request": request_id,
        "target": memory,
        "source": message["id"],
    }
    return world


def owner_markers(owner: World) -> set[str]:
    """What must never reach the outsider: the owner's text, ids, tenant and key."""
    tenant = owner.actor.tenant
    ids = {v for k, v in owner.values.items() if k in ID_KINDS}
    return {owner.mark, str(tenant.pk), tenant.slug, owner.actor.raw_key, owner.actor.api_key.prefix, *ids}
