"""PostgreSQL: mnemo_active_turn(conversation), the conversation's active turn, for the one-statement append
(conversations/services.py). VOLATILE plpgsql, never inlined: its query takes a snapshot of its own when it
runs, after the calling statement holds the conversation's row lock, so a turn that a writer we waited for
started or ended is seen (a subquery of the statement would read the statement's older snapshot).
SQLite: nothing to do (it appends in a transaction).
"""

from django.db import migrations

FORWARDS = """
CREATE OR REPLACE FUNCTION mnemo_active_turn(conversation uuid) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT id FROM conversations_turn
            WHERE conversation_id = conversation AND status = 'active'
            ORDER BY index DESC LIMIT 1);
END
$$
"""
BACKWARDS = "DROP FUNCTION IF EXISTS mnemo_active_turn(uuid)"


def run(statement: str):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(statement, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [("conversations", "0003_ordering_by_column")]

    operations = [migrations.RunPython(run(FORWARDS), run(BACKWARDS))]
