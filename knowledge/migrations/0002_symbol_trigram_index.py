"""pg_trgm on PostgreSQL: the extension (when this role may create it) and a GIN trigram index on
Chunk.symbol_words, which knowledge.search uses for fuzzy symbol matches. Elsewhere, or without the
extension, search computes the same similarity in Python."""

from django.db import migrations


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        cursor.execute("SAVEPOINT knowledge_trgm")
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except Exception:  # no privilege: the portable path serves
            cursor.execute("ROLLBACK TO SAVEPOINT knowledge_trgm")
            return
        cursor.execute("RELEASE SAVEPOINT knowledge_trgm")
        cursor.execute(
            "CREATE INDEX IF NOT EXISTS chunk_symbol_trgm ON knowledge_chunk "
            "USING gin (symbol_words gin_trgm_ops)"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS chunk_symbol_trgm")


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
