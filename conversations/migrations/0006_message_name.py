from django.db import migrations, models

# ALTER TABLE ADD COLUMN instead of Django's table rebuild on SQLite: the rebuild renames the table, which
# SQLite refuses while a view reads it (memory's full-text source view), so an existing database could not
# migrate. A constant default makes the statement cheap on PostgreSQL too.
ADD = "ALTER TABLE conversations_message ADD COLUMN name varchar(64) NOT NULL DEFAULT ''"
DROP = "ALTER TABLE conversations_message DROP COLUMN name"


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0005_message_vector"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD, reverse_sql=DROP)],
            state_operations=[
                migrations.AddField(
                    model_name="message",
                    name="name",
                    field=models.CharField(blank=True, default="", max_length=64),
                ),
            ],
        ),
    ]
