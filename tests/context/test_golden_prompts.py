"""The golden prompt test: on a fixed corpus the context call returns the same prompts, byte for byte, as the
ones recorded in `golden/` (one file without vectors; one with, its vectors in a file beside it). A change
that moves code without meaning to change behaviour must keep this test green; a change that means to change
what a prompt holds re-records the files on purpose:

    MNEMO_GOLDEN_RECORD=1 .venv/bin/pytest tests/context/test_golden_prompts.py

The corpus is ours: two named people over dated sessions with short turns and relative dates, a second
conversation of the same end user, archival memories and a core memory block. Volatile fields (ids, the
context id, timings) are left out of what is compared.

With vectors, the local model's vectors are recorded beside the prompts and replayed (RecordedVectors): its
int8 products run on different kernels by CPU (one without VNNI instructions saturates some of them), so the
same text embeds a little differently from machine to machine, enough to reorder near hits."""

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conversations.embedding import message_vectors_fill
from conversations.services import conversation_create
from providers import embeddings
from tests.context.helpers import context

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).parent / "golden"
VECTORS = GOLDEN / "local_embeddings.vectors.npz"
RECORDING = bool(os.environ.get("MNEMO_GOLDEN_RECORD"))

TOPICS = [
    "I went to a pottery class yesterday and made a lopsided bowl.",
    "My sister is moving to Lisbon next month for her new job.",
    "We adopted a grey cat from the shelter last weekend, she is called Miso.",
    "The marathon training is going slowly, I ran twelve kilometres on Sunday.",
    "I finally finished the treehouse for my nephew two weeks ago.",
    "Work has been busy, the product launch slipped again.",
    "Have you read anything good lately? I am halfway through a novel about lighthouses.",
    "I started learning the cello, my fingers hurt after every lesson.",
    "We are thinking of a road trip along the coast in August.",
    "My grandmother turned ninety last Saturday and we cooked her favourite stew.",
    "The garden is full of tomatoes this year, more than we can eat.",
    "I signed up for a jazz workshop that starts next week.",
]
REPLIES = [
    "Haha yes, same!",
    "No way, tell me more.",
    "That sounds lovely.",
    "Oh wow, good for you.",
    "Send pictures please!",
    "Ugh, I know that feeling.",
]
# Who came along, and a reaction, per session: every turn of the corpus is then unique, so no two hits tie
# (ties are broken by row order, which follows random ids, and would make the recorded prompts flaky).
COMPANIONS = [
    "Mira",
    "Jonas",
    "Aiko",
    "Bruno",
    "Leila",
    "Omar",
    "Freya",
    "Diego",
    "Nadia",
    "Pavel",
    "Chloe",
    "Ravi",
    "Greta",
    "Hugo",
    "Ines",
    "Kenji",
    "Lucia",
    "Mateo",
    "Noor",
    "Oskar",
    "Paula",
    "Quinn",
    "Rosa",
    "Sami",
]
QUESTIONS = [
    "When did Priya go to the pottery class?",
    "What are Tomas's hobbies?",
    "Which city is Priya's sister moving to?",
    "What did we talk about in July 2023?",
    "Would Tomas enjoy a jazz festival?",
    "What is the cat called?",
]


def _turns(session: int) -> list[tuple[str, str]]:
    """A session of short turns: each speaker brings up a topic and the other answers briefly."""
    turns = []
    for n in range(6):
        speaker, other = ("Priya", "Tomas") if (session + n) % 2 == 0 else ("Tomas", "Priya")
        topic = TOPICS[(session * 5 + n * 7) % len(TOPICS)]
        turns.append((speaker, f"{topic} {COMPANIONS[session]} was there too."))
        turns.append((other, f"{REPLIES[(session + n) % len(REPLIES)]} Say hi to {COMPANIONS[session]}."))
    return turns


def _load(owner, conversation, sessions: int, start: datetime) -> None:
    for session in range(sessions):
        day = start + timedelta(days=9 * session)
        items = [
            {
                "role": "user" if name == "Priya" else "assistant",
                "name": name,
                "content": text,
                "created_at": (day + timedelta(minutes=n)).isoformat(),
            }
            for n, (name, text) in enumerate(_turns(session))
        ]
        url = f"/api/v1/conversations/{conversation.id}/messages"
        response = owner.client.post(url, {"messages": items}, format="json")
        assert response.status_code == 201, response.content


def _memories(owner) -> None:
    for content in ["Priya is allergic to peanuts.", "Tomas works as a carpenter in Porto."]:
        response = owner.client.post("/api/v1/users/alice/memories", {"content": content}, format="json")
        assert response.status_code == 201, response.content
    block = {"value": "Priya and Tomas are old friends."}
    response = owner.client.put("/api/v1/users/alice/memory/blocks/human", block, format="json")
    assert response.status_code in (200, 201), response.content


def _stable(body: dict[str, Any]) -> dict[str, Any]:
    """What a client sends on, and the sizes the layout reports; nothing that differs between runs."""
    return {
        "system": body["system"],
        "messages": body["messages"],
        "tokens": body["tokens"],
        "blocks": {name: block["tokens"] for name, block in body["blocks"].items()},
        "dropped": sorted(json.dumps(d, sort_keys=True) for d in body["dropped"]),
        "degradations": sorted(d["code"] for d in body["degradations"]),
    }


def _prompts(owner, conversation) -> dict[str, Any]:
    prompts = {}
    for budget in (1000, 2000, 8000):
        for n, question in enumerate(QUESTIONS):
            body = context(owner, conversation, user_message=question, token_budget=budget)
            prompts[f"openai/{budget}/{n}"] = _stable(body)
    body = context(owner, conversation, user_message=QUESTIONS[0], token_budget=2000, format="anthropic")
    prompts["anthropic/2000/0"] = _stable(body)
    return prompts


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class RecordedVectors:
    """The local model's embed, replayed from VECTORS (recording: run, kept as float16, and handed on as
    kept, so the recorded prompts are the replayed ones'). A text the recording lacks fails the test: the
    corpus or what the pipeline embeds changed, and the files are recorded again."""

    def __init__(self, model) -> None:
        self.run, self.kept = model.embed, {}
        if not RECORDING:
            with np.load(VECTORS) as stored:
                self.kept = dict(zip(stored["keys"].tolist(), stored["vectors"], strict=True))

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [_key(text) for text in texts]
        if RECORDING:
            for key, vector in zip(keys, self.run(texts), strict=True):
                self.kept[key] = vector.astype(np.float16)
        missing = [text for text, key in zip(texts, keys, strict=True) if key not in self.kept]
        assert not missing, f"not in {VECTORS.name}: {missing[:3]} (record again: MNEMO_GOLDEN_RECORD=1)"
        return np.stack([self.kept[key].astype(np.float32) for key in keys]) if keys else self.run([])

    def save(self) -> None:
        keys = sorted(self.kept)
        np.savez_compressed(VECTORS, keys=np.array(keys), vectors=np.stack([self.kept[k] for k in keys]))


@pytest.fixture
def recorded_vectors(local_embeddings, monkeypatch):
    model = embeddings.embedder_status().embedder
    recorded = RecordedVectors(model)
    monkeypatch.setattr(model, "embed", recorded.embed)  # the cached embedder of this test, for this test
    monkeypatch.setattr(embeddings, "_query_cache", {})  # no question's vector from another test's model
    yield recorded
    if RECORDING:
        recorded.save()


@pytest.mark.parametrize("ranking", ["lexical_only", "recorded_vectors"])
def test_the_prompts_on_the_fixed_corpus_are_unchanged(request, owner, conversation, ranking):
    request.getfixturevalue(ranking)
    other = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Earlier chat")
    _load(owner, other, sessions=4, start=datetime(2023, 3, 1, 18, 0, tzinfo=UTC))
    _load(owner, conversation, sessions=24, start=datetime(2023, 5, 8, 18, 0, tzinfo=UTC))
    _memories(owner)
    if ranking == "recorded_vectors":
        for each in (other, conversation):
            message_vectors_fill(conversation_id=each.id)

    prompts = _prompts(owner, conversation)

    golden = GOLDEN / ("lexical_only.json" if ranking == "lexical_only" else "local_embeddings.json")
    if RECORDING:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(json.dumps(prompts, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    expected = json.loads(golden.read_text())
    for key in expected:
        assert prompts[key] == expected[key], f"the prompt {key} changed"
    assert sorted(prompts) == sorted(expected)
    digest = hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()
    assert digest == hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()
