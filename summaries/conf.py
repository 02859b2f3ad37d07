"""Compaction knobs for one conversation: the settings (config/django/base.py), with the tenant's own
`history_token_budget`, `summary_token_budget` and `llm_*` settings taking precedence."""

from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from conversations.models import Conversation
from providers.llm import LLMConfig, llm_config
from providers.model_table import model_info
from summaries.models import CompactionState
from tenants.settings_schema import settings_usable


@dataclass(frozen=True)
class CompactionConfig:
    history_budget: int  # tokens B6 may grow to; compaction keys off shares of it
    summary_budget: int  # tokens of live B4 segments before the oldest are rolled up
    trigger: float  # share of the history budget at which the request path must compact
    background: float  # share at which a background compaction is queued
    keep: float  # share of B6 (by tokens) a compaction keeps verbatim
    fallback_keep: float  # share kept when no summary could be made (prompt-only truncation)
    segment_max_tokens: int
    summary_ratio: float  # target summary size as a share of its input
    max_input_tokens: int  # the summariser's input limit; larger ranges are split / rolled up from segments
    sync_timeout: int  # seconds the request path gives an LLM call
    incomplete_grace_seconds: int
    lock_ttl: int
    llm: LLMConfig | None
    monthly_llm_tokens: int

    @property
    def segment_cap(self) -> int:
        """The most a new segment or roll-up aims at: a third of B4's budget. A summary can come out at about
        twice its target (the fact check adds back the facts it lost, up to the target again), and one
        segment must still fit B4; two or three then roll up."""
        return self.summary_budget // 3


def _int_setting(tenant_settings: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = tenant_settings.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    return default


def compaction_config(conversation: Conversation) -> CompactionConfig:
    tenant_settings = settings_usable(conversation.tenant.settings)
    info = model_info(conversation.model)
    window_room = max(256, info.context_window - info.max_output_tokens)
    # Without its own history budget a tenant gets the default, but never more than three quarters of the
    # token budget its context calls default to: B6 must leave room for the rest of the prompt.
    token_budget = _int_setting(tenant_settings, "token_budget", settings.MNEMO_DEFAULT_TOKEN_BUDGET, 256)
    default_history = min(settings.MNEMO_HISTORY_TOKEN_BUDGET, token_budget * 3 // 4)
    history = _int_setting(tenant_settings, "history_token_budget", default_history, 256)
    return CompactionConfig(
        # The history never takes all that the model's window leaves for the prompt: the rest needs room.
        history_budget=min(history, int(window_room * 0.8)),
        summary_budget=_int_setting(
            tenant_settings, "summary_token_budget", settings.MNEMO_SUMMARY_TOKEN_BUDGET, 128
        ),
        trigger=settings.MNEMO_COMPACTION_TRIGGER_PERCENT / 100,
        background=settings.MNEMO_COMPACTION_BACKGROUND_PERCENT / 100,
        keep=settings.MNEMO_COMPACTION_KEEP_PERCENT / 100,
        fallback_keep=settings.MNEMO_COMPACTION_FALLBACK_KEEP_PERCENT / 100,
        segment_max_tokens=settings.MNEMO_SEGMENT_MAX_TOKENS,
        summary_ratio=settings.MNEMO_SUMMARY_RATIO_PERCENT / 100,
        max_input_tokens=settings.MNEMO_SUMMARISER_MAX_INPUT_TOKENS,
        sync_timeout=settings.MNEMO_COMPACTION_SYNC_TIMEOUT_SECONDS,
        incomplete_grace_seconds=settings.MNEMO_COMPACTION_INCOMPLETE_GRACE_SECONDS,
        lock_ttl=settings.MNEMO_COMPACTION_LOCK_TTL_SECONDS,
        llm=llm_config(tenant_settings),
        monthly_llm_tokens=_int_setting(
            tenant_settings, "llm_monthly_token_budget", settings.MNEMO_LLM_MONTHLY_TOKENS, 0
        ),
    )


def compaction_config_requested(conversation: Conversation) -> CompactionConfig:
    """compaction_config with the budgets the conversation's client last asked for (CompactionState), each
    at most the configured one: a client asking for 2,000-token prompts gets summaries rolled up to fit
    them."""
    cfg = compaction_config(conversation)
    asked = (
        CompactionState.objects.filter(pk=conversation.pk)
        .values_list("history_budget", "summary_budget")
        .first()
    )
    if asked is None:
        return cfg
    history, summary = asked
    return replace(
        cfg,
        history_budget=min(cfg.history_budget, history or cfg.history_budget),
        summary_budget=min(cfg.summary_budget, summary or cfg.summary_budget),
    )
