"""Admin: segments on the conversation page (with their fact-check counts), the actions "compact now" and
"rebuild summaries", and read-only lists of segments and monthly LLM usage, all tenant-scoped."""

from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from conversations.admin import ConversationAdmin
from conversations.models import Conversation
from summaries.locks import LockBusy
from summaries.models import SummarySegment
from summaries.selectors import compaction_status
from summaries.services import CompactionStale, compaction_request, compaction_run
from summaries.tasks import segments_rebuild
from tenants.admin_scoping import AppendOnlyAdmin
from tenants.models import LlmUsage

_SEGMENT_COLUMNS = (
    "Messages",
    "Level",
    "Source",
    "Built from",
    "Tokens",
    "Facts checked",
    "Facts missing",
    "Template",
    "Live",
    "Text",
)


@admin.display(description="Summary segments (B4)")
def summary_segments(obj: Conversation) -> str:
    """The conversation's segments, oldest first, superseded ones too (greyed): a read-only table rather
    than an inline, so saving the conversation form needs no formset for them."""
    if obj is None or obj.pk is None:
        return "—"
    segments = SummarySegment.objects.filter(conversation=obj).order_by("start_seq", "level", "created_at")
    if not segments:
        return "No summary segments yet."
    rows = format_html_join(
        "\n",
        '<tr style="{}"><td><a href="{}">{}–{}</a></td>' + "<td>{}</td>" * 9 + "</tr>",
        (
            (
                "" if s.superseded_by_id is None else "opacity:0.5",
                reverse("admin:summaries_summarysegment_change", args=[s.pk]),
                s.start_seq,
                s.end_seq,
                s.level,
                s.get_source_display(),
                s.get_built_from_display(),
                s.token_count,
                s.facts_checked,
                s.facts_missing,
                s.template_version,
                "yes" if s.superseded_by_id is None else "superseded",
                Truncator(s.text).chars(200),
            )
            for s in segments
        ),
    )
    head = format_html_join("", "<th>{}</th>", ((c,) for c in _SEGMENT_COLUMNS))
    return format_html("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", head, rows)


@admin.display(description="Compaction")
def compaction_state(obj: Conversation) -> str:
    """Status, counts and the last error of a failed or interrupted run (kept until a run succeeds)."""
    if obj is None or obj.pk is None:
        return "—"
    state = compaction_status(obj)
    return format_html(
        "{} · {} compaction(s), {} failure(s){}{}",
        state["status"],
        state["compactions"],
        state["failures"],
        format_html(" · summaries rolled up to fit {} tokens", state["summary_budget"])
        if state["summary_budget"]
        else "",
        format_html(" · last failed {}: {}", state["last_failed_at"], state["last_error"])
        if state["last_error"]
        else "",
    )


# "Compact now" runs in the request for a few conversations, so it can say what happened; a larger selection
# is queued (the outcome then shows on each conversation's page, under Compaction).
COMPACT_NOW_LIMIT = 5


def compact_one(conversation: Conversation) -> tuple[int, str]:
    """Compact `conversation` now: (message level, what happened) for the admin's message."""
    name = f"{conversation} ({str(conversation.pk)[:8]})"
    try:
        outcome = compaction_run(conversation=conversation, trigger="manual", sync=True)
    except (LockBusy, CompactionStale):
        return messages.WARNING, f"{name}: not compacted, another compaction is running; try again shortly."
    except Exception as exc:  # recorded by compaction_run (Compaction: failures, last error)
        return messages.ERROR, f"{name}: compaction failed: {Truncator(str(exc)).chars(200)}"
    if outcome is None:
        return messages.INFO, f"{name}: not needed, the history since the last boundary is too short."
    return messages.SUCCESS, (
        f"{name}: compacted messages {outcome.start_seq}–{outcome.end_seq}, "
        f"{outcome.tokens_before:,} → {outcome.tokens_after:,} tokens ({outcome.source})."
    )


@admin.action(description="Compact now", permissions=["change"])
def compact_now(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    allowed = list(modeladmin.scoped_for(request, queryset, modeladmin.change_roles).select_related("tenant"))
    if len(allowed) <= COMPACT_NOW_LIMIT:
        for conversation in allowed:
            level, text = compact_one(conversation)
            modeladmin.message_user(request, text, level)
        return
    queued = 0
    with transaction.atomic():
        for conversation in allowed:
            queued += compaction_request(conversation=conversation, trigger="manual")
    modeladmin.message_user(
        request,
        f"{len(allowed)} conversations are more than {COMPACT_NOW_LIMIT} to compact at once: compaction "
        f"queued for {queued} (already queued ones were left as they were). Each page shows its outcome.",
        messages.INFO,
    )


@admin.action(description="Rebuild summaries", permissions=["change"])
def rebuild_summaries(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    allowed = modeladmin.scoped_for(request, queryset, modeladmin.change_roles)
    ids = [str(pk) for pk in allowed.values_list("pk", flat=True)]
    for conversation_id in ids:
        transaction.on_commit(partial(segments_rebuild.delay, conversation_id), robust=True)
    modeladmin.message_user(
        request, f"Summary rebuild queued for {len(ids)} conversation(s).", messages.SUCCESS
    )


# conversations cannot import summaries (it is the lower app), so the summaries app adds its segment table
# and actions to the conversation admin from here (typed loosely: django-stubs types these attributes for
# the literal declarations of a class body).
conversation_admin: Any = ConversationAdmin
conversation_admin.readonly_fields = [*conversation_admin.readonly_fields, compaction_state, summary_segments]
if conversation_admin.fields is not None:
    conversation_admin.fields = [*conversation_admin.fields, compaction_state, summary_segments]
conversation_admin.actions = [*(conversation_admin.actions or ()), compact_now, rebuild_summaries]


@admin.register(SummarySegment)
class SummarySegmentAdmin(AppendOnlyAdmin):
    tenant_lookup = "conversation__tenant"
    change_roles = ()  # rebuilt from the transcript, never edited by hand
    list_display = [
        "__str__",
        "conversation",
        "token_count",
        "facts_checked",
        "facts_missing",
        "template_version",
        "superseded_by",
        "created_at",
    ]
    list_filter = ["source", "built_from", "level", "template_version"]
    list_select_related = ["conversation"]
    search_fields = ["=conversation__id", "text"]
    readonly_fields = [f.name for f in SummarySegment._meta.fields]


@admin.register(LlmUsage)
class LlmUsageAdmin(AppendOnlyAdmin):
    change_roles = ()
    list_display = [
        "tenant",
        "month",
        "purpose",
        "calls",
        "prompt_tokens",
        "completion_tokens",
        "budget_fallbacks",
    ]
    list_filter = ["month", "purpose"]
    readonly_fields = [f.name for f in LlmUsage._meta.fields]
