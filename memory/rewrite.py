"""Query rewriting for retrieval only: a question that leans on what came before ("did it pass?", "that one",
"那个", "刚才说的") gets the salient terms of the recent history and the task state appended, so lexical and
vector search can find what it refers to. The user's own text is never replaced in the prompt.
Order: an LLM when configured (not built yet: rules serve and say so) → rules → pass-through."""

import re
from dataclasses import dataclass, field
from typing import Any

from conversations.models import Conversation, Message
from memory.lexical import tokens

_REFERENCE = re.compile(
    r"\b(it|its|that|this|those|these|them|they|there|same|former|latter|one|ones|above|previous|earlier)\b"
    r"|那个|这个|那些|这些|它|刚才|上面|前面|之前",
    re.I,
)
# Identifiers, paths, versions, numbers with context, quoted names: what a pronoun most often stands for.
_SALIENT = re.compile(r"[\w./-]*[\d/._][\w./-]*|\"[^\"]{2,60}\"|'[^']{2,60}'|\b[A-Z][\w-]{2,}\b")
MAX_TERMS = 8


@dataclass
class Rewrite:
    query: str
    method: str  # rules | passthrough
    terms: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "added_terms": self.terms}


_CJK_RUN = re.compile(r"[\u3400-\u9fff]{2,16}")
PER_TEXT = 3


def _salient_terms(texts: list[str]) -> list[str]:
    """Up to PER_TEXT terms from each text (identifiers and names first, then runs of CJK text, then
    ordinary words), MAX_TERMS in all, newest text first."""
    out: list[str] = []
    seen: set[str] = set()
    for text in texts:
        found = [m.group(0).strip("\"'.,") for m in _SALIENT.finditer(text)]
        cjk = [m.group(0) for m in _CJK_RUN.finditer(text)]
        taken = 0
        for term in [*found, *cjk, *tokens(text)]:
            if taken >= PER_TEXT or len(out) >= MAX_TERMS:
                break
            if term and term.lower() not in seen:
                seen.add(term.lower())
                out.append(term)
                taken += 1
    return out


def query_rewrite(
    *,
    conversation: Conversation,
    query: str,
    task_state: dict[str, Any] | None = None,
    before_seq: int | None = None,
) -> Rewrite:
    # Only an explicit reference back: a merely short question ("what next?") is left alone.
    if not _REFERENCE.search(query):
        return Rewrite(query, "passthrough")
    recent = Message.objects.filter(
        conversation=conversation,
        kind=Message.Kind.MESSAGE,
        role__in=[Message.Role.USER, Message.Role.ASSISTANT],
    ).exclude(content=query)
    if before_seq is not None:
        recent = recent.filter(seq__lte=before_seq)
    texts = list(recent.order_by("-seq").values_list("content", flat=True)[:4])
    state_values = [str(v) for v in (task_state or {}).values() if isinstance(v, str | int | float)]
    terms = [t for t in _salient_terms([" ".join(state_values), *texts]) if t.lower() not in query.lower()]
    if not terms:
        return Rewrite(query, "passthrough")
    return Rewrite(f"{query} {' '.join(terms)}", "rules", terms)
