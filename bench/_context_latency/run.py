"""One context-latency run: a conversation per size filled and embedded, the calls timed, the report.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import os
import random

from django.db import connection

from bench._common import MODEL, PROFILE_NAME, PROFILE_POLICY, PROFILE_SCOPE, log
from bench._context_latency.fill import embed_all, fill, message_pool
from bench._context_latency.measure import Series, measure, profile_calls, query_breakdown
from bench._context_latency.report import context_lines, report
from context.services import agent_profile_create
from conversations.services import conversation_create
from tenants.models import Tenant
from tenants.services import tenant_create


def loaded(tenant: Tenant, args: argparse.Namespace) -> list[Series]:
    """One conversation per size, filled and embedded, then ANALYZE as autovacuum would have run it."""
    log("building the message pool ...")
    pool = message_pool(args.seed)
    rng = random.Random(f"{args.seed}-fill")
    series = []
    for size in args.sizes:
        conversation = conversation_create(tenant=tenant, model=MODEL, title=f"{size} messages")
        s = Series(f"{size:,} messages", size, conversation.id)
        s.load_seconds, s.segments = fill(conversation, size, pool, rng)
        s.vectors_seconds = embed_all(conversation)
        log(f"loaded {size:,} messages in {s.load_seconds:.1f}s, vectors in {s.vectors_seconds:.1f}s")
        series.append(s)
    with connection.cursor() as cursor:
        # Fresh statistics, as autovacuum would have gathered on a table that grew this way.
        cursor.execute("ANALYZE")
    return series


def run(args: argparse.Namespace) -> tuple[str, bool]:
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = f"PostgreSQL {cursor.fetchone()[0].split()[0]}"
    tenant, _ = tenant_create(slug="bench-ctx")
    agent_profile_create(
        tenant=tenant, name=PROFILE_NAME, scope=PROFILE_SCOPE, policy=PROFILE_POLICY, is_default=True
    )
    series = loaded(tenant, args)
    log(f"timing {args.calls} calls per size ...")
    load_before = os.getloadavg()[0]
    floor = measure(tenant, series, args.calls, args.warmup, random.Random(f"{args.seed}-order"))
    load_after = os.getloadavg()[0]
    for s in series:
        query_breakdown(tenant, s, calls=20 if args.profile else 1, show=args.profile)
    if args.profile:
        profile_calls(tenant, series[-1], calls=min(args.calls, 100))
    context = context_lines(args, series, pg_version, load=(load_before, load_after))
    return report(series, floor, args, context)
