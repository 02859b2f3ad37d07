"""The one home of the context call's budget arithmetic: the shares and caps of the blocks (a frozen Budget,
computed once per call in the load stage and read by load, decay and the budget stage)."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from prefix_cache.accounting import count_cached
from prefix_cache.rendering import Layout
from prefix_cache.rendering import system_sections as render_system_sections
from providers.model_table import ModelInfo
from providers.tokens import MESSAGE_OVERHEAD_TOKENS, REPLY_PRIMING_TOKENS, count_message

# Budget by value: of what B1, core memory and the current message leave (the room), retrieval keeps this
# share when the question has hits, the summaries (B4) at most SUMMARY_SHARE, and the history (B6) the rest.
# Retrieval's share is high because a hit that answers the question is worth more than older history, and
# what the newest exchange said that matches the question comes back through B5 (docs/benchmarks.md).
RETRIEVAL_SHARE = 0.85
SUMMARY_SHARE = 0.1
# How much B5 may take (retrieval_cap): all the free room up to RETRIEVAL_FILL_TOKENS at budgets up to
# RETRIEVAL_FILL_BUDGET, RETRIEVAL_LARGE_TOKENS from RETRIEVAL_LARGE_BUDGET on (bench/prefix_cache.py).
# At small budgets a lower cap only left part of the prompt empty once B6 and B4 had what they may take.
RETRIEVAL_FILL_BUDGET = 8000
RETRIEVAL_FILL_TOKENS = 8000
RETRIEVAL_LARGE_BUDGET = 24000
RETRIEVAL_LARGE_TOKENS = 400
# After a forced cut the history keeps this share of its allowance, so it can grow for several turns before
# the window has to move again (and the prompt prefix stays byte-identical meanwhile).
WINDOW_REFILL = 0.6
# Compaction is asked for when the history since the boundary passes the background share of this many
# tokens or of the history's share of the requested budget, whichever is more: below it, the window cut
# (prompt only) and retrieval over the whole history serve small budgets better than ever smaller summaries.
MIN_COMPACTION_HISTORY_TOKENS = 4000
# The summaries' budget a request remembers for compaction: this share of B4's cap (summary_cap; core memory
# grows a little between compactions, and the cap with it shrinks), but at least MIN_SUMMARY_BUDGET, which
# two segments of the summariser's least fit.
SUMMARY_FILL = 0.9
MIN_SUMMARY_BUDGET = 128
# Attachments share what the other blocks leave with retrieval (B5) when the question has hits.
ATTACHMENT_SHARE = 0.5
# Estimates for filling B5 and the attachments (the exact count checks after): a "\n\n" between items; the
# section's title and the question's own title when the section is the only one.
SEPARATOR_TOKENS = 2
SECTION_TOKENS = 16
MIN_BUDGET = 256


@dataclass(frozen=True)
class Budget:
    """What each block may take in one call. Fixed before the history is read, so the history the prompt
    shows (and its cached prefix) does not change from one question to the next."""

    # All zero until the load stage computes them: nothing may take anything before.
    total: int = 0  # the call's token budget
    room: int = 0  # what B1, core memory, the current message with its memory updates and the overheads leave
    summary_cap: int = 0  # the most B4 may take
    retrieval_cap: int = 0  # the most B5 may take
    history_allowance: int = 0  # the most B6 may take
    window_target: int = 0  # what B6 keeps after a forced cut (WINDOW_REFILL of its allowance)
    compaction_history: int = 0  # the history budget a compaction queued by this call is sized for
    compaction_summaries: int = 0  # the summaries' budget that compaction's roll-ups are sized for

    @property
    def retrieval_room(self) -> int:
        """The most B5 can take in this call: its cap, and never more than the room (what the other blocks
        take comes out of the room before B5 fills what is left). Retrieval reads for this much, not for a
        cap far above what the call's budget could ever hold."""
        return min(self.room, self.retrieval_cap)

    def attachments_allowance(self, layout: Layout, *, has_hits: bool) -> int:
        """Tokens the attachments may take: what the room leaves after the history (at most its allowance),
        the summaries (at most their cap), the task state and the session profile; half of it when retrieval
        has hits for the question, which the budget stage places after."""
        history = min(sum(m.token_count for m in layout.history), self.history_allowance)
        summaries = min(sum(i.tokens for i in layout.summaries), self.summary_cap)
        per_request = sum(i.tokens for i in (layout.task_state, layout.session_profile) if i is not None)
        free = max(0, self.room - history - summaries - per_request - SECTION_TOKENS)
        return int(free * ATTACHMENT_SHARE) if has_hits else free


def budget_shares(layout: Layout, *, total: int, model: str) -> Budget:
    """The call's Budget of `total` tokens, from the blocks the load stage has read before the history (B1,
    core memory, the summaries and the current message)."""
    system_fixed = _system_fixed(layout, model=model)
    fixed = system_fixed + count_cached(layout.user_message, model=model)
    fixed += MESSAGE_OVERHEAD_TOKENS + REPLY_PRIMING_TOKENS + sum(i.tokens for i in layout.memory_updates)
    room = max(0, total - fixed)
    # Not of the room the question leaves: a longer question must not drop the summaries, and the cached
    # prefix with them.
    summary_cap = int(max(0, total - system_fixed) * SUMMARY_SHARE)
    cap = retrieval_cap(total)
    # B6 gets what retrieval's reserved share (never more than it may take), the capped summaries and the
    # task state leave.
    summaries = min(sum(i.tokens for i in layout.summaries), summary_cap)
    per_request = sum(i.tokens for i in (layout.task_state, layout.session_profile) if i is not None)
    reserve = min(int(room * RETRIEVAL_SHARE), cap)
    allowance = max(0, room - reserve - summaries - per_request)
    return Budget(
        total=total,
        room=room,
        summary_cap=summary_cap,
        retrieval_cap=cap,
        history_allowance=allowance,
        window_target=int(allowance * WINDOW_REFILL),
        compaction_history=max(MIN_COMPACTION_HISTORY_TOKENS, allowance),
        compaction_summaries=max(MIN_SUMMARY_BUDGET, int(summary_cap * SUMMARY_FILL)),
    )


def retrieval_cap(budget: int) -> int:
    """The most B5 may take. It sits in the current message, which the provider's prefix cache never serves:
    at small budgets, where the history cannot fit anyway, the evidence is worth all the room left (up to
    RETRIEVAL_FILL_TOKENS); at large ones the cached history carries the prompt, and B5 is held to
    RETRIEVAL_LARGE_TOKENS so the prompt stays mostly cacheable. Linear in between."""
    low, high = RETRIEVAL_FILL_BUDGET, RETRIEVAL_LARGE_BUDGET
    if budget <= low:
        return RETRIEVAL_FILL_TOKENS
    if budget >= high:
        return RETRIEVAL_LARGE_TOKENS
    step = (budget - low) / (high - low)
    return int(RETRIEVAL_FILL_TOKENS + step * (RETRIEVAL_LARGE_TOKENS - RETRIEVAL_FILL_TOKENS))


def default_budget(*, tenant_settings: dict[str, Any], info: ModelInfo) -> int:
    """The configured budget, capped by the window less room for the reply. Models whose reply may fill the
    whole window reserve a quarter of it instead of leaving nothing."""
    reserve = (
        info.max_output_tokens if info.max_output_tokens < info.context_window else info.context_window // 4
    )
    configured = tenant_settings.get("token_budget") or settings.MNEMO_DEFAULT_TOKEN_BUDGET
    return max(MIN_BUDGET, min(int(configured), info.context_window - reserve))


def system_message_tokens(text: str, *, model: str) -> int:
    """Tokens of the system message as sent: its text (memoised) plus the role and per-message overhead."""
    if not text:
        return 0
    return count_cached(text, model=model) + count_message(role="system", content="", model=model)


def _system_fixed(layout: Layout, *, model: str) -> int:
    """Tokens of B1 and core memory as the system message carries them."""
    b1_b2a = [s for s in render_system_sections(layout)[:2] if s]
    return system_message_tokens("\n\n".join(b1_b2a), model=model)
