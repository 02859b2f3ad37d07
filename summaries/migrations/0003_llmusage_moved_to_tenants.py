"""LlmUsage now belongs to tenants (tenants 0002 took over the model and its table, summaries_llmusage):
state only, no row or table changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("summaries", "0002_compaction_run_marker"),
        ("tenants", "0002_llmusage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="LlmUsage")],
            database_operations=[],
        ),
    ]
