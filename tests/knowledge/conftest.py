import shutil
from typing import Any

import pytest
from django.conf import settings

from retrieval import knowledge as search


@pytest.fixture(autouse=True)
def _fresh_knowledge():
    """Each test starts with no document files and no cached search index."""
    shutil.rmtree(settings.MEDIA_ROOT / "documents", ignore_errors=True)
    search._indexes.clear()
    yield
    search._indexes.clear()


def document_files() -> list[str]:
    root = settings.MEDIA_ROOT / "documents"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def upload(actor: Any, *files: tuple[str, bytes], **fields: str) -> Any:
    """POST /api/v1/documents with the files (name, bytes) in the repeated field `file`; what the request
    queued on commit (the processing, eager in tests) runs before this returns."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import TestCase

    payload: dict[str, Any] = {"file": [SimpleUploadedFile(name, data) for name, data in files], **fields}
    with TestCase.captureOnCommitCallbacks(execute=True):
        return actor.client.post("/api/v1/documents", payload, format="multipart")


def code(response: Any) -> str:
    return response.json()["error"]["code"]


# The OpenAI-compatible test server (tests/llm_server.py) for the image-description tests.
from tests.llm_server import llm_server, llm_settings  # noqa: E402, F401
