"""Task state: the epoch advances per accepted event (it used to move only on a fold, so two writers at the
same expected_epoch both succeeded). Existing events are renumbered 1..n per conversation in id order; the
base keeps the events folded before (those of an older epoch) and the rest stay pending.

A client holding an old epoch number gets 409 and reads again, with one harmless exception: when nothing was
pending, the new epoch (events folded) can equal the old one (folds), and the state it read is unchanged."""

from django.db import migrations, models


def renumber(apps, schema_editor):
    TaskState = apps.get_model("memory", "TaskState")
    StateEvent = apps.get_model("memory", "StateEvent")
    # order_by(): the model's ordering by id would make distinct() yield a conversation once per event.
    conversation_ids = StateEvent.objects.order_by().values_list("conversation_id", flat=True).distinct()
    for conversation_id in conversation_ids.iterator():
        task_state, _ = TaskState.objects.get_or_create(conversation_id=conversation_id)
        events = list(StateEvent.objects.filter(conversation_id=conversation_id).order_by("id"))
        folded = sum(1 for e in events if e.epoch < task_state.epoch)
        for n, event in enumerate(events, start=1):
            event.epoch = n
        StateEvent.objects.bulk_update(events, ["epoch"], batch_size=500)
        task_state.base_epoch = folded
        task_state.epoch = len(events)
        task_state.save(update_fields=["epoch", "base_epoch"])


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0005_operation_details"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskstate",
            name="base_epoch",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(renumber, migrations.RunPython.noop),
    ]
