"""The retrieval tests: the knowledge search's tests start, as knowledge's do, with no document files and no
cached index."""

from tests.knowledge.conftest import _fresh_knowledge  # noqa: F401
