"""Lexical search over the database's full-text indexes, shared by the archival memory search and the end
user's other conversations (retrieval.archival, retrieval.other_conversations).

The database finds and ranks the candidates with its own full-text index (PostgreSQL: a tsvector table with a
GIN index, ranked by ts_rank_cd; SQLite: an FTS5 table, ranked by bm25()), both kept in sync by triggers
(memory/migrations/0003_search_index.py). BM25 computed here in Python re-ranks those candidates, so the
final scores, and the thresholds applied to them, are the same numbers on both databases. Reciprocal rank
fusion is retrieval.ranking's.

Words are split the same way everywhere: lower case, runs of letters and digits, with punctuation (also the
dashes, dots and slashes inside KX-4821 or src/app.py) as separators; an identifier in a query is looked up as
the phrase of its parts ('kx' <-> '4821'). CJK text has no spaces: each CJK character is a word of its own in
the index, and a query looks its runs up as phrases of two characters (bigrams). The words themselves are
providers.text's (search_words): archival memory's writes compare statements by them too."""

import functools
import logging
import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import connection

from providers.text import CJK, CJK_START, SEARCH_STOPWORDS, SEARCH_WORD, search_words

logger = logging.getLogger(__name__)

# What the full-text indexes see as one word: a CJK character, or a run of letters and digits.
_ATOM = re.compile(rf"[{CJK}]|[^\W_{CJK}]+")
# Query words longer than this are blobs (base64, hashes of hashes): never worth a lookup.
MAX_ATOM_CHARS = 64
MAX_PHRASES = 32
# Words a query rewrite added (salient terms of the recent history) weigh this much against the user's own:
# they help a question that leans on what came before ("did it pass?") but must not outvote its own words.
EXPANSION_WEIGHT = 0.3


def search_phrases(query: str) -> list[tuple[str, ...]]:
    """What the full-text index is asked for: one phrase per query word (its atoms in order), CJK runs as
    bigrams. Stopwords, single letters and blobs are left out; at most MAX_PHRASES, in query order."""
    phrases: list[tuple[str, ...]] = []
    for word in SEARCH_WORD.findall(query.lower()):
        if CJK_START.match(word):
            grams = [tuple(word[i : i + 2]) for i in range(len(word) - 1)] or [(word,)]
            phrases.extend(grams)
            continue
        if word in SEARCH_STOPWORDS or (len(word) == 1 and not word.isdigit()):
            continue
        atoms = tuple(_ATOM.findall(word))
        if atoms and all(len(a) <= MAX_ATOM_CHARS for a in atoms):
            phrases.append(atoms)
    return list(dict.fromkeys(phrases))[:MAX_PHRASES]


@functools.lru_cache(maxsize=8192)
def _document_terms(text: str) -> tuple[Counter[str], int]:
    """Term counts and length of a document. Memoised: recall ranks the same history messages call after
    call."""
    counts = Counter(search_words(text))
    return counts, sum(counts.values())


def bm25_rank(
    query: str,
    documents: Sequence[str],
    *,
    k1: float = 1.2,
    b: float = 0.75,
    corpus_size: int | None = None,
    shares: dict[str, float] | None = None,
    expansion: str = "",
) -> list[tuple[int, float]]:
    """(document index, score) of the documents sharing a term with the query, best first. When the
    documents are a part of a larger corpus (the candidates an index found), corpus_size keeps the IDF of the
    whole, and `shares` (term -> share of the corpus's documents holding it, from the index's statistics)
    stands in for document frequencies the candidates alone would overstate. Terms of `expansion` (what a
    query rewrite added) that are not the query's own count EXPANSION_WEIGHT as much."""
    own = set(search_words(query))
    weights = dict.fromkeys(own, 1.0) | {t: EXPANSION_WEIGHT for t in search_words(expansion) if t not in own}
    if not weights or not documents:
        return []
    docs = [_document_terms(d) for d in documents]
    avg = sum(length for _, length in docs) / len(docs) or 1.0
    n = max(corpus_size or 0, len(docs))
    # Per term, once: its weight times its IDF (terms no document holds drop out).
    factor = {}
    for term, weight in weights.items():
        df: float = sum(1 for counts, _ in docs if term in counts)
        if not df:
            continue
        if shares and term in shares:
            df = max(df, min(n, shares[term] * n))
        factor[term] = weight * math.log(1 + (n - df + 0.5) / (df + 0.5)) * (k1 + 1)
    if not factor:
        return []
    scored = []
    for i, (counts, length) in enumerate(docs):
        norm = k1 * (1 - b + b * length / avg)
        score = 0.0
        for term, f in factor.items():
            tf = counts.get(term)
            if tf:
                score += f * tf / (tf + norm)
        if score > 0:
            scored.append((i, score))
    scored.sort(key=lambda x: (-x[1], x[0]))
    return scored


# --- the database's full-text index ------------------------------------------------------------------------

# Statistics of an index with fewer documents than this mean little: every phrase selects candidates.
COMMON_MIN_DOCUMENTS = 2_000
STATS_TTL_SECONDS = 300.0


@dataclass(frozen=True)
class Index:
    """One full-text index: `sqlite` is the FTS5 table, `postgresql` the tsvector table."""

    sqlite: str
    postgresql: str


MESSAGES = Index(sqlite="memory_message_fts", postgresql="memory_message_search")
MEMORIES = Index(sqlite="memory_archival_fts", postgresql="memory_archival_search")


def backend() -> str | None:
    """The full-text backend of the default database, None where there is none (search falls back to BM25
    over the rows in Python)."""
    return connection.vendor if connection.vendor in ("postgresql", "sqlite") else None


def tsquery(phrases: Iterable[tuple[str, ...]], scopes: Iterable[str] = ()) -> str:
    """A tsquery in PostgreSQL's input syntax: any of the phrases (and, given scopes, one of the scope
    lexemes the stored vectors carry). Atoms are letters and digits only (no quote, backslash or operator can
    reach it), so it always parses; the caller never passes an empty list of phrases."""
    terms = " | ".join("(" + " <-> ".join(f"'{atom}'" for atom in phrase) + ")" for phrase in phrases)
    scopes = list(scopes)
    if not scopes:
        return terms
    return "(" + " | ".join(f"'{scope}'" for scope in scopes) + f") & ({terms})"


def fts5_query(scopes: Iterable[str], phrases: Iterable[tuple[str, ...]]) -> str:
    """An FTS5 MATCH expression: one of the scope tokens, and any of the phrases in the body. Every string
    is double-quoted and holds letters and digits only, so it always parses."""
    scope = " OR ".join(f'"{s}"' for s in scopes)
    body = " OR ".join('"' + " ".join(phrase) + '"' for phrase in phrases)
    return f"scope : ({scope}) AND body : ({body})"


def scope_token(kind: str, value: uuid.UUID | int | str) -> str:
    """How both indexes name a conversation (c + uuid hex) or an end user (u + id) in a document's words."""
    if isinstance(value, uuid.UUID):
        value = value.hex
    return f"{kind}{str(value).replace('-', '')}"


_stats: dict[str, tuple[float, dict[str, float], int]] = {}


def _postgresql_shares(index: Index) -> tuple[dict[str, float], int]:
    """Lexeme -> share of rows, from PostgreSQL's own statistics of the tsvector column (most common
    elements, gathered by ANALYZE/autovacuum). Lexemes not listed are rarer than the least common listed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats "
            "WHERE schemaname = current_schema() AND tablename = %s AND attname = 'document'",
            [index.postgresql],
        )
        row = cursor.fetchone()
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s", [index.postgresql])
        documents = (cursor.fetchone() or [0])[0]
    if not row or not row[0]:
        return {}, max(0, documents)
    return dict(zip(row[0], row[1], strict=False)), max(0, documents)


def _sqlite_documents(index: Index) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {index.sqlite}_docsize")  # noqa: S608 - a constant name
        row = cursor.fetchone()
        return int(row[0])


def atom_shares(index: Index, atoms: Iterable[str]) -> tuple[dict[str, float], int]:
    """(atom -> share of the index's documents holding it, documents in the index). Approximate on
    PostgreSQL (its statistics), exact on SQLite (fts5vocab); refreshed every STATS_TTL_SECONDS."""
    atoms = sorted(set(atoms))
    kind = backend()
    key = f"{connection.alias}:{kind}:{index.sqlite}"
    now = time.monotonic()
    cached = _stats.get(key)
    if kind == "postgresql":
        if cached is None or now - cached[0] > STATS_TTL_SECONDS:
            shares, documents = _postgresql_shares(index)
            cached = (now, shares, documents)
            _stats[key] = cached
        return {a: cached[1][a] for a in atoms if a in cached[1]}, cached[2]
    if kind == "sqlite":
        if cached is None or now - cached[0] > STATS_TTL_SECONDS:
            cached = (now, {}, _sqlite_documents(index))
            _stats[key] = cached
        documents = cached[2]
        if documents < COMMON_MIN_DOCUMENTS or not atoms:
            return {}, documents
        placeholders = ", ".join(["%s"] * len(atoms))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT term, doc FROM {index.sqlite}_vocab WHERE term IN ({placeholders})",  # noqa: S608
                atoms,
            )
            return {term: doc / documents for term, doc in cursor.fetchall()}, documents
    return {}, 0


def selective(
    index: Index,
    phrases: list[tuple[str, ...]],
    *,
    scope_size: int,
    budget: int,
    secondary: frozenset[tuple[str, ...]] = frozenset(),
) -> tuple[list[tuple[str, ...]], dict[str, float], float]:
    """(the phrases that select candidates, atom -> share of documents holding it, the share of documents
    the chosen phrases are expected to match). Rarest first, phrases are taken while the matches they are
    expected to bring from a scope of `scope_size` documents stay within `budget`: a common word finds many
    messages and gives each little (its IDF is low), so it is left to the re-ranking. A phrase is as common
    as its rarest atom. The rarest phrase always selects; all do while the index is too small for its
    statistics to mean much (or PostgreSQL has not analysed it yet). `secondary` phrases (a rewrite's
    additions) come after all of the query's own, however rare."""
    shares, documents = atom_shares(index, (a for p in phrases for a in p))
    if documents < COMMON_MIN_DOCUMENTS or not shares:
        return phrases, shares, 0.0

    def share(phrase: tuple[str, ...]) -> float:
        return min(shares.get(a, 0.0) for a in phrase)

    chosen: list[tuple[str, ...]] = []
    density = 0.0
    for phrase in sorted(phrases, key=lambda p: (p in secondary, share(p))):
        if chosen and (density + share(phrase)) * scope_size > budget:
            break
        chosen.append(phrase)
        density += share(phrase)
    return chosen, shares, density


def token_shares(query: str, shares: dict[str, float]) -> dict[str, float]:
    """The share of documents holding each BM25 term of the query, from the shares of its atoms (a term is
    at most as common as its rarest atom), for bm25_rank(shares=...)."""
    if not shares:
        return {}
    out = {}
    for term in set(search_words(query)):
        atoms = _ATOM.findall(term)
        if atoms:
            out[term] = min(shares.get(a, 0.0) for a in atoms)
    return out
