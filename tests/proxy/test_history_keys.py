"""The proxy's idempotency keys are stored with every message it appends: they must come out the same from
one release to the next, or a stored conversation's whole list stops matching and is appended again."""

import hashlib
import random

from context.proxy.history import chain_keys, message_hash
from prefix_cache.rendering import canonical_json

# Keys as the first release of the proxy computed them (canonical_json through json.dumps for every message).
ITEMS = [
    {"role": "user", "content": 'Grüße, "quoted" \\ back\nslash\t\x01 \u2028 😀', "parts": []},
    {
        "role": "assistant",
        "content": "",
        "parts": [{"type": "tool_call", "id": "call_1", "name": "f", "arguments": '{"a": 1}'}],
    },
    {
        "role": "tool",
        "content": "",
        "parts": [{"type": "tool_result", "tool_call_id": "call_1", "content": "ok"}],
    },
    {"role": "assistant", "content": "plain", "parts": []},
]
KEYS = [
    "px:0:f09b311fc36712d860ba93f02eb749a28937b6a5bb520d55",
    "px:1:c76216f49a029fd19b097fe0eaf2790ec8ce1f5c3f2c3eff",
    "px:2:b13737704ea63949ea87f338483b781cda997fb3f45668d2",
    "px:3:5fb682687775900b2264b97cb3c1b814efcafe6f311985c8",
]


def test_keys_are_those_already_stored():
    assert chain_keys(ITEMS) == KEYS
    assert chain_keys(ITEMS[2:], start=2, chain=KEYS[1].split(":")[2]) == KEYS[2:]


def test_a_text_message_hashes_as_its_canonical_json():
    rng = random.Random(17)
    alphabet = [chr(c) for c in range(0, 0x80)] + ["é", "ß", "\u2028", "\u2029", "\ufeff", "😀", "中", "\x7f"]
    for _ in range(2000):
        content = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        item = {"role": rng.choice(["user", "assistant", "tool"]), "content": content, "parts": []}
        expected = hashlib.sha256(
            canonical_json({"r": item["role"], "c": content, "p": []}).encode()
        ).hexdigest()
        assert message_hash(item) == expected, repr(content)
