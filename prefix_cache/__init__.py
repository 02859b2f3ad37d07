"""Deterministic prompt rendering (B1–B6), per-block token accounting, layered prefix hashes, provider usage
ingestion and cache statistics."""
