"""manage.py vectors_migrate --to milvus: copies every kind, resumes where it stopped, verifies the counts."""

import io
import socket

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from retrieval.management.commands.vectors_migrate import Command
from retrieval.vectors.milvus_store import MilvusVectorStore
from retrieval.vectors.rows import DIMENSION
from retrieval.vectors.store import VectorFilters, VectorScope
from tests.retrieval.vectors.conftest import build_corpus

pytestmark = pytest.mark.django_db


def _migrate(*args: str) -> str:
    out = io.StringIO()
    call_command(
        Command(), "--to", "milvus", "--no-progress", "--batch", "2", *args, stdout=out, stderr=io.StringIO()
    )
    return out.getvalue()


def _table(output: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in output.splitlines()[1:]}


def test_it_copies_every_kind_then_resumes_without_writing_again(owner, outsider, tmp_path):
    mine = build_corpus(owner.tenant, seed=1)
    build_corpus(outsider.tenant, seed=2)
    uri = f"milvus://{tmp_path}/vectors.db"
    first = _table(_migrate("--uri", uri))
    # rows, vectors, already there, written, in engine, check
    assert first == {
        "message": ["18", "36", "0", "36", "36", "ok"],
        "chunk": ["12", "12", "0", "12", "12", "ok"],
        "memory": ["6", "6", "0", "6", "6", "ok"],
    }
    store = MilvusVectorStore(str(tmp_path / "vectors.db"), dimension=DIMENSION)
    item = mine.memories["alice"][0]
    hits = store.search(VectorScope("memory", mine.tenant_id), mine.vectors[item], k=1)
    assert hits[0].id == item
    # An interrupted run: one memory never reached the engine; the next run writes only that one.
    store.delete(VectorScope("memory", mine.tenant_id), VectorFilters(ids=(item,)))
    store.close()
    again = _table(_migrate("--uri", uri, "--kind", "memory"))
    assert again == {"memory": ["6", "6", "5", "1", "6", "ok"]}


def test_counts_that_differ_fail_the_command(owner, tmp_path):
    build_corpus(owner.tenant, seed=3)
    uri = f"milvus://{tmp_path}/vectors.db"
    _migrate("--uri", uri, "--kind", "chunk")
    # A document deleted while the engine was not told: the engine holds more than the database.
    owner.tenant.documents.filter(name="handbook").delete()
    with pytest.raises(CommandError, match="Counts differ"):
        _migrate("--uri", uri, "--kind", "chunk")


def test_an_unreachable_engine_is_a_clear_error(owner):
    build_corpus(owner.tenant, seed=4)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(CommandError, match="cannot be reached"):
        _migrate("--uri", f"milvus://127.0.0.1:{port}")


def test_numpy_needs_no_copy():
    out = io.StringIO()
    call_command(Command(), "--to", "numpy", stdout=out)
    assert "Nothing to copy" in out.getvalue()


def test_without_a_milvus_engine_named_it_says_so(settings):
    with pytest.raises(CommandError, match="names no Milvus engine"):
        call_command(Command(), "--to", "milvus", "--no-progress")
