"""Test data for make schema-check (.ci/schema-check): objects for schemathesis to aim its path parameters at,
created through the API it is about to test. Prints them as shell assignments.

Operations that destroy their object get one of their own (the *_DEL ids), so a DELETE early in the run
leaves the other operations something to work on."""

import base64
import io
import json
import sys
import urllib.request
from typing import Any

from PIL import Image

BASE, API_KEY = sys.argv[1], sys.argv[2]
if not BASE.startswith("http://127.0.0.1:"):
    sys.exit("schema_check_data.py talks to the local server only")


def call(method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{BASE}/api/v1/{path}", data=data, method=method)  # noqa: S310
    request.add_header("Authorization", f"Bearer {API_KEY}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 (checked above)
        return json.loads(response.read() or b"null")


def png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 120, 200)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def conversation(end_user: str) -> str:
    created = call("POST", "conversations", {"end_user": end_user, "title": "schema check"})
    return created["id"]


def main() -> None:
    conv = conversation("alice")
    turn = call("POST", f"conversations/{conv}/turns")["id"]
    steps = [f"Step {i}: deploy service {i} to staging and report back." for i in range(12)]
    messages = [{"role": "user", "content": step, "turn_id": turn} for step in steps]
    call("POST", f"conversations/{conv}/messages", {"messages": messages})
    shot = {"type": "image", "data": png(), "media_type": "image/png"}
    parts = [{"type": "text", "text": "Screen:"}, shot]
    message = call(
        "POST", f"conversations/{conv}/messages", {"role": "user", "parts": parts, "turn_id": turn}
    )
    image = next(p["image_id"] for p in message["parts"] if p["type"] == "image")
    call("PUT", "users/alice/memory/blocks/persona", {"value": "Alice, release manager"})
    memory, doomed_memory = (
        call("POST", "users/alice/memories", {"content": text})["memory"]["id"]
        for text in ("Alice deploys on Tuesdays.", "Alice's cat is called Io.")
    )
    profile = call("POST", "agent-profiles", {"name": "schema-check", "policy": "Be brief."})["id"]
    doomed_profile = call("POST", "agent-profiles", {"name": "schema-check-doomed"})["id"]
    call("PUT", "users/doomed/memory/blocks/persona", {"value": "to be deleted"})
    values = {
        "ST_CONVERSATION": conv,
        "ST_CONVERSATION_DEL": conversation("bob"),
        "ST_TURN": turn,
        "ST_MESSAGE": message["id"],
        "ST_IMAGE": image,
        "ST_MEMORY": memory,
        "ST_MEMORY_DEL": doomed_memory,
        "ST_PROFILE": profile,
        "ST_PROFILE_DEL": doomed_profile,
    }
    for name, value in values.items():
        print(f"export {name}={value}")


if __name__ == "__main__":
    main()
