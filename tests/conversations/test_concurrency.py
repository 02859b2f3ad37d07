"""Concurrent appends on PostgreSQL: the row lock must give every message a unique seq with no gap, and
retried idempotency keys must never duplicate a message."""

import random
import threading

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from conversations.models import Message

THREADS = 8
PER_THREAD = 200


@pytest.mark.django_db(transaction=True)
def test_eight_threads_append_1600_messages_without_gap_or_duplicate(owner, conversation):
    if connection.vendor != "postgresql":
        pytest.skip("row-lock concurrency is tested on PostgreSQL (set DATABASE_URL)")
    url = f"/api/v1/conversations/{conversation.id}/messages"
    errors: list[str] = []
    replays = [0] * THREADS
    start = threading.Barrier(THREADS)

    def worker(n: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.raw_key}")
        rng = random.Random(n)
        try:
            start.wait()
            for i in range(PER_THREAD):
                key = f"w{n}-{i}"
                body = {"role": "user" if i % 2 else "assistant", "content": f"worker {n} message {i}"}
                response = client.post(url, body, format="json", headers={"Idempotency-Key": key})
                if response.status_code != 201:
                    errors.append(f"{key}: {response.status_code} {response.content[:200]!r}")
                # A client that lost the response retries with the same key: it must get the original.
                if rng.random() < 0.25:
                    retry = client.post(url, body, format="json", headers={"Idempotency-Key": key})
                    if retry.status_code != 200 or retry.json()["id"] != response.json()["id"]:
                        errors.append(f"{key} retry: {retry.status_code}")
                    replays[n] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sum(replays) > 0
    seqs = list(
        Message.objects.filter(conversation=conversation).order_by("seq").values_list("seq", flat=True)
    )
    assert len(seqs) == THREADS * PER_THREAD
    assert seqs == list(range(1, THREADS * PER_THREAD + 1))
    keys = Message.objects.filter(conversation=conversation).values_list("idempotency_key", flat=True)
    assert len(set(keys)) == THREADS * PER_THREAD
    conversation.refresh_from_db()
    assert conversation.last_seq == THREADS * PER_THREAD
