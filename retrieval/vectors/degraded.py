"""What a search reports when the vector engine cannot answer: its words-only ranking stands, and the
response says so (the context pipeline also logs and counts it as a retrieve-stage degradation)."""

VECTOR_STORE_UNAVAILABLE = "vector_store_unavailable"


def engine_unavailable() -> dict[str, str]:
    """The degradation of a search whose vector side failed. The reason stays in the log (the store writes
    it there): a client learns that the engine is down, not where it lives."""
    return {
        "code": VECTOR_STORE_UNAVAILABLE,
        "message": "Lexical search only: the vector engine cannot be reached.",
    }
