"""document.updated reaches the sockets of the document's conversation when its status changes."""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, channel_layers, get_channel_layer

from conversations.events import conversation_group
from tests.knowledge.conftest import upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def listener(conversation):
    channel_layers.backends.clear()
    layer = get_channel_layer()
    if not isinstance(layer, InMemoryChannelLayer):
        pytest.skip("reads the in-memory channel layer")
    group = conversation_group(tenant_id=conversation.tenant_id, conversation_id=conversation.pk)
    async_to_sync(layer.group_add)(group, "listener")

    def received() -> list[dict]:
        """What the group delivered to the listener so far (read from the layer's queue, no waiting)."""
        queue = layer.channels.get("listener")
        events = []
        while queue is not None and not queue.empty():
            _expiry, message = queue.get_nowait()
            events.append(message)
        return events

    yield received
    channel_layers.backends.clear()


def test_status_changes_are_published_to_the_conversation(owner, conversation, listener):
    upload(owner, ("a.md", b"# Notes\n\nhello"), conversation=str(conversation.pk))
    upload(owner, ("b.pdf", b"%PDF-1.4 garbage"), conversation=str(conversation.pk))
    upload(owner, ("tenant.md", b"not on this socket"))
    events = [(e["event"], e["data"]["name"], e["data"]["status"]) for e in listener()]
    assert events == [
        ("document.updated", "a.md", "pending"),
        ("document.updated", "a.md", "ready"),
        ("document.updated", "b.pdf", "pending"),
        ("document.updated", "b.pdf", "failed"),
    ]
