"""Making one summary text from raw messages: LLM when configured (and the tenant's monthly budget allows),
else (or when it fails) the offline extractive summariser; then the fact check, which re-adds the facts the
summary lost, and the attachments and documents that mattered most. Every fallback is recorded."""

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from conversations.models import Conversation, Message
from providers.llm import LLMConfig, LLMError, chat
from providers.summariser import (
    VERSION as EXTRACTIVE_VERSION,
)
from providers.summariser import (
    Fact,
    SourceMessage,
    extract_facts,
    fact_present,
    normalise,
    summarise,
)
from providers.tokens import count_text
from summaries.conf import CompactionConfig
from summaries.prompts import summary_messages
from tenants.llm_budget import llm_budget_fallback_record, llm_budget_left, llm_usage_record
from tenants.models import Tenant

logger = logging.getLogger(__name__)

FACTS_HEADING = "Key facts (verbatim):"
ATTACHMENTS_HEADING = "Files and attachments:"
MAX_ATTACHMENTS = 8
_WRITE_TOOLS = re.compile(
    r"write|edit|create|patch|save|update|apply|replace|insert|delete|move|rename", re.I
)
_PATH_KEYS = ("path", "file", "file_path", "filepath", "filename", "target", "document", "url")


@dataclass
class SummaryText:
    text: str
    source: str  # llm | extractive
    model: str
    input_tokens: int
    facts_checked: int = 0
    facts_missing: int = 0
    facts_added: list[str] = field(default_factory=list)
    facts_unrecovered: int = 0
    attachments: list[dict[str, Any]] = field(default_factory=list)
    degradations: list[dict[str, str]] = field(default_factory=list)
    llm_tokens: int = 0


# --- what the model saw -------------------------------------------------------------------------------------


def _arguments(arguments: Any) -> str:
    return (
        arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    )


def message_source_text(message: Message) -> tuple[str, str]:
    """(text, label) of a stored message as the summariser reads it: content, tool calls and results,
    image references."""
    chunks = [message.content] if message.content else []
    label = ""
    for part in message.parts or []:
        kind = part.get("type")
        if kind == "tool_call":
            chunks.append(f"{part['name']}({_arguments(part['arguments'])})")
            label = label or part["name"]
        elif kind == "tool_result":
            content = part["content"]
            text = (
                content
                if isinstance(content, str)
                else "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
            )
            if text and text != message.content:
                chunks.append(text)
            label = label or part.get("name", "")
        elif kind == "image":
            description = f": {part['description']}" if part.get("description") else ""
            chunks.append(f"[Image {part['image_id']}{description}]")
    return "\n".join(chunks), label


def source_messages(messages: list[Message]) -> list[SourceMessage]:
    out = []
    for message in messages:
        text, label = message_source_text(message)
        out.append(
            SourceMessage(seq=message.seq, role=message.role, text=text, label=label, name=message.name)
        )
    return out


def transcript_text(messages: list[SourceMessage]) -> str:
    return "\n\n".join(
        f"[#{m.seq} {m.name or m.role}{' ' + m.label if m.label else ''}] {m.text}"
        for m in messages
        if m.text
    )


# --- attachments and documents ------------------------------------------------------------------------------


def named_attachments(messages: list[Message]) -> list[dict[str, Any]]:
    """The files, images and documents the messages name, most important first: written or edited by a tool
    call counts most, then mentions, then recency."""
    mentions: Counter[str] = Counter()
    written: Counter[str] = Counter()
    kinds: dict[str, str] = {}
    last_seen: dict[str, int] = {}
    for message in messages:
        for part in message.parts or []:
            if part.get("type") == "image":
                name = part["image_id"]
                mentions[name] += 1
                kinds[name] = "image"
                last_seen[name] = message.seq
            elif part.get("type") == "tool_call":
                arguments = part["arguments"]
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except ValueError:
                        arguments = {}
                if isinstance(arguments, dict):
                    for key in _PATH_KEYS:
                        value = arguments.get(key)
                        if isinstance(value, str) and 0 < len(value) <= 300:
                            kinds.setdefault(value, "url" if value.startswith("http") else "file")
                            mentions[value] += 1
                            last_seen[value] = message.seq
                            if _WRITE_TOOLS.search(part["name"]):
                                written[value] += 1
        text, _ = message_source_text(message)
        for fact in extract_facts(text, min_priority=4):
            if fact.kind in ("path", "url"):
                kinds.setdefault(fact.text, "url" if fact.kind == "url" else "file")
                mentions[fact.text] += fact.count
                last_seen[fact.text] = message.seq
    ranked = sorted(mentions, key=lambda n: (-written[n], -mentions[n], -last_seen[n], n))
    return [
        {"name": name, "kind": kinds[name], "mentions": mentions[name], "written": written[name]}
        for name in ranked[:MAX_ATTACHMENTS]
    ]


# --- the fact check -----------------------------------------------------------------------------------------


def _fact_order(fact: Fact) -> tuple:
    return (-fact.priority, -fact.count, fact.first)


def fact_check(
    *, summary: str, source_text: str, budget_tokens: int, model: str
) -> tuple[str, dict[str, Any]]:
    """Re-add to `summary` the facts of `source_text` it no longer states, most important first, within
    `budget_tokens`. Returns the text and the counts stored on the segment."""
    facts = extract_facts(source_text)
    present = normalise(summary)
    missing = [f for f in facts if not fact_present(f, present)]
    added: list[str] = []
    used = count_text(FACTS_HEADING, model=model)
    for fact in sorted(missing, key=_fact_order):
        entry = fact.context if fact.context != fact.text else fact.text
        cost = count_text(entry, model=model) + 1
        if used + cost > budget_tokens:
            continue
        added.append(entry)
        used += cost
    # Facts are listed in the order the conversation mentioned them, so the list reads as a timeline.
    order = {f.context if f.context != f.text else f.text: f.first for f in missing}
    added.sort(key=lambda e: order[e])
    text = summary
    if added:
        text = (
            f"{summary}\n{FACTS_HEADING} " + "; ".join(added)
            if summary
            else f"{FACTS_HEADING} " + "; ".join(added)
        )
    return text, {
        "facts_checked": len(facts),
        "facts_missing": len(missing),
        "facts_added": added,
        "facts_unrecovered": len(missing) - len(added),
    }


# --- one summary --------------------------------------------------------------------------------------------


def target_tokens_for(input_tokens: int, cfg: CompactionConfig) -> int:
    """A new segment's size: its share of the input, at most a segment's most and cfg.segment_cap."""
    return max(64, min(cfg.segment_max_tokens, cfg.segment_cap, int(input_tokens * cfg.summary_ratio)))


def summary_make(
    *,
    conversation: Conversation,
    sources: list[SourceMessage],
    fact_source: str,
    attachments: list[dict[str, Any]],
    target_tokens: int,
    cfg: CompactionConfig,
    instructions: str = "",
    sync: bool = False,
    purpose: str = "summary",
) -> SummaryText:
    """The summary of `sources`: LLM → extractive, then the fact check against `fact_source` (the raw text
    the facts must survive from) and the attachments line. Raises only on a bug in the offline path; the
    caller then falls back to truncation."""
    model = conversation.model
    transcript = transcript_text(sources)
    input_tokens = count_text(transcript, model=model)
    degradations: list[dict[str, str]] = []
    result = _llm_summary(
        conversation=conversation,
        transcript=transcript,
        input_tokens=input_tokens,
        target_tokens=target_tokens,
        cfg=cfg,
        instructions=instructions,
        sync=sync,
        purpose=purpose,
        degradations=degradations,
    )
    if result is None:
        text = summarise(
            sources,
            target_tokens=target_tokens,
            count_tokens=lambda t: count_text(t, model=model),
            focus=instructions,
        )
        result = SummaryText(
            text=text, source="extractive", model=EXTRACTIVE_VERSION, input_tokens=input_tokens
        )
    result.degradations = degradations
    _fact_check_apply(result, fact_source=fact_source, target_tokens=target_tokens, model=model)
    _attachments_apply(result, attachments)
    return result


def _llm_summary(
    *,
    conversation: Conversation,
    transcript: str,
    input_tokens: int,
    target_tokens: int,
    cfg: CompactionConfig,
    instructions: str,
    sync: bool,
    purpose: str,
    degradations: list[dict[str, str]],
) -> SummaryText | None:
    """The LLM's summary, or None (with the reason appended to `degradations`) when no LLM is configured,
    the tenant's monthly budget is spent or the call failed."""
    tenant = conversation.tenant
    llm = _summary_llm(cfg, tenant=tenant, purpose=purpose, sync=sync, degradations=degradations)
    if llm is None:
        return None
    try:
        reply = chat(
            llm,
            summary_messages(transcript=transcript, target_tokens=target_tokens, instructions=instructions),
            max_tokens=max(128, int(target_tokens * 1.3)),
        )
    except LLMError as exc:
        degradations.append(
            {
                "code": "llm_failed",
                "message": f"The LLM ({llm.describe()}) failed after {exc.attempts} attempt(s) "
                f"[{exc.code}]: {exc.message}. The offline extractive summariser served.",
            }
        )
        return None
    llm_usage_record(tenant=tenant, reply=reply, purpose=purpose)
    return SummaryText(
        text=reply.text,
        source="llm",
        model=reply.model,
        input_tokens=input_tokens,
        llm_tokens=reply.total_tokens,
    )


def _summary_llm(
    cfg: CompactionConfig, *, tenant: Tenant, purpose: str, sync: bool, degradations: list[dict[str, str]]
) -> LLMConfig | None:
    """The LLM to summarise with (a call made while a request waits: the sync timeout and no retry), or None
    with the reason appended to `degradations`: no LLM is configured, or the tenant's monthly budget is
    spent."""
    if cfg.llm is None:
        degradations.append(
            {
                "code": "offline_summariser",
                "message": "No LLM is configured: the offline extractive summariser served.",
            }
        )
        return None
    if llm_budget_left(tenant=tenant, monthly_tokens=cfg.monthly_llm_tokens) <= 0:
        llm_budget_fallback_record(tenant=tenant, purpose=purpose)
        degradations.append(
            {
                "code": "llm_budget_spent",
                "message": f"The tenant's monthly LLM budget ({cfg.monthly_llm_tokens} tokens) is spent: "
                "the offline extractive summariser served.",
            }
        )
        return None
    return cfg.llm.with_limits(timeout=cfg.sync_timeout, max_retries=0) if sync else cfg.llm


def _fact_check_apply(result: SummaryText, *, fact_source: str, target_tokens: int, model: str) -> None:
    """Re-adds the facts of `fact_source` the summary lost, and records the counts on `result`."""
    text, counts = fact_check(
        summary=result.text, source_text=fact_source, budget_tokens=max(96, target_tokens), model=model
    )
    result.text = text
    result.facts_checked = counts["facts_checked"]
    result.facts_missing = counts["facts_missing"]
    result.facts_added = counts["facts_added"]
    result.facts_unrecovered = counts["facts_unrecovered"]


def _attachments_apply(result: SummaryText, attachments: list[dict[str, Any]]) -> None:
    """Names the attachments the summary text does not mention on a line of their own."""
    result.attachments = attachments
    absent = [a["name"] for a in attachments if normalise(a["name"]) not in normalise(result.text)]
    if absent:
        result.text += f"\n{ATTACHMENTS_HEADING} " + ", ".join(absent)
