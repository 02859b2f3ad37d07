# A migration of its own: on PostgreSQL, altering the table in the transaction that renumbered its rows
# could fail with pending trigger events.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0006_task_state_epoch_per_event"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="stateevent",
            name="memory_stat_convers_5dedac_idx",
        ),
        migrations.AddConstraint(
            model_name="stateevent",
            constraint=models.UniqueConstraint(
                fields=("conversation", "epoch"), name="state_event_epoch_unique"
            ),
        ),
    ]
