"""Summary segments (B4), compaction (auto and manual) and the Celery summarisation pipeline."""
