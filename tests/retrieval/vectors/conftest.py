"""A small corpus of every kind for two tenants, and the store under test: the numpy backend over those rows
and Milvus Lite in a file of this test session (one collection prefix per test, so tests never share data)."""

import hashlib
import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from conversations.models import Conversation, MessageVector
from conversations.services import conversation_create
from knowledge.models import Chunk, Document
from memory.models import ArchivalMemory
from providers.embeddings import to_bytes
from retrieval.vectors.milvus_store import MilvusVectorStore
from retrieval.vectors.numpy_store import NumpyVectorStore
from retrieval.vectors.rows import DIMENSION, DatabaseRows, record_batches
from retrieval.vectors.store import KINDS, VectorRecord
from tests.factories import MessageFactory

_prefixes = itertools.count()


def unit(rng: np.random.Generator) -> np.ndarray:
    vector = rng.standard_normal(DIMENSION).astype(np.float32)
    return vector / np.linalg.norm(vector)


@dataclass
class Corpus:
    """What one tenant holds: conversation ids by name, message/chunk/memory ids, and each row's vectors."""

    tenant_id: str
    end_users: dict[str, str] = field(default_factory=dict)
    conversations: dict[str, str] = field(default_factory=dict)
    messages: dict[str, list[str]] = field(default_factory=dict)  # conversation name -> message ids
    chunks: dict[str, list[str]] = field(default_factory=dict)  # document name -> chunk ids
    documents: dict[str, str] = field(default_factory=dict)
    memories: dict[str, list[str]] = field(default_factory=dict)  # end user name -> memory ids
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # id -> its first vector


def _message_vectors(conversation: Conversation, corpus: Corpus, name: str, rng: np.random.Generator) -> None:
    ids = []
    for _ in range(3):
        message = MessageFactory(conversation=conversation)
        matrix = np.stack([unit(rng), unit(rng)])
        MessageVector.objects.create(
            message=message, conversation=conversation, seq=message.seq, model="test-model",
            dimension=DIMENSION, spans=[[0, 5], [5, 10]], vectors=to_bytes(matrix),
            content_sha256=hashlib.sha256(str(message.pk).encode()).hexdigest(),
        )  # fmt: skip
        ids.append(str(message.pk))
        corpus.vectors[str(message.pk)] = matrix[0]
    corpus.messages[name] = ids


def _chunks(document: Document, corpus: Corpus, name: str, rng: np.random.Generator) -> None:
    ids = []
    for ordinal in range(3):
        vector = unit(rng)
        chunk = Chunk.objects.create(
            document=document, tenant_id=document.tenant_id, scope_key=document.scope_key, kind="document",
            ordinal=ordinal, content=f"chunk {ordinal}", token_count=2, embedding_model="test-model",
            embedding=to_bytes(vector),
        )  # fmt: skip
        ids.append(str(chunk.pk))
        corpus.vectors[str(chunk.pk)] = vector
    corpus.chunks[name] = ids
    corpus.documents[name] = str(document.pk)


def build_corpus(tenant, seed: int) -> Corpus:
    """Alice with two conversations, a document of hers and two memories; Bob with one conversation and one
    memory; a document of the whole tenant."""
    rng = np.random.default_rng(seed)
    corpus = Corpus(tenant_id=str(tenant.pk))
    for user, conversations in (("alice", ("a1", "a2")), ("bob", ("b1",))):
        for name in conversations:
            conversation = conversation_create(tenant=tenant, end_user_external_id=user, title=name)
            corpus.conversations[name] = str(conversation.pk)
            corpus.end_users[user] = str(conversation.end_user_id)
            _message_vectors(conversation, corpus, name, rng)
    for name, end_user, key in (
        ("handbook", None, "tenant"),
        ("alice-notes", corpus.end_users["alice"], "alice"),
    ):
        document = Document.objects.create(
            tenant=tenant, end_user_id=end_user, scope_key=key, name=name, format="text", size=1, sha256=name
        )
        _chunks(document, corpus, name, rng)
    for user, count in (("alice", 2), ("bob", 1)):
        ids = []
        for i in range(count):
            vector = unit(rng)
            memory = ArchivalMemory.objects.create(
                tenant=tenant, end_user_id=corpus.end_users[user], content=f"{user} fact {i}",
                embedding=to_bytes(vector), embedding_model="test-model",
            )  # fmt: skip
            ids.append(str(memory.pk))
            corpus.vectors[str(memory.pk)] = vector
        corpus.memories[user] = ids
    return corpus


def all_records() -> list[VectorRecord]:
    return [record for kind in KINDS for batch in record_batches(kind) for record in batch]


@pytest.fixture(scope="session")
def lite_file(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus") / "vectors.db")


@pytest.fixture(params=["numpy", "milvus"])
def store(request, lite_file):
    if request.param == "numpy":
        backend = NumpyVectorStore(DatabaseRows(), dimension=DIMENSION)
    else:
        backend = MilvusVectorStore(lite_file, dimension=DIMENSION, prefix=f"test{next(_prefixes)}")
    yield backend
    backend.close()


@pytest.fixture
def corpora(owner, outsider, store):
    """The owner's and the outsider's corpora, written to the store. The outsider's vectors are the owner's
    (same seed): a leak across tenants would be the best hit of every search."""
    mine, theirs = build_corpus(owner.tenant, seed=7), build_corpus(outsider.tenant, seed=7)
    store.add(all_records())
    return mine, theirs
