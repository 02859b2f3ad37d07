"""The last-boundary read, run on every context call as a prepared statement, uses the partial index on
boundaries even in PostgreSQL's generic plan: with the kind as a parameter that plan could not, and walked a
conversation without a boundary back to its first message (2.5 ms at 10,000 messages)."""

import pytest
from django.db import connection

from conversations.services import conversation_create
from summaries.selectors import _LAST_BOUNDARY, boundary_last

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's planner (set DATABASE_URL)"
)


def test_the_generic_plan_reads_the_boundary_index(owner):
    conversation = conversation_create(tenant=owner.tenant, title="no boundary")
    sql = _LAST_BOUNDARY._prepared("default").sql
    assert sql.count("%s") == 1  # only the conversation is a parameter
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE last_boundary(uuid) AS {sql.replace('%s', '$1')}")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"EXPLAIN EXECUTE last_boundary('{conversation.pk}')")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE last_boundary")
    assert "message_boundary_seq" in plan
    assert boundary_last(conversation.pk) == (0, 0)
