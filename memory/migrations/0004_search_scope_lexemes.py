"""PostgreSQL: the scope (c<conversation uuid hex> / u<end user id>) becomes a lexeme of each stored tsvector,
so one GIN lookup answers "this conversation AND these words" (GIN skips through the scope's posting list)
instead of AND-ing a bitmap of the conversation's whole seq range, which grew with the conversation (the
(conversation_id, seq) index stays for a window of recent seqs): the same scope token the SQLite FTS5 index
has had since 0003. The GIN pending list is kept small: every search scans it whole until it is merged.
SQLite: nothing to do.
"""

# ruff: noqa: S608 - constant DDL built from names defined here
from django.db import migrations

SYNC = """
CREATE OR REPLACE FUNCTION memory_message_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM memory_message_search WHERE message_id = OLD.id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.kind = 'message' AND NEW.role IN ('user', 'assistant')
            AND NEW.content <> '' THEN
        INSERT INTO memory_message_search (message_id, conversation_id, seq, document)
        VALUES (NEW.id, NEW.conversation_id, NEW.seq, mnemo_search_document(NEW.content){scope});
    END IF;
    RETURN NULL;
END
$$
"""
ARCHIVAL_SYNC = """
CREATE OR REPLACE FUNCTION memory_archival_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM memory_archival_search WHERE memory_id = OLD.id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO memory_archival_search (memory_id, end_user_id, document)
        VALUES (NEW.id, NEW.end_user_id, mnemo_search_document(NEW.content){scope});
    END IF;
    RETURN NULL;
END
$$
"""
MESSAGE_SCOPE = "array_to_tsvector(ARRAY['c' || replace({}conversation_id::text, '-', '')])"
USER_SCOPE = "array_to_tsvector(ARRAY['u' || {}end_user_id::text])"

FORWARDS = [
    SYNC.format(scope=" || " + MESSAGE_SCOPE.format("NEW.")),
    ARCHIVAL_SYNC.format(scope=" || " + USER_SCOPE.format("NEW.")),
    f"UPDATE memory_message_search SET document = document || {MESSAGE_SCOPE.format('')}",
    f"UPDATE memory_archival_search SET document = document || {USER_SCOPE.format('')}",
    "ALTER INDEX memory_message_search_document SET (gin_pending_list_limit = 256)",
    "ALTER INDEX memory_archival_search_document SET (gin_pending_list_limit = 256)",
]
BACKWARDS = [
    SYNC.format(scope=""),
    ARCHIVAL_SYNC.format(scope=""),
    "UPDATE memory_message_search SET document = "
    "ts_delete(document, 'c' || replace(conversation_id::text, '-', ''))",
    "UPDATE memory_archival_search SET document = ts_delete(document, 'u' || end_user_id::text)",
    "ALTER INDEX memory_message_search_document RESET (gin_pending_list_limit)",
    "ALTER INDEX memory_archival_search_document RESET (gin_pending_list_limit)",
]


def run(statements: list[str]):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [("memory", "0003_search_index")]

    operations = [migrations.RunPython(run(FORWARDS), run(BACKWARDS))]
