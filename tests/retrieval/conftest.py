"""The retrieval tests: the knowledge search's tests start, as knowledge's do, with no document files and no
cached index; `vector_backend` runs a test on each vector store (tests.retrieval.backends)."""

from tests.knowledge.conftest import _fresh_knowledge  # noqa: F401
from tests.retrieval.backends import milvus_lite_uri, vector_backend  # noqa: F401
