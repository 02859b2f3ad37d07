"""One run of the memory agent over a conversation's new messages: batch by batch from its cursor, who decides
(the LLM or the rules), the degradations when the LLM does not serve, and the writes with the cursor's move.

Who decides. With an LLM configured (providers.llm.llm_config, with the tenant's overrides) and the tenant's
monthly budget for background LLM work not spent, the LLM decides *instead of* the rules: it sees everything
the rules see and more, and running both would store the same fact twice in two wordings. Without an LLM the
rules serve (AgentRun.mode "rules"). When the LLM fails (timeout, connection, 429/5xx, a refused request, a
reply that is not a chat completion) or the budget is spent, the rules serve and the run says so: mode
"rules_fallback", a degradation with the error code (also logged and counted), and the rest of the run stays
on the rules. A failure in any round discards what the earlier rounds planned: the LLM's plan is applied
whole or not at all.

Transactions. No transaction is open while the model is called: the inputs are read, the tool loop runs
(memory.agent.llm), and only then are the planned writes applied and the cursor moved, in one transaction
that first checks, under a row lock, that no other run moved the cursor meanwhile (if one did, the plan is
dropped and the batch is read again from the new cursor). A block that someone else changed during the call
is refused at apply time as stale (never written over). Each write is applied in its own savepoint: a
refused one leaves nothing behind. Invalid calls are listed in AgentRun.errors."""

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from conversations.models import Conversation, Message
from memory.agent.batch import Batch, batch_read
from memory.agent.llm import agent_llm, llm_plan
from memory.agent.remember import rules_apply, rules_embed
from memory.agent.report import AgentRun, degrade
from memory.agent.tools import Plan, Write
from memory.archival import Embedding, archival_embed, archival_insert
from memory.models import Actor, MemoryAgentCursor
from memory.services import core_memory_write
from providers.llm import LLMError
from tenants.errors import ApplicationError
from tenants.models import EndUser

logger = logging.getLogger(__name__)

# With an LLM a batch holds whole exchanges up to this many characters of messages (at least one exchange),
# so one model call reads a bounded prompt; the next batch starts where it ended. The rules read all at once.
BATCH_CHARS = 24_000
# Batches per run, and restarts when another run moved the cursor between our read and our write.
MAX_BATCHES = 8
MAX_RESTARTS = 2


def memory_agent_run(*, conversation: Conversation) -> AgentRun:
    """Process the completed exchanges since the cursor, batch by batch (idempotent: the cursor moves in the
    same transaction as the writes). See the module docstring for who decides and the fallbacks."""
    run = AgentRun()
    if conversation.end_user_id is None:
        return run
    config = agent_llm(conversation, run)
    restarts = 0
    batches = 0
    while batches < MAX_BATCHES:
        cursor_seq, batch = batch_read(conversation, max_chars=BATCH_CHARS if config else None)
        if batch is None:
            run.processed_to = cursor_seq
            return run
        plan = None
        if config is not None:
            try:
                plan = llm_plan(config=config, conversation=conversation, batch=batch, run=run)
            except LLMError as exc:
                run.mode = "rules_fallback"
                degrade(
                    run,
                    "memory_agent_llm_failed",
                    f"The LLM ({config.describe()}) failed after {exc.attempts} attempt(s) [{exc.code}]: "
                    f"{exc.message}. The rules decided what to remember.",
                    conversation=conversation,
                )
                config = None  # the endpoint is down: the rest of this run stays on the rules
                cursor_seq, batch = batch_read(conversation, max_chars=None)
                if batch is None:
                    run.processed_to = cursor_seq
                    return run
        # Vectors first: an embedding model or a remote embedder can be slow; the cursor's lock is to write.
        if plan is not None:
            _plan_embed(plan)
        embeddings = rules_embed(batch.messages) if plan is None else {}
        if not _batch_apply(conversation, batch, plan, run, embeddings):
            restarts += 1
            run.notes.append("Another run moved the cursor meanwhile: this batch was read again.")
            if restarts > MAX_RESTARTS:
                break
            continue
        batches += 1
        if plan is not None:
            run.model = plan.model
            if run.mode != "rules_fallback":
                run.mode = "llm"
        run.processed_to = batch.to_seq
        if not batch.pending:
            return run
    run.notes.append("More exchanges are waiting: the next run continues from the cursor.")
    logger.info("memory agent for %s stopped with work pending at seq %s", conversation.id, run.processed_to)
    return run


def _batch_apply(
    conversation: Conversation,
    batch: Batch,
    plan: Plan | None,
    run: AgentRun,
    embeddings: dict[str, Embedding],
) -> bool:
    """Apply the plan (or the rules, with the vectors of `rules_embed`) and move the cursor in one
    transaction. False when another run moved the cursor since the batch was read: nothing is written
    then."""
    with transaction.atomic():
        cursor = MemoryAgentCursor.objects.select_for_update().get(conversation=conversation)
        if cursor.last_seq != batch.from_seq:
            return False
        if plan is not None:
            _plan_apply(plan, conversation=conversation, run=run)
        else:
            end_user = conversation.end_user
            assert end_user is not None  # memory_agent_run returns early for a conversation without one
            for message in batch.messages:
                if message.role == Message.Role.USER:
                    rules_apply(run, end_user, conversation, message, embeddings)
        cursor.last_seq = batch.to_seq
        cursor.updated_at = timezone.now()
        cursor.save(update_fields=["last_seq", "updated_at"])
    return True


def _plan_embed(plan: Plan) -> None:
    """The vectors of the plan's archival inserts, computed before _batch_apply locks the cursor (an
    embedding model or a remote embedder can be slow; the lock is held only to write)."""
    for write in plan.writes:
        if write.tool == "archival_memory_insert":
            write.embedding = archival_embed(write.content)


def _plan_apply(plan: Plan, *, conversation: Conversation, run: AgentRun) -> None:
    end_user = conversation.end_user
    assert end_user is not None  # memory_agent_run returns early for a conversation without an end user
    stale: set[str] = set()
    run.errors.extend(plan.errors)
    if plan.errors:
        logger.info(
            "memory agent for %s: %d invalid tool call(s) from %s: %s",
            conversation.id,
            len(plan.errors),
            plan.model,
            ", ".join(e["code"] for e in plan.errors),
        )
    for write in plan.writes:
        if write.label and write.label in stale:
            # Later edits of a block that changed under us were computed from the old text too.
            run.errors.append(
                {
                    "tool": write.tool,
                    "call_id": write.call_id,
                    "code": "stale_version",
                    "message": f"Block {write.label!r} changed during the run; this edit was not applied.",
                }
            )
            continue
        try:
            with transaction.atomic():  # a savepoint: a refused write leaves nothing behind
                run.operations.append(
                    _write_apply(write, conversation=conversation, end_user=end_user, actor_name=plan.model)
                )
        except ApplicationError as exc:
            code = exc.code
            if code in ("version_mismatch", "if_match_required"):
                code = "stale_version"
                stale.add(write.label)
            run.errors.append(
                {"tool": write.tool, "call_id": write.call_id, "code": code, "message": exc.message}
            )
            logger.info("memory agent write %s refused for %s: %s", write.tool, conversation.id, exc.message)


def _write_apply(
    write: Write, *, conversation: Conversation, end_user: EndUser, actor_name: str
) -> dict[str, Any]:
    if write.tool == "archival_memory_insert":
        outcome = archival_insert(
            end_user=end_user,
            content=write.content,
            kind=write.kind,
            conversation=conversation,
            source_message_ids=write.source_ids,
            actor=Actor.AGENT,
            actor_name=actor_name,
            trigger=write.trigger,
            embedding=write.embedding,
        )
        return {"op": f"archival_memory_{outcome.action}", "id": str(outcome.memory.id), "tool": write.tool}
    block, _ = core_memory_write(
        end_user=end_user,
        label=write.label,
        value=None if write.append else write.value,
        append=write.append or None,
        # 0 for a block the model saw as missing: one created meanwhile is refused as stale.
        expected_version=write.expected_version,
        actor=Actor.AGENT,
        actor_name=actor_name,
        trigger=write.trigger,
        conversation=conversation,
    )
    return {"op": write.tool, "label": write.label, "version": block.version, "tool": write.tool}
