"""Full-text indexes for recall over messages and for archival memories, kept in sync by triggers, and filled
from the rows that exist.

PostgreSQL: memory_message_search / memory_archival_search hold a stored tsvector per searchable row (GIN
index) with the columns search is scoped by. A stored vector, not an expression index: to_tsvector costs about
0.1-0.2 ms per message, and ranking (ts_rank_cd) or rechecking rows of an expression index recomputes it for
every row it touches; from the stored column it is a few microseconds. The 'simple' configuration: no
stemming or stopwords of one language (conversations mix languages, and identifiers must stay as written),
after mnemo_search_document has made punctuation a separator (the default parser would read KX-4821 as 'kx'
and '-4821', a path as one 'file' token) and set CJK characters apart (CJK has no spaces).

SQLite: FTS5 tables memory_message_fts / memory_archival_fts over views that give each searchable row its
scope token (c<conversation> or u<end user>) and its body (CJK characters set apart the same way), with
fts5vocab tables for term statistics. Keyed by the rowid of the source table. Django rebuilds a SQLite table
on some schema changes (and VACUUM may renumber rowids), which drops its triggers: migrating memory back to
0002 and forwards again restores them and rebuilds the index.

Searchable messages: kind 'message', role user or assistant, non-empty content. All archival memories are
indexed; search leaves the invalidated ones out by joining the live rows.
"""

# ruff: noqa: S608 - constant DDL built from names defined here
from django.db import migrations

CJK_CLASS = "\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af"
# ASCII punctuation, Latin-1 symbols, general punctuation and symbols, CJK and fullwidth punctuation.
SEPARATORS = (
    r"!-/:-@\[-`{-~\u00a0-\u00bf\u00d7\u00f7\u2000-\u2bff\u3000-\u303f\ufe30-\ufe4f"
    r"\uff00-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"
)

POSTGRESQL_FORWARDS = [
    f"""
    CREATE OR REPLACE FUNCTION mnemo_search_document(body text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
        SELECT to_tsvector('simple'::regconfig, regexp_replace(
            regexp_replace(lower(body), '[{SEPARATORS}]+', ' ', 'g'),
            '([{CJK_CLASS}])', ' \\1 ', 'g'))
    $$
    """,
    """
    CREATE TABLE memory_message_search (
        message_id uuid PRIMARY KEY,
        conversation_id uuid NOT NULL,
        seq bigint NOT NULL,
        document tsvector NOT NULL
    )
    """,
    "CREATE INDEX memory_message_search_document ON memory_message_search USING gin (document)",
    "CREATE INDEX memory_message_search_scope ON memory_message_search (conversation_id, seq)",
    """
    CREATE OR REPLACE FUNCTION memory_message_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            DELETE FROM memory_message_search WHERE message_id = OLD.id;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.kind = 'message' AND NEW.role IN ('user', 'assistant')
                AND NEW.content <> '' THEN
            INSERT INTO memory_message_search (message_id, conversation_id, seq, document)
            VALUES (NEW.id, NEW.conversation_id, NEW.seq, mnemo_search_document(NEW.content));
        END IF;
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER memory_message_search_insert AFTER INSERT ON conversations_message
    FOR EACH ROW EXECUTE FUNCTION memory_message_search_sync()
    """,
    """
    CREATE TRIGGER memory_message_search_update AFTER UPDATE ON conversations_message FOR EACH ROW
    WHEN (OLD.content IS DISTINCT FROM NEW.content OR OLD.kind IS DISTINCT FROM NEW.kind
          OR OLD.role IS DISTINCT FROM NEW.role OR OLD.seq IS DISTINCT FROM NEW.seq
          OR OLD.conversation_id IS DISTINCT FROM NEW.conversation_id)
    EXECUTE FUNCTION memory_message_search_sync()
    """,
    """
    CREATE TRIGGER memory_message_search_delete AFTER DELETE ON conversations_message
    FOR EACH ROW EXECUTE FUNCTION memory_message_search_sync()
    """,
    """
    CREATE OR REPLACE FUNCTION memory_message_search_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        TRUNCATE memory_message_search;
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER memory_message_search_truncate AFTER TRUNCATE ON conversations_message
    FOR EACH STATEMENT EXECUTE FUNCTION memory_message_search_truncate()
    """,
    """
    INSERT INTO memory_message_search (message_id, conversation_id, seq, document)
    SELECT id, conversation_id, seq, mnemo_search_document(content) FROM conversations_message
    WHERE kind = 'message' AND role IN ('user', 'assistant') AND content <> ''
    """,
    """
    CREATE TABLE memory_archival_search (
        memory_id uuid PRIMARY KEY,
        end_user_id bigint NOT NULL,
        document tsvector NOT NULL
    )
    """,
    "CREATE INDEX memory_archival_search_document ON memory_archival_search USING gin (document)",
    "CREATE INDEX memory_archival_search_scope ON memory_archival_search (end_user_id)",
    """
    CREATE OR REPLACE FUNCTION memory_archival_search_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            DELETE FROM memory_archival_search WHERE memory_id = OLD.id;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO memory_archival_search (memory_id, end_user_id, document)
            VALUES (NEW.id, NEW.end_user_id, mnemo_search_document(NEW.content));
        END IF;
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER memory_archival_search_insert AFTER INSERT ON memory_archivalmemory
    FOR EACH ROW EXECUTE FUNCTION memory_archival_search_sync()
    """,
    """
    CREATE TRIGGER memory_archival_search_update AFTER UPDATE ON memory_archivalmemory FOR EACH ROW
    WHEN (OLD.content IS DISTINCT FROM NEW.content OR OLD.end_user_id IS DISTINCT FROM NEW.end_user_id)
    EXECUTE FUNCTION memory_archival_search_sync()
    """,
    """
    CREATE TRIGGER memory_archival_search_delete AFTER DELETE ON memory_archivalmemory
    FOR EACH ROW EXECUTE FUNCTION memory_archival_search_sync()
    """,
    """
    CREATE OR REPLACE FUNCTION memory_archival_search_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        TRUNCATE memory_archival_search;
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER memory_archival_search_truncate AFTER TRUNCATE ON memory_archivalmemory
    FOR EACH STATEMENT EXECUTE FUNCTION memory_archival_search_truncate()
    """,
    """
    INSERT INTO memory_archival_search (memory_id, end_user_id, document)
    SELECT id, end_user_id, mnemo_search_document(content) FROM memory_archivalmemory
    """,
]

POSTGRESQL_BACKWARDS = [
    "DROP TRIGGER IF EXISTS memory_message_search_insert ON conversations_message",
    "DROP TRIGGER IF EXISTS memory_message_search_update ON conversations_message",
    "DROP TRIGGER IF EXISTS memory_message_search_delete ON conversations_message",
    "DROP TRIGGER IF EXISTS memory_message_search_truncate ON conversations_message",
    "DROP TRIGGER IF EXISTS memory_archival_search_insert ON memory_archivalmemory",
    "DROP TRIGGER IF EXISTS memory_archival_search_update ON memory_archivalmemory",
    "DROP TRIGGER IF EXISTS memory_archival_search_delete ON memory_archivalmemory",
    "DROP TRIGGER IF EXISTS memory_archival_search_truncate ON memory_archivalmemory",
    "DROP FUNCTION IF EXISTS memory_message_search_sync()",
    "DROP FUNCTION IF EXISTS memory_message_search_truncate()",
    "DROP FUNCTION IF EXISTS memory_archival_search_sync()",
    "DROP FUNCTION IF EXISTS memory_archival_search_truncate()",
    "DROP TABLE IF EXISTS memory_message_search",
    "DROP TABLE IF EXISTS memory_archival_search",
    "DROP FUNCTION IF EXISTS mnemo_search_document(text)",
]


def sqlite_body(column: str) -> str:
    """The text FTS5 indexes: the column as it is, or with each CJK character set apart by spaces (FTS5's
    unicode61 tokenizer would read a CJK run as one word). Plain SQL, no function of ours: any connection
    (the sqlite3 shell too) can write the tables these triggers watch."""
    cjk = " OR ".join(
        f"unicode(ch) BETWEEN {lo} AND {hi}"
        for lo, hi in ((0x3040, 0x30FF), (0x3400, 0x9FFF), (0xAC00, 0xD7AF))
    )
    positions = f"json_each('[' || substr(replace(hex(zeroblob(length({column}))), '00', ',0'), 2) || ']')"
    return (
        f"CASE WHEN {column} GLOB '*[{CJK_CLASS}]*' THEN ("
        f"SELECT group_concat(CASE WHEN {cjk} THEN ' ' || ch || ' ' ELSE ch END, '') "
        f"FROM (SELECT substr({column}, p.key + 1, 1) AS ch FROM {positions} AS p)"
        f") ELSE {column} END"
    )


def sqlite_index(name: str, table: str, scope: str, where: str, changed: str) -> list[str]:
    source = f"{name}_source"
    where_clause = f"WHERE {where}" if where else ""
    rows = f"SELECT 'delete', rid, scope, body FROM {source} WHERE rid = old.rowid"
    return [
        f"""
        CREATE VIEW {source} AS
        SELECT t.rowid AS rid, {scope} AS scope, {sqlite_body("t.content")} AS body
        FROM {table} AS t {where_clause}
        """,
        f"""
        CREATE VIRTUAL TABLE {name} USING fts5(
            scope, body, content='{source}', content_rowid='rid', tokenize='unicode61 remove_diacritics 0'
        )
        """,
        f"CREATE VIRTUAL TABLE {name}_vocab USING fts5vocab({name}, 'row')",
        f"""
        CREATE TRIGGER {name}_insert AFTER INSERT ON {table} BEGIN
            INSERT INTO {name} (rowid, scope, body) SELECT rid, scope, body FROM {source} WHERE rid = new.rowid;
        END
        """,
        f"""
        CREATE TRIGGER {name}_delete BEFORE DELETE ON {table} BEGIN
            INSERT INTO {name} ({name}, rowid, scope, body) {rows};
        END
        """,
        f"""
        CREATE TRIGGER {name}_update_before BEFORE UPDATE ON {table} WHEN {changed} BEGIN
            INSERT INTO {name} ({name}, rowid, scope, body) {rows};
        END
        """,
        f"""
        CREATE TRIGGER {name}_update_after AFTER UPDATE ON {table} WHEN {changed} BEGIN
            INSERT INTO {name} (rowid, scope, body) SELECT rid, scope, body FROM {source} WHERE rid = new.rowid;
        END
        """,
        # Existing rows ('rebuild' reads the content table in a way a view does not support).
        f"INSERT INTO {name} (rowid, scope, body) SELECT rid, scope, body FROM {source}",
    ]


def changed(*columns: str) -> str:
    return "(" + " OR ".join(f"old.{c} IS NOT new.{c}" for c in columns) + ")"


SQLITE_FORWARDS = [
    *sqlite_index(
        "memory_message_fts",
        "conversations_message",
        "'c' || t.conversation_id",
        "t.kind = 'message' AND t.role IN ('user', 'assistant') AND t.content <> ''",
        changed("content", "kind", "role", "conversation_id"),
    ),
    *sqlite_index(
        "memory_archival_fts",
        "memory_archivalmemory",
        "'u' || t.end_user_id",
        "",
        changed("content", "end_user_id"),
    ),
]

SQLITE_BACKWARDS = [
    f"DROP {kind} IF EXISTS {name}{suffix}"
    for name in ("memory_message_fts", "memory_archival_fts")
    for kind, suffix in (
        ("TRIGGER", "_insert"),
        ("TRIGGER", "_delete"),
        ("TRIGGER", "_update_before"),
        ("TRIGGER", "_update_after"),
        ("TABLE", "_vocab"),
        ("TABLE", ""),
        ("VIEW", "_source"),
    )
]


def run(statements: dict[str, list[str]]):
    def apply(apps, schema_editor):
        for statement in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement, params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0003_ordering_by_column"),
        ("memory", "0002_memoryagentcursor"),
    ]

    operations = [
        migrations.RunPython(
            run({"postgresql": POSTGRESQL_FORWARDS, "sqlite": SQLITE_FORWARDS}),
            run({"postgresql": POSTGRESQL_BACKWARDS, "sqlite": SQLITE_BACKWARDS}),
        ),
    ]
