"""The call's set-up and its load stage: the model, format and budget of the request; the question (sent as
text or a stored message), B1, the summaries (B4), core memory (B2a), the call's Budget, and B6."""

import functools
import uuid

from context import sources
from context.budget import budget_shares, default_budget
from context.history import history_load
from context.models import AgentProfile, ConversationContext
from context.state import ContextRequest, ContextState
from conversations.models import Conversation, Message
from knowledge.attachments import attachments_reads
from memory.selectors import core_memory_blocks_reads
from memory.services import core_memory_snapshot_reads
from memory.state import task_state_reads
from prefix_cache.accounting import count_cached
from prefix_cache.provenance import AgentProfileSource
from prefix_cache.rendering import Item
from providers.embeddings import embed_query_ahead
from providers.model_table import is_known_model, model_info
from retrieval.find import retrieval_reads
from retrieval.questions import focused
from summaries.selectors import history_start_reads
from tenants.errors import ApplicationError
from tenants.settings_schema import settings_read
from tenants.statements import FixedQuery, Read

PROVIDER_FORMAT = {"openai": "openai", "anthropic": "anthropic", "google": "gemini"}

# Every call's first reads, as fixed statements (tenants.statements): compiling cost more than running them.
_CONTEXT_STATE = FixedQuery(
    lambda conversation_id: ConversationContext.objects.filter(conversation_id=conversation_id)[:1],
    conversation_id=uuid.uuid4(),
)
_DEFAULT_PROFILE = FixedQuery(
    # No ordering but the pk (what first() adds): the partial unique constraint allows one default, and
    # Meta.ordering would join the tenant.
    lambda tenant_id: AgentProfile.objects.filter(tenant_id=tenant_id, is_default=True).order_by("pk")[:1],
    tenant_id=uuid.uuid4(),
)


def call_reads(conversation: Conversation, *, retrieval: bool) -> list[Read]:
    """The small reads every context call makes whatever its question, read ahead in one round trip
    (tenants.statements.read_ahead): its state and default profile, B4's boundary and segments, B2a's
    snapshot and blocks, B3's task state, the attachments' existence, and with `retrieval` the retrieve
    stage's own. Each stays where it is used; this only lists them."""
    c = conversation
    reads: list[Read] = [
        (_CONTEXT_STATE, {"conversation_id": c.pk}),
        (_DEFAULT_PROFILE, {"tenant_id": c.tenant_id}),
        *history_start_reads(c),
        *task_state_reads(c),
        *attachments_reads(c),
    ]
    if c.end_user_id is not None:
        reads += [*core_memory_snapshot_reads(c), *core_memory_blocks_reads(c.end_user_id)]
    if retrieval:
        reads += retrieval_reads(c)
    return reads


def _context_state(conversation: Conversation) -> tuple[ConversationContext, bool]:
    """The conversation's pipeline state, and whether it is new (not stored yet: the writes store it)."""
    state = _CONTEXT_STATE.first(conversation_id=conversation.pk)
    if state is None:
        return ConversationContext(conversation=conversation), True
    return state, False


def prepare(*, conversation: Conversation, request: ContextRequest) -> ContextState:
    model = request.model or conversation.model
    info = model_info(model)
    fmt = request.format or PROVIDER_FORMAT.get(info.provider, "openai")
    # A stored setting that does not fit its schema is left out (its default applies) and reported below.
    tenant_settings, setting_problems = settings_read(conversation.tenant.settings)
    budget = request.token_budget or default_budget(tenant_settings=tenant_settings, info=info)
    if budget > info.context_window:
        raise ApplicationError(
            f"token_budget {budget} exceeds the {info.context_window}-token window of {model}.",
            code="budget_exceeds_window",
            extra={"context_window": info.context_window},
        )
    context, new = _context_state(conversation)
    state = ContextState(
        conversation=conversation,
        request=request,
        model=model,
        info=info,
        fmt=fmt,
        budget=budget,
        context=context,
    )
    if new:
        state.writes.append(
            functools.partial(ConversationContext.objects.get_or_create, conversation=conversation)
        )
    if not is_known_model(model):
        state.degrade(
            "load", "unknown_model", f"{model!r} is not in the model table; counted as {info.encoding}."
        )
    if setting_problems:
        state.degrade("load", "invalid_tenant_setting", " ".join(setting_problems))
    return state


# --- stages -----------------------------------------------------------------------------------------------


def question_and_blocks_load(state: ContextState) -> None:
    request = state.request
    if request.user_message_id is not None:
        current = _stored_question(state)
        if current is None:
            raise ApplicationError(
                "user_message_id must name a user message of this conversation.", code="invalid_user_message"
            )
        state.layout.user_message = current.content
        history_until = current.seq - 1
    else:
        state.layout.user_message = request.user_message
        history_until = None
    if sources.retrieval_enabled(state):
        # The vector of what the question is about is computed while the stages below read the database.
        embed_query_ahead(focused(state.layout.user_message))

    profile = _agent_profile(state)
    if profile is not None:
        text = profile.render()
        state.layout.agent = Item(
            text=text,
            tokens=count_cached(text, model=state.model),
            source=AgentProfileSource(id=str(profile.id), version=profile.version),
        )
    # Read once: summaries, core memory, B6 and the compaction check all start from it.
    state.boundary_seq = sources.boundary_seq(state.conversation)
    sources.load_summaries(state)
    sources.load_core_memory(state)
    state.history_until = history_until
    state.shares = budget_shares(state.layout, total=state.budget, model=state.model)
    history_load(state, until_seq=history_until)


def _stored_question(state: ContextState) -> Message | None:
    """The user message the request names, of this conversation: the row the caller holds when it just
    stored it (the chat proxy), else read."""
    request, held = state.request, state.request.user_message_row
    if request.user_message_id is None:
        return None
    if (
        held is not None
        and held.pk == request.user_message_id
        and held.conversation_id == state.conversation.pk
        and held.role == Message.Role.USER
    ):
        return held
    return Message.objects.filter(
        conversation=state.conversation, pk=request.user_message_id, role=Message.Role.USER
    ).first()


def _agent_profile(state: ContextState) -> AgentProfile | None:
    tenant = state.conversation.tenant
    if state.request.agent_profile_id is not None:
        profile = (
            AgentProfile.objects.filter(tenant=tenant, pk=state.request.agent_profile_id).order_by().first()
        )
        if profile is None:
            raise ApplicationError("No such agent profile in your tenant.", code="invalid_agent_profile")
        return profile
    if state.context.agent_profile_id is not None:
        return state.context.agent_profile
    default: AgentProfile | None = _DEFAULT_PROFILE.first(tenant_id=tenant.pk)
    return default
