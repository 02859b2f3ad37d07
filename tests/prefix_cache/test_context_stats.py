"""the hourly rollups of context calls behind the dashboard's latency and degradation charts.
Each context call bumps its tenant's hour (calls, a latency histogram, degradations by code); p50/p95 are
read back from the histogram; old hours are pruned daily."""

import threading
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, connections
from django.db.models import QuerySet

from prefix_cache import tasks
from prefix_cache.context_stats import BUCKET_FIELDS, context_call_days, degradation_days, latency_percentile
from prefix_cache.models import ContextCallHour, DegradationHour, latency_bucket_field
from prefix_cache.services import context_call_record, context_calls_flush, context_stats_prune

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 11, 2, 12, 34, 56, tzinfo=UTC)


def context_call(actor, conversation, **body):
    url = f"/api/v1/conversations/{conversation.id}/context"
    return actor.client.post(url, {"user_message": "Which build?", **body}, format="json")


def histogram(row: ContextCallHour) -> list[int]:
    return [getattr(row, name) for name in BUCKET_FIELDS]


def test_each_context_call_counts_once_in_its_tenants_hour(
    owner, outsider, conversation, outsider_conversation
):
    for _ in range(3):
        assert context_call(owner, conversation).status_code == 200
    assert context_call(outsider, outsider_conversation).status_code == 200
    assert context_call(outsider, conversation).status_code == 404  # another tenant's: not counted anywhere

    [row] = ContextCallHour.objects.filter(tenant=owner.tenant)
    assert row.calls == 3 and sum(histogram(row)) == 3
    assert row.hour.minute == row.hour.second == row.hour.microsecond == 0
    assert 0 < row.latency_ms_max <= row.latency_ms_sum
    assert ContextCallHour.objects.get(tenant=outsider.tenant).calls == 1


def test_degradations_are_counted_by_code_per_call(owner, outsider, conversation, outsider_conversation):
    context_call(owner, conversation, model="acme-llm-7b")  # an unknown model: a degradation
    context_call(owner, conversation, model="acme-llm-7b")
    context_call(owner, conversation)
    context_call(outsider, outsider_conversation, model="acme-llm-7b")

    owner_counts = dict(DegradationHour.objects.filter(tenant=owner.tenant).values_list("code", "count"))
    assert owner_counts["unknown_model"] == 2
    assert ContextCallHour.objects.get(tenant=owner.tenant).calls == 3
    assert DegradationHour.objects.get(tenant=outsider.tenant, code="unknown_model").count == 1


def test_latency_lands_in_its_bucket_and_the_row_keeps_sum_and_max(owner):
    for ms in (0.4, 3, 3, 4500, 25_000):
        context_call_record(tenant_id=owner.tenant.pk, milliseconds=ms, degradation_codes=[], at=NOON)
    row = ContextCallHour.objects.get(tenant=owner.tenant)
    assert row.hour == NOON.replace(minute=0, second=0, microsecond=0)
    assert (row.calls, row.ms_le_1, row.ms_le_5, row.ms_le_5000, row.ms_over) == (5, 1, 2, 1, 1)
    assert row.latency_ms_max == 25_000 and row.latency_ms_sum == pytest.approx(29_506.4)
    assert latency_bucket_field(10) == "ms_le_10" and latency_bucket_field(10.001) == "ms_le_20"


def test_p50_and_p95_read_from_the_histogram_match_the_calls():
    """Calls of 1, 2, …, 100 ms: the true p50 is 50 ms and p95 95 ms; the buckets 20-50 and 50-100 hold
    them, and interpolating inside a bucket finds them exactly for evenly spread calls."""
    counts = [0] * len(BUCKET_FIELDS)
    for ms in range(1, 101):
        counts[BUCKET_FIELDS.index(latency_bucket_field(ms))] += 1
    assert latency_percentile(counts, 0.5, max_ms=100) == 50
    assert latency_percentile(counts, 0.95, max_ms=100) == 95
    assert latency_percentile([0] * len(BUCKET_FIELDS), 0.5, max_ms=0) is None


def test_percentiles_never_pass_the_slowest_call():
    one_fast = [0] * len(BUCKET_FIELDS)
    one_fast[BUCKET_FIELDS.index("ms_le_2")] = 1  # a single call of 1.5 ms: the bucket says up to 2
    assert latency_percentile(one_fast, 0.95, max_ms=1.5) == 1.5
    slow = [0] * len(BUCKET_FIELDS)
    slow[-1] = 2  # 12 s and 30 s: the open bucket ends at the slowest call
    assert latency_percentile(slow, 0.5, max_ms=30_000) == 20_000


def test_days_add_up_their_hours(owner, outsider):
    for hour, ms in ((1, 8), (1, 9), (23, 40)):
        at = NOON.replace(hour=hour)
        context_call_record(tenant_id=owner.tenant.pk, milliseconds=ms, degradation_codes=["x"], at=at)
    context_call_record(
        tenant_id=owner.tenant.pk, milliseconds=300, degradation_codes=["y", "y"], at=NOON + timedelta(days=1)
    )
    context_call_record(tenant_id=outsider.tenant.pk, milliseconds=5000, degradation_codes=["z"], at=NOON)
    since = NOON - timedelta(days=1)

    days = context_call_days(tenant=owner.tenant, since=since)
    assert [(d["day"].isoformat(), d["calls"], d["max"]) for d in days] == [
        ("2026-11-02", 3, 40),
        ("2026-11-03", 1, 300),
    ]
    assert 5 < days[0]["p50"] <= 10 and 20 < days[0]["p95"] <= 40
    by_code = degradation_days(tenant=owner.tenant, since=since)
    assert {code: {d.isoformat(): n for d, n in per_day.items()} for code, per_day in by_code.items()} == {
        "x": {"2026-11-02": 3},
        "y": {"2026-11-03": 1},  # one call that reported the code twice
    }


def test_a_creation_that_loses_the_race_adds_to_the_winners_row(owner):
    """Two first calls of an hour: both find no row, one inserts, the other's insert meets the unique key
    and falls back to the update."""
    context_call_record(tenant_id=owner.tenant.pk, milliseconds=3, degradation_codes=[], at=NOON)
    real_update = QuerySet.update
    calls = []

    def update_missing_once(self, **kwargs):
        calls.append(self.model)
        if len(calls) == 1:
            return 0  # as if the other process had not committed its row yet
        return real_update(self, **kwargs)

    with mock.patch.object(QuerySet, "update", update_missing_once):
        context_call_record(tenant_id=owner.tenant.pk, milliseconds=7, degradation_codes=[], at=NOON)
    row = ContextCallHour.objects.get(tenant=owner.tenant)
    assert (row.calls, row.ms_le_5, row.ms_le_10, row.latency_ms_max) == (2, 1, 1, 7)
    assert calls == [ContextCallHour, ContextCallHour]


def test_statistics_that_cannot_be_written_do_not_fail_the_call(owner, conversation, caplog):
    with mock.patch("prefix_cache.services._bump", side_effect=DatabaseError("disk full")):
        response = context_call(owner, conversation)
    assert response.status_code == 200 and response.json()["messages"]
    assert "context call statistics not recorded" in caplog.text
    assert not ContextCallHour.objects.exists()


def test_hours_older_than_ninety_days_are_pruned_daily(owner):
    now = datetime(2026, 11, 23, 10, tzinfo=UTC)
    for age in (0, 89, 91):
        at = now - timedelta(days=age)
        context_call_record(tenant_id=owner.tenant.pk, milliseconds=5, degradation_codes=["x"], at=at)
    assert context_stats_prune(now=now) == 2  # the 91-day-old hour and its degradation row
    kept = sorted(ContextCallHour.objects.values_list("hour", flat=True))
    assert [(now - h).days for h in kept] == [89, 0]
    assert DegradationHour.objects.count() == 2

    entries = {e["task"]: e for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert entries["prefix_cache.tasks.context_stats_prune"]["schedule"] == 24 * 60 * 60
    assert tasks.context_stats_prune.name == "prefix_cache.tasks.context_stats_prune"


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_lose_no_count_on_postgresql(owner):
    """Eight processes' worth of first calls of the same hours at once: every insert race and every UPDATE
    must add up (the F() increments are atomic in the database)."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent rollup updates are tested on PostgreSQL (set DATABASE_URL)")
    threads, per_thread, hours = 8, 60, 3
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                at = NOON + timedelta(hours=i % hours)
                context_call_record(
                    tenant_id=owner.tenant.pk, milliseconds=n + 1, degradation_codes=["x"], at=at
                )
        except BaseException as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    rows = ContextCallHour.objects.filter(tenant=owner.tenant)
    assert rows.count() == hours
    assert sum(r.calls for r in rows) == sum(sum(histogram(r)) for r in rows) == threads * per_thread
    assert max(r.latency_ms_max for r in rows) == threads
    assert (
        sum(DegradationHour.objects.filter(code="x").values_list("count", flat=True)) == threads * per_thread
    )


def test_a_server_process_buffers_calls_and_writes_them_together(owner, conversation, settings):
    settings.MNEMO_CONTEXT_STATS_FLUSH_SECONDS = 3600  # the flush thread does not run during the test
    for _ in range(3):
        assert context_call(owner, conversation).status_code == 200
    assert not ContextCallHour.objects.filter(tenant=owner.tenant).exists()

    context_calls_flush()

    row = ContextCallHour.objects.get(tenant=owner.tenant)
    assert row.calls == 3
    assert sum(getattr(row, name) for name in BUCKET_FIELDS) == 3
    context_calls_flush()  # nothing left: nothing counted twice
    assert ContextCallHour.objects.get(tenant=owner.tenant).calls == 3
