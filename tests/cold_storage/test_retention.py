"""Retention (the daily beat task), conversation deletes, and the storage's write-then-link."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.utils import timezone

from cold_storage.models import ArchivedImage
from cold_storage.services import images_move_to_cold, images_purge_expired
from cold_storage.storage import tier_storage
from cold_storage.tasks import images_purge_expired as purge_task
from tests.cold_storage.conftest import blob_files
from tests.cold_storage.helpers import frame, image_part

pytestmark = pytest.mark.django_db


def store(actor, conversation, seed):
    body = actor.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"role": "tool", "parts": [image_part(frame(seed))]},
        format="json",
    ).json()
    return ArchivedImage.objects.get(pk=body["parts"][0]["image_id"])


def age(image, days):
    ArchivedImage.objects.filter(pk=image.pk).update(created_at=timezone.now() - timedelta(days=days))


def test_retention_deletes_only_old_unpinned_cold_images_and_reports_what_it_freed(owner, conversation):
    old_cold, old_pinned, young_cold, old_hot = (store(owner, conversation, s) for s in (1, 2, 3, 4))
    images_move_to_cold(image_ids=[old_cold.id, old_pinned.id, young_cold.id])
    ArchivedImage.objects.filter(pk=old_pinned.pk).update(pinned=True)
    for image, days in ((old_cold, 31), (old_pinned, 40), (young_cold, 29), (old_hot, 90)):
        age(image, days)
    old_cold.refresh_from_db()
    cold_key = old_cold.storage_key

    report = purge_task.delay().get()

    assert report["images"] == 1
    assert report["bytes"] == len(frame(1))
    assert report["tenants"] == {"owner": {"images": 1, "bytes": len(frame(1))}}
    old_cold.refresh_from_db()
    assert old_cold.purged_at is not None and old_cold.storage_key == ""
    assert not tier_storage("cold").exists(cold_key)
    assert ArchivedImage.objects.filter(purged_at__isnull=True).count() == 3
    assert len(blob_files()) == 3
    # The placeholder still names it; its bytes answer 410.
    assert owner.client.get(f"/api/v1/images/{old_cold.id}").status_code == 410
    # A second run frees nothing.
    assert images_purge_expired().images == 0


def test_retention_follows_the_tenants_setting(owner, outsider, conversation, outsider_conversation):
    owner.tenant.settings = {"image_retention_days": 7}
    owner.tenant.save()
    mine, theirs = store(owner, conversation, 1), store(outsider, outsider_conversation, 1)
    images_move_to_cold(image_ids=[mine.id, theirs.id])
    age(mine, 8)
    age(theirs, 8)
    report = images_purge_expired()
    assert report.tenants == {"owner": {"images": 1, "bytes": len(frame(1))}}


def test_retention_finishes_moves_a_failed_task_left_behind(owner, conversation):
    image = store(owner, conversation, 1)
    ArchivedImage.objects.filter(pk=image.pk).update(compacted_at=timezone.now())
    report = images_purge_expired()
    assert report.moved_to_cold == 1
    image.refresh_from_db()
    assert image.tier == "cold"


def test_the_daily_task_is_in_the_beat_schedule():
    entries = {e["task"]: e for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert entries["cold_storage.tasks.images_purge_expired"]["schedule"] == 24 * 60 * 60


def test_deleting_a_conversation_deletes_its_image_files(
    owner, conversation, django_capture_on_commit_callbacks
):
    from conversations.services import conversation_create

    first, second = store(owner, conversation, 1), store(owner, conversation, 2)
    store(owner, conversation, 2)  # a duplicate: a row without a file
    images_move_to_cold(image_ids=[second.id])
    other = conversation_create(tenant=owner.tenant)
    kept = store(owner, other, 3)
    assert len(blob_files()) == 3
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.client.delete(f"/api/v1/conversations/{conversation.id}")
    assert response.status_code == 204
    assert not ArchivedImage.objects.filter(conversation_id=conversation.id).exists()
    assert blob_files() == [f"hot/{kept.storage_key}"]
    assert first.id != kept.id


def test_the_storage_links_a_complete_file_and_never_overwrites():
    storage = tier_storage("hot")
    first = storage.save("t/a.png", ContentFile(b"one"))
    second = storage.save("t/a.png", ContentFile(b"two"))
    assert first == "t/a.png" and second != first
    with storage.open(first) as handle:
        assert handle.read() == b"one"
    assert not [n for n in blob_files() if ".tmp-" in n]
