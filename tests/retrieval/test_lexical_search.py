"""Full-text search on the database (PostgreSQL tsvector + GIN, SQLite FTS5; `make test` runs it on SQLite,
`make test-services` on PostgreSQL): recall over the end user's other conversations and archival memory
search are scoped in SQL, follow every insert, update and delete through the triggers, find identifiers and
CJK text, and never fail on what a user types."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from conversations.models import Message
from conversations.services import conversation_create
from memory.archival import archival_insert, archival_search
from memory.models import ArchivalMemory
from retrieval import lexical
from retrieval.other_conversations import RECALL_EXCERPT_CHARS, recall_other_conversations
from tenants.services import end_user_get_or_create
from tests.summaries.helpers import append

pytestmark = pytest.mark.django_db

FILLER = [
    "Thanks, that helps. Let us keep going with the plan as discussed.",
    "Sure, I looked through the recent output and nothing stands out.",
    "I had a look and everything seems fine for now.",
    "We are on track; the remaining items are the review and the release notes.",
]


@pytest.fixture(autouse=True)
def lexical_only(settings):
    settings.MNEMO_EMBEDDINGS = "none"
    lexical._stats.clear()
    yield
    lexical._stats.clear()


def chat(conversation, *texts):
    """User and assistant messages in turn, with filler around, returning the stored messages."""
    items = []
    for i, text in enumerate(texts):
        items.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return append(conversation, *items)


def filler(conversation, n):
    return chat(conversation, *[FILLER[i % len(FILLER)] for i in range(n)])


def recall(conversation, query, **kwargs):
    """What a new conversation of the same end user recalls of `conversation`."""
    asking = conversation_create(
        tenant=conversation.tenant, end_user_external_id=conversation.end_user.external_id, title="Asking"
    )
    return recall_other_conversations(conversation=asking, query=query, **kwargs)


# --- the query side: what reaches the index ------------------------------------------------------------


def test_phrases_identifiers_cjk_and_stopwords():
    assert lexical.search_phrases("Which deploy key is KX-4821?") == [("deploy",), ("key",), ("kx", "4821")]
    assert lexical.search_phrases("open src/export/batch.py at v1.2.3") == [
        ("open",),
        ("src", "export", "batch", "py"),
        ("v1", "2", "3"),
    ]
    assert lexical.search_phrases("刚才说的那个文件") == [
        tuple(w) for w in ["刚才", "才说", "说的", "的那", "那个", "个文", "文件"]
    ]
    assert lexical.search_phrases("猫") == [("猫",)]
    assert lexical.search_phrases("Ünïcode café") == [("ünïcode",), ("café",)]
    for nothing in [
        "",
        "   ",
        "what is it?",
        "the and of",
        "!!! ??? ...",
        "' \" : & | ! ( ) < > * \\ -- ~ ^",
    ]:
        assert lexical.search_phrases(nothing) == []


@pytest.mark.parametrize(
    "query",
    [
        "it's 'quoted' \"double\" a&b a|b !x (y) <-> x:* \\ NEAR(a b) AND OR NOT ^start col:value -neg +pos",
        "O'Reilly's don't won't",
        "SELECT * FROM x; DROP TABLE y; --",
        "x" * 500 + " kx-4821",
        "%s %(name)s {0} $1 ?",
    ],
)
def test_no_query_breaks_the_index_syntax(conversation, query):
    chat(conversation, "The staging deploy key for billing is KX-4821.", "Noted.")
    phrases = lexical.search_phrases(query)
    for phrase in phrases:
        for atom in phrase:
            assert atom.isalnum() or all(ch.isalnum() for ch in atom)
    recall(conversation, query)  # no error, whatever comes back
    end_user = conversation.end_user
    archival_insert(end_user=end_user, content="The deploy key for billing is KX-4821.")
    archival_search(end_user=end_user, query=query)


# --- recall over messages --------------------------------------------------------------------------------


def test_recall_returns_the_users_earlier_messages_never_the_asking_conversations(conversation):
    filler(conversation, 6)
    fact = chat(conversation, "Remember that the staging deploy key for billing is KX-4821.", "Noted.")[0]
    filler(conversation, 6)
    hits = recall(conversation, "Which deploy key does billing staging use?")
    assert [h.seq for h in hits][:1] == [fact.seq]
    assert hits[0].id == str(fact.id) and hits[0].role == "user" and "KX-4821" in hits[0].content
    assert hits[0].conversation_id == str(conversation.id)
    # The asking conversation's own history is memory.history_index's: never a hit here.
    query = "Which deploy key does billing staging use?"
    assert recall_other_conversations(conversation=conversation, query=query) == []


def test_recall_is_scoped_to_the_end_user_in_the_tenant(owner, outsider, conversation, outsider_conversation):
    secret = "The rollback vault entry is zebra-quartz-42."
    chat(outsider_conversation, secret, "Noted.")
    other_user = conversation_create(tenant=owner.tenant, end_user_external_id="bob", title="Bob's")
    chat(other_user, secret, "Noted.")
    anonymous = conversation_create(tenant=owner.tenant, title="No end user")
    chat(anonymous, secret, "Noted.")
    filler(conversation, 4)
    assert recall(conversation, "zebra-quartz-42 rollback vault") == []
    own = chat(conversation, secret, "Noted.")[0]
    filler(conversation, 2)
    assert [h.id for h in recall(conversation, "zebra-quartz-42 rollback vault")] == [str(own.id)]
    # A conversation without an end user has no other conversations.
    assert recall_other_conversations(conversation=anonymous, query="zebra-quartz-42 rollback vault") == []


@pytest.mark.parametrize(
    "statement, query",
    [
        ("The staging deploy key for billing is KX-4821.", "kx-4821"),
        ("Edit src/export/batch.py to raise the retry limit.", "what changed in src/export/batch.py?"),
        ("We pinned the client library to 3.14.2 last week.", "why 3.14.2"),
        ("Mail ops@example.com when the export fails.", "ops@example.com"),
        ("The flag is named billing_v2_rollout now.", "billing_v2_rollout"),
        ("部署密钥保存在保险库里，名字叫斑马。", "部署密钥在哪里"),
        ("ステージングのパスワードは金庫にあります。", "パスワード"),
        ("Der Schlüssel für die Abrechnung liegt im Tresor.", "Wo liegt der Schlüssel?"),
    ],
)
def test_recall_finds_identifiers_paths_and_cjk(conversation, statement, query):
    filler(conversation, 4)
    fact = chat(conversation, statement, "Noted.")[0]
    filler(conversation, 4)
    hits = recall(conversation, query, min_score=0.0)
    assert hits and hits[0].seq == fact.seq


@pytest.mark.parametrize("query", ["", "   ", "what is it?", "the and of", "?!...", "'\"&|!():*<>\\"])
def test_recall_of_only_stopwords_or_punctuation_is_empty(conversation, query):
    chat(conversation, "What is it? The and of it.", "It is what it is!")
    filler(conversation, 2)
    assert recall(conversation, query, min_score=0.0) == []


def test_the_index_follows_updates_and_deletes(conversation):
    filler(conversation, 4)
    message = chat(conversation, "The pager number for on-call is 5550-1234.", "Noted.")[0]
    filler(conversation, 2)
    assert [h.seq for h in recall(conversation, "pager 5550-1234", min_score=0.0)] == [message.seq]
    message.content = "The pager rota lives in the wiki now."
    message.save(update_fields=["content"])
    assert recall(conversation, "5550-1234", min_score=0.0) == []
    assert [h.seq for h in recall(conversation, "rota wiki", min_score=0.0)] == [message.seq]
    # Only user and assistant messages of kind "message" are searched.
    Message.objects.filter(pk=message.pk).update(kind=Message.Kind.COMPACT_SUMMARY)
    assert recall(conversation, "rota wiki", min_score=0.0) == []
    Message.objects.filter(pk=message.pk).update(kind=Message.Kind.MESSAGE)
    assert [h.seq for h in recall(conversation, "rota wiki", min_score=0.0)] == [message.seq]
    Message.objects.filter(pk=message.pk).delete()
    assert recall(conversation, "rota wiki", min_score=0.0) == []
    conversation.delete()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM memory_message_search WHERE conversation_id = %s", [conversation.id]
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM memory_message_fts WHERE memory_message_fts MATCH %s",
                [f'scope : "{lexical.scope_token("c", conversation.id)}"'],
            )
        assert cursor.fetchone()[0] == 0


def test_common_words_do_not_select_when_the_index_is_big(conversation, monkeypatch):
    monkeypatch.setattr(lexical, "COMMON_MIN_DOCUMENTS", 1)
    filler(conversation, 40)
    fact = chat(conversation, "Remember that the kestrel cluster runs the export.", "Noted.")[0]
    filler(conversation, 4)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE memory_message_search")
    phrases = lexical.search_phrases("Which cluster runs the export for us? Thanks, it helps")
    chosen, shares, _ = lexical.selective(lexical.MESSAGES, phrases, scope_size=46, budget=3)
    assert ("kestrel",) not in chosen  # not asked for
    assert ("thanks",) not in chosen and ("helps",) not in chosen  # in a quarter of the messages
    assert set(chosen) <= {("cluster",), ("runs",), ("export",)}
    assert shares["thanks"] > 0.2
    hits = recall(conversation, "Which cluster runs the export for us? Thanks, it helps")
    assert [h.seq for h in hits][:1] == [fact.seq]


# --- archival memories -----------------------------------------------------------------------------------


def test_archival_search_is_scoped_and_leaves_invalidated_memories_out(owner, outsider):
    alice = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    bob = end_user_get_or_create(tenant=owner.tenant, external_id="bob")
    mallory = end_user_get_or_create(tenant=outsider.tenant, external_id="alice")
    for end_user in (bob, mallory):
        archival_insert(end_user=end_user, content="The vault entry for rollbacks is zebra-quartz-42.")
    assert archival_search(end_user=alice, query="zebra-quartz-42 vault").hits == []
    old = archival_insert(end_user=alice, content="My favourite editor is vim-9.1.").memory
    new = archival_insert(end_user=alice, content="My favourite editor is helix-24.07.").memory
    assert ArchivalMemory.objects.get(pk=old.pk).invalidated_at is not None
    hits = archival_search(end_user=alice, query="favourite editor vim-9.1 helix").hits
    assert [h.memory.pk for h in hits] == [new.pk]
    assert archival_search(end_user=alice, query="vim-9.1").hits == []


def test_archival_search_finds_identifiers_and_cjk(owner):
    alice = end_user_get_or_create(tenant=owner.tenant, external_id="alice")
    key = archival_insert(end_user=alice, content="The staging deploy key for billing is KX-4821.").memory
    cjk = archival_insert(end_user=alice, content="部署密钥保存在保险库里。").memory
    archival_insert(end_user=alice, content="Alice likes short answers.")
    assert archival_search(end_user=alice, query="KX-4821").hits[0].memory.pk == key.pk
    assert archival_search(end_user=alice, query="密钥在哪里").hits[0].memory.pk == cjk.pk
    assert archival_search(end_user=alice, query="the of and ?!").hits == []
    # An edit is re-indexed, a delete leaves the index.
    key.content = "The staging deploy key for billing is JP-1937."
    key.save(update_fields=["content"])
    assert archival_search(end_user=alice, query="KX-4821").hits == []
    assert archival_search(end_user=alice, query="JP-1937").hits[0].memory.pk == key.pk
    key.delete()
    assert archival_search(end_user=alice, query="JP-1937").hits == []


# --- the migration indexes what was there before it --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_indexes_existing_rows(owner):
    executor = MigrationExecutor(connection)
    leaf = executor.loader.graph.leaf_nodes("memory")
    executor.migrate([("memory", "0002_memoryagentcursor")])
    try:
        conversation = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Old")
        filler(conversation, 4)
        old = chat(conversation, "The rollback vault entry is zebra-quartz-42.", "Noted.")[0]
        filler(conversation, 2)
        memory = ArchivalMemory.objects.create(
            tenant=owner.tenant, end_user=conversation.end_user, content="Alice's cluster is called kestrel."
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaf)
    lexical._stats.clear()
    assert [h.seq for h in recall(conversation, "zebra-quartz-42", min_score=0.0)] == [old.seq]
    assert (
        archival_search(end_user=conversation.end_user, query="kestrel cluster").hits[0].memory.pk
        == memory.pk
    )
    # And the triggers are back: a new message is found too.
    new = chat(conversation, "The new vault entry is lynx-basalt-7.", "Noted.")[0]
    filler(conversation, 2)
    assert [h.seq for h in recall(conversation, "lynx-basalt-7", min_score=0.0)] == [new.seq]


def test_recall_names_the_conversation_a_hit_comes_from(owner, conversation):
    secret = "The rollback vault entry is zebra-quartz-42."
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Last week")
    filler(earlier, 4)
    said = chat(earlier, secret, "Noted.")[0]
    filler(earlier, 2)
    filler(conversation, 4)
    hits = recall_other_conversations(
        conversation=conversation, query="Which vault entry holds the rollback?"
    )
    assert [(h.id, h.seq, h.conversation_id, h.conversation_title) for h in hits] == [
        (str(said.id), said.seq, str(earlier.id), "Last week")
    ]


def test_a_hit_carries_the_sentence_that_matched(conversation):
    long = " ".join([FILLER[i % len(FILLER)] for i in range(8)])
    statement = "Note for later: the deploy key for ledger on staging is QW-4821."
    fact = chat(conversation, f"{long} {statement} {long}", "Noted.")[0]
    filler(conversation, 4)
    hit = recall(conversation, "Which key do I need to push ledger to staging?")[0]
    assert hit.seq == fact.seq and len(hit.content) > 600
    assert statement in hit.excerpt and len(hit.excerpt) <= RECALL_EXCERPT_CHARS + 10
    assert hit.excerpt.startswith("…") and hit.excerpt.endswith("…")


def test_words_a_rewrite_added_weigh_less_than_the_users_own(conversation):
    filler(conversation, 2)
    own = chat(conversation, "The kestrel cluster runs the nightly export.", "Noted.")[0]
    added = chat(conversation, "The report builder renders src/report/pdf.py badly.", "Noted.")[0]
    filler(conversation, 2)
    query = "Which cluster runs the export?"
    hits = recall(conversation, query, expansion="src/report/pdf.py report builder renders", min_score=0.0)
    assert [h.seq for h in hits][:2] == [own.seq, added.seq]
