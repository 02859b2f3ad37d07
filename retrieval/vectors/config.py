"""MNEMO_VECTOR_STORE, read once at start-up: "numpy" (exact search in the web process, the default), a
Milvus server "milvus://[user:password@]host:port", or Milvus Lite in a file "milvus:///abs/path.db".
Imported by the settings, so it imports nothing of Django's apps."""

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

DEFAULT_MILVUS_PORT = 19530


@dataclass(frozen=True)
class VectorStoreConfig:
    backend: Literal["numpy", "milvus"]
    # What pymilvus connects to: "http://host:port" for a server, a file path for Milvus Lite.
    uri: str = ""
    token: str = ""

    @property
    def embedded(self) -> bool:
        return self.backend == "milvus" and not self.uri.startswith("http")


def parse_vector_store(raw: str) -> VectorStoreConfig:
    value = raw.strip()
    if value in ("", "numpy"):
        return VectorStoreConfig("numpy")
    if not value.startswith("milvus://"):
        raise ImproperlyConfigured(
            f"MNEMO_VECTOR_STORE={raw!r}: use numpy, milvus://host:port or milvus:///absolute/path.db."
        )
    parts = urlsplit(value)
    if not parts.netloc:
        return _lite(raw, parts.path)
    try:
        port = parts.port or DEFAULT_MILVUS_PORT
    except ValueError:
        raise ImproperlyConfigured(f"MNEMO_VECTOR_STORE={raw!r}: the port is not a number.") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ImproperlyConfigured(f"MNEMO_VECTOR_STORE={raw!r}: expected milvus://host:port.")
    token = ""
    if parts.username is not None:
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return VectorStoreConfig("milvus", uri=f"http://{parts.hostname}:{port}", token=token)


def _lite(raw: str, path: str) -> VectorStoreConfig:
    # Milvus Lite opens only a file whose name ends in .db; a relative path would depend on the directory
    # the process started in.
    if not path.startswith("/") or not path.endswith(".db") or len(path) <= len("/.db"):
        raise ImproperlyConfigured(
            f"MNEMO_VECTOR_STORE={raw!r}: Milvus Lite needs an absolute path ending in .db "
            "(milvus:///var/lib/mnemo/vectors.db)."
        )
    return VectorStoreConfig("milvus", uri=path)
