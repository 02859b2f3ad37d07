"""Query rewriting for retrieval only: a question that leans on what came before ("did it pass?", "that one",
"那个", "刚才说的") is made findable from the recent history and the task state. The user's own text is never
replaced in the prompt; only the search query changes.

Order, each recorded in Rewrite.method: an LLM when configured ("llm": it gets the last few messages, the
task state and the question, and answers with one standalone search query) → rules ("rules": the salient
terms of the recent history and the task state are appended) → pass-through ("passthrough"). Only a question
the rules' reference detector flags (a pronoun, a demonstrative, "earlier", 那个…) goes further than
pass-through, so an ordinary question costs no model call. The LLM is on the request path: one attempt, a
short timeout (MNEMO_QUERY_REWRITE_TIMEOUT_MS), and any failure or unusable answer falls back to the rules
with a degradation in Rewrite.degradations for the pipeline to report. After a failure the LLM is skipped
for FAILURE_PAUSE_SECONDS (per endpoint), so a down endpoint costs one timeout, not one per request; the
skip is a degradation too. No LLM configured is not a degradation: the rules are the offline default, and
the method says which served."""

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from django.conf import settings
from django.core.cache import cache

from conversations.models import Conversation, Message
from providers.llm import LLMConfig, LLMError, chat, llm_config
from providers.text import iter_search_words, search_words
from tenants.settings_schema import settings_usable

logger = logging.getLogger(__name__)

_REFERENCE = re.compile(
    r"\b(it|its|that|this|those|these|them|they|there|same|former|latter|one|ones|above|previous|earlier)\b"
    r"|那个|这个|那些|这些|它|刚才|上面|前面|之前",
    re.I,
)
# Identifiers, paths, versions, numbers with context, quoted names: what a pronoun most often stands for.
_SALIENT = re.compile(r"[\w./-]*[\d/._][\w./-]*|\"[^\"]{2,60}\"|'[^']{2,60}'|\b[A-Z][\w-]{2,}\b")
MAX_TERMS = 8
# What the rules read: the newest messages. The LLM reads a few more, each cut to HISTORY_CHARS.
RULES_HISTORY = 4
LLM_HISTORY = 6
HISTORY_CHARS = 600
STATE_CHARS = 1_000
# The default when MNEMO_QUERY_REWRITE_TIMEOUT_MS is not set: the rewrite is on the request path.
DEFAULT_TIMEOUT_MS = 2_000
FAILURE_PAUSE_SECONDS = 30
LLM_MAX_TOKENS = 96
# A standalone query longer than this is not a query (the model answered or rambled): the rules serve.
MAX_QUERY_CHARS = 400

SYSTEM_PROMPT = """You rewrite the user's latest question into one standalone search query that finds the \
earlier messages, memories and documents it refers to. Resolve pronouns, demonstratives and ellipsis \
("it", "that one", "the same", "那个") from the conversation and the task state. Keep the user's language \
and copy names, identifiers, file paths, versions and numbers exactly. Do not answer the question and do \
not add anything the conversation does not support. Reply with the query only, on one line."""


@dataclass
class Rewrite:
    query: str
    method: str  # llm | rules | passthrough
    terms: list[str] = field(default_factory=list)
    # Fallbacks taken on the way ({"code", "message"}), for the pipeline to report as degradations.
    degradations: list[dict[str, str]] = field(default_factory=list)
    model: str = ""

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "added_terms": self.terms}
        if self.model:
            out["model"] = self.model
        if self.degradations:
            out["degradations"] = self.degradations
        return out


_CJK_RUN = re.compile(r"[\u3400-\u9fff]{2,16}")
PER_TEXT = 3


def _salient_terms(texts: list[str]) -> list[str]:
    """Up to PER_TEXT terms from each text (identifiers and names first, then runs of CJK text, then
    ordinary words), MAX_TERMS in all, newest text first."""
    out: list[str] = []
    seen: set[str] = set()
    for text in texts:
        found = (m.group(0).strip("\"'.,") for m in _SALIENT.finditer(text))
        cjk = (m.group(0) for m in _CJK_RUN.finditer(text))
        taken = 0
        # Lazily: a long message's words are not all split to take three of them.
        for term in chain(found, cjk, iter_search_words(text)):
            if taken >= PER_TEXT or len(out) >= MAX_TERMS:
                break
            if term and term.lower() not in seen:
                seen.add(term.lower())
                out.append(term)
                taken += 1
    return out


def _recent(
    conversation: Conversation, query: str, before_seq: int | None, count: int
) -> list[tuple[str, str]]:
    """(role, content) of the newest messages, newest first, without the question itself."""
    recent = Message.objects.filter(
        conversation=conversation,
        kind=Message.Kind.MESSAGE,
        role__in=[Message.Role.USER, Message.Role.ASSISTANT],
    ).exclude(content=query)
    if before_seq is not None:
        recent = recent.filter(seq__lte=before_seq)
    return list(recent.order_by("-seq").values_list("role", "content")[:count])


def _rules(query: str, texts: list[str], task_state: dict[str, Any] | None) -> Rewrite:
    state_values = [str(v) for v in (task_state or {}).values() if isinstance(v, str | int | float)]
    terms = [t for t in _salient_terms([" ".join(state_values), *texts]) if t.lower() not in query.lower()]
    if not terms:
        return Rewrite(query, "passthrough")
    return Rewrite(f"{query} {' '.join(terms)}", "rules", terms)


def _rewrite_llm(conversation: Conversation) -> LLMConfig | None:
    config = llm_config(settings_usable(conversation.tenant.settings))
    if config is None:
        return None
    timeout = getattr(settings, "MNEMO_QUERY_REWRITE_TIMEOUT_MS", DEFAULT_TIMEOUT_MS) / 1000
    return config.with_limits(timeout=timeout, max_retries=0)


def _pause_key(config: LLMConfig) -> str:
    endpoint = hashlib.sha256(f"{config.base_url}|{config.model}".encode()).hexdigest()[:16]
    return f"mnemo:rewrite:llm_paused:{endpoint}"


def _prompt(
    query: str, history: list[tuple[str, str]], task_state: dict[str, Any] | None
) -> list[dict[str, str]]:
    lines = []
    for role, content in reversed(history):  # oldest first, as a conversation reads
        text = content if len(content) <= HISTORY_CHARS else content[:HISTORY_CHARS] + "…"
        lines.append(f"{role}: {text}")
    state = json.dumps(task_state, ensure_ascii=False, sort_keys=True, default=str) if task_state else "{}"
    if len(state) > STATE_CHARS:
        state = state[:STATE_CHARS] + "…"
    conversation = "\n".join(lines) or "(no earlier messages)"
    user = f"Conversation (oldest first):\n{conversation}\n\nTask state: {state}\n\nQuestion: {query}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _standalone(text: str) -> str | None:
    """The query in the model's answer, or None when the answer is not one."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^(?:standalone\s+)?(?:search\s+)?query\s*[:：]\s*", "", line, flags=re.I)
    line = line.strip().strip("\"'“”「」`").strip()
    if not line or len(line) > MAX_QUERY_CHARS:
        return None
    return line


def query_rewrite(
    *,
    conversation: Conversation,
    query: str,
    task_state: dict[str, Any] | None = None,
    before_seq: int | None = None,
    recent: list[tuple[str, str]] | None = None,
) -> Rewrite:
    """`recent`: (role, content) of the newest user and assistant messages, newest first, when the caller
    already holds them (the context pipeline's B6); read from the database when None or too few."""
    # Only an explicit reference back: a merely short question ("what next?") is left alone, at no cost.
    if not _REFERENCE.search(query):
        return Rewrite(query, "passthrough")
    config = _rewrite_llm(conversation)
    count = LLM_HISTORY if config else RULES_HISTORY
    held = [(role, content) for role, content in recent or [] if content != query][:count]
    history = held if len(held) == count else _recent(conversation, query, before_seq, count)
    degradations: list[dict[str, str]] = []
    if config is not None:
        if cache.get(_pause_key(config)):
            degradations.append(
                {
                    "code": "query_rewrite_llm_paused",
                    "message": f"The LLM ({config.describe()}) failed within the last "
                    f"{FAILURE_PAUSE_SECONDS}s and is paused: the rules rewrote the query.",
                }
            )
        else:
            try:
                reply = chat(config, _prompt(query, history, task_state), max_tokens=LLM_MAX_TOKENS)
            except LLMError as exc:
                cache.set(_pause_key(config), 1, timeout=FAILURE_PAUSE_SECONDS)
                degradations.append(
                    {
                        "code": "query_rewrite_llm_failed",
                        "message": f"The LLM ({config.describe()}) failed [{exc.code}]: {exc.message}. "
                        "The rules rewrote the query.",
                    }
                )
            else:
                standalone = _standalone(reply.text)
                if standalone is not None:
                    added = [t for t in search_words(standalone) if t not in set(search_words(query))]
                    return Rewrite(standalone, "llm", added, model=reply.model)
                degradations.append(
                    {
                        "code": "query_rewrite_llm_unusable",
                        "message": f"The LLM ({config.describe()}) answered with something that is not a "
                        "search query: the rules rewrote the query.",
                    }
                )
        for degradation in degradations:
            logger.warning("query rewrite for %s: %s", conversation.id, degradation["message"])
    rewrite = _rules(query, [content for _, content in history[:RULES_HISTORY]], task_state)
    rewrite.degradations = degradations
    return rewrite
