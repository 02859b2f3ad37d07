"""The LLM budget ledger (LlmUsage) moves here from summaries, so that every app spending the tenant's budget
(summaries, the memory agent) imports a layer below it. State only: the table keeps its name,
summaries_llmusage, and its rows; summaries 0003 drops the model from summaries' state after this."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="LlmUsage",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("month", models.DateField(help_text="First day of the month.")),
                        ("purpose", models.CharField(default="summary", max_length=32)),
                        ("calls", models.PositiveIntegerField(default=0)),
                        ("prompt_tokens", models.PositiveBigIntegerField(default=0)),
                        ("completion_tokens", models.PositiveBigIntegerField(default=0)),
                        ("budget_fallbacks", models.PositiveIntegerField(default=0)),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="llm_usage",
                                to="tenants.tenant",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "LLM usage",
                        "verbose_name_plural": "LLM usage",
                        "db_table": "summaries_llmusage",
                        "ordering": ["-month", "tenant"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("tenant", "month", "purpose"), name="llmusage_unique_month"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
