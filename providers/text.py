"""Text heuristics shared by the summariser, memory and retrieval: the stopword lists (one per use, each named
for it), the sentence splitters, the file extensions, the pieces of fact patterns both fact extractors use,
and what counts as code in a message. Plain functions over strings: no Django, no models."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator


def wordset(text: str) -> frozenset[str]:
    """The words of a list written as text (easier to read and edit than a list of strings)."""
    return frozenset(text.split())


# The CJK scripts (kana, CJK ideographs, hangul) as the body of a character class: text without spaces, where
# the indexes take each character as a word.
CJK = "\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af"

# --- stopwords ---------------------------------------------------------------------------------------------

# English function words (pronouns, articles, auxiliaries, prepositions, conjunctions): they match anything
# and say nothing about what a text is about.
FUNCTION_WORDS = wordset("""
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just let me more most my myself no nor
not now of off on once only or other our ours ourselves out over own same she should so some such than that
the their theirs them themselves then there these they this those through to too under until up very was
we were what when where which while who whom why will with would you your yours yourself yourselves
""")
CONTRACTIONS = wordset("""
aren't can't couldn't didn't doesn't don't hadn't hasn't haven't he'd he'll he's here's how's i'd i'll i'm
i've isn't it's let's mustn't shan't she'd she'll she's shouldn't that's there's they'd they'll they're
they've wasn't we'd we'll we're we've weren't what's when's where's who's why's won't wouldn't you'd you'll
you're you've
""")
# Chat filler: acknowledgements, hedges and vague quantities.
FILLER_WORDS = wordset("""
also just like get got ok okay yes yeah sure thanks thank please well now one two really maybe still
actually though lot lots bit cannot ought
""")

# Full-text search over messages and memories (retrieval.lexical): a short list, so that a query keeps the
# words that narrow it ("after", "only", "before").
SEARCH_STOPWORDS = wordset("""
a an the and or but of to in on at for with is are was were be been it its this that these those i you he
she we they me my your our their do does did what which who whom how when where why can could would should
will shall not no yes so as by from about into than then there here just also please
""")
# Whole-history BM25 over stemmed passages (retrieval.history).
PASSAGE_STOPWORDS = FUNCTION_WORDS | {"also", "please"}
# The extractive summariser's term weights and name trimming (providers.summariser); "let" and "will" have
# always counted as terms there.
SUMMARY_STOPWORDS = (FUNCTION_WORDS - {"let", "will"}) | CONTRACTIONS | FILLER_WORDS
# Words that never say what a fact is about (memory.facts signatures): the search list and the vague words
# of conversation around a value.
FACT_STOPWORDS = SEARCH_STOPWORDS | wordset("""
it's its that's there's here's i'm i've we're we've they're you're let's us them him her his hers one ones
some any all each every have has had having make makes made need needs want wants first still only very
really actually basically same other another thing things stuff way bit lot ok okay yes yeah hey hi thanks
thank does did done doing don't doesn't isn't aren't wasn't weren't won't can't cannot via through behind
across after before during without within between against around if else because while up down out off
on at in to into onto of for with by should must may might also too anything something everything nothing
someone anyone everyone which whose whom there here what
""")

# --- the words of full-text search ------------------------------------------------------------------------
# Here, not in retrieval.lexical, because archival memory's writes compare statements by these words
# (jaccard) and memory sits below retrieval.

# A word: a CJK run, or letters/digits joined by - . / _ (an identifier, a path, a version: one BM25 term).
SEARCH_WORD = re.compile(rf"[{CJK}]+|[^\W_{CJK}](?:[^\W_{CJK}]|[-./_](?=[^\W_{CJK}]))*")
CJK_START = re.compile(rf"[{CJK}]")


def search_words(text: str) -> list[str]:
    """BM25 terms: words without stopwords, an identifier whole; CJK runs as characters and bigrams."""
    return list(iter_search_words(text))


def iter_search_words(text: str) -> Iterator[str]:
    """search_words() one at a time, for a reader that needs only the first few of a long text."""
    for match in SEARCH_WORD.finditer(text.lower()):
        word = match.group(0)
        # A match is either all CJK or starts with a letter or digit outside CJK: its first character tells.
        if CJK_START.match(word):
            yield from word  # unigrams
            yield from (word[i : i + 2] for i in range(len(word) - 1))  # and bigrams
        elif word not in SEARCH_STOPWORDS:
            yield word


def jaccard(a: str, b: str) -> float:
    """The share of search words two texts have in common (of all the words either holds)."""
    ta, tb = set(search_words(a)), set(search_words(b))
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / len(ta | tb)


# --- names of the calendar ---------------------------------------------------------------------------------

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

# --- pieces of fact patterns -------------------------------------------------------------------------------

# File extensions that make a dotted word a file name (a path to the summariser's fact check; not a host or
# an identifier to memory.facts).
FILE_EXTENSIONS = wordset("""
py pyi js mjs cjs ts tsx jsx go rs java kt rb php swift c h cc cpp hpp cs scala sql sh bash zsh ps1 md rst
txt csv tsv json jsonl yml yaml toml ini cfg conf env lock xml htm html css scss vue svelte ipynb log pdf doc
docx xls xlsx ppt pptx png jpg jpeg gif svg webp zip tar gz tgz proto graphql tf hcl dockerfile
""")
# The same list as a regular expression group (longest first, so "tsx" is tried before "ts").
FILE_EXTENSION_PATTERN = "(?:" + "|".join(sorted(FILE_EXTENSIONS, key=lambda e: (-len(e), e))) + ")"
# What follows a URL's scheme: up to a space, a quote or a closing bracket, without the sentence's own
# punctuation at its end.
URL_TAIL = r"[^\s<>\"'`)\]]+[^\s<>\"'`)\].,;:!?]"

# --- code in a message -------------------------------------------------------------------------------------

# A fenced code block, or an unclosed one to the end of the text.
CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_COMMANDS = wordset("""
sudo kubectl git curl wget ssh scp rsync docker podman psql mysql redis-cli cd ls grep pip npm npx yarn pnpm
python python3 node cargo terraform helm aws gcloud az systemctl journalctl rm mv cp chmod chown echo
""")
_LOG_LEVEL = re.compile(r"\b(?:INFO|WARN|WARNING|ERROR|DEBUG|TRACE|FATAL|CRITICAL)\b")
_CODE_START = re.compile(
    r"(?:Traceback \(|File \"|at [\w.$]+\(|def |class \w+[(:]|import |from [\w.]+ import |return |"
    r"const |let |var |func |fn |SELECT |INSERT |UPDATE \w+ SET|CREATE |DROP |ALTER |WITH \w+ AS)"
)


def is_code_line(line: str) -> bool:
    """Whether a line is code, a log line, a command, a quote or a table row rather than someone talking."""
    if re.match(r"(?: {4}|\t)(?!\s*(?:[-*•]|\d+[.)])\s)", line):  # indented code, not a nested list item
        return True
    text = line.strip()
    if re.match(r"(?:\$|%|#+|>>>|>|PS>)\s|\|", text):  # a prompt, a comment, a quote, a table row
        return True
    if re.match(r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\[?\d{2}:\d{2}:\d{2}", text):  # a log line
        return True
    if _LOG_LEVEL.search(text) and re.search(r"\w=\S|\d{2}:\d{2}", text):
        return True
    if len(re.findall(r"\b\w+=\S", text)) >= 2 or _CODE_START.match(text):
        return True
    if text.split(" ", 1)[0] in _COMMANDS and re.search(r"\s--?\w|&&|\|\s|\s>\s|=|\s\.?/", text):
        return True
    symbols = sum(c in "{}[]();=<>$`\\" for c in text)
    return symbols >= 4 and symbols > 0.08 * len(text.replace(" ", ""))


# --- sentences ---------------------------------------------------------------------------------------------
# Three splitters for three uses: what a summary may quote, where an excerpt may cut, what a user stated.

_SUMMARY_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(\[`*#-])")
MAX_SUMMARY_SENTENCE_CHARS = 400


def summary_sentences(text: str) -> list[str]:
    """The sentences of a message an extractive summary may quote. Code blocks are left out (their names are
    caught by the fact check); lines are kept apart (lists, logs); a dot inside a word (file.py, 3.14, e.g.)
    does not end a sentence; a sentence longer than MAX_SUMMARY_SENTENCE_CHARS is cut with " …"."""
    text = CODE_FENCE.sub("\n", text)
    sentences: list[str] = []
    for line in text.split("\n"):
        line = line.strip().lstrip("-*•>#").strip()
        if not line:
            continue
        for piece in _SUMMARY_SENTENCE_END.split(line):
            piece = piece.strip()
            if len(piece) < 3 or not re.search(r"[A-Za-z0-9]", piece):
                continue
            if len(piece) > MAX_SUMMARY_SENTENCE_CHARS:
                cut = piece.rfind(" ", 0, MAX_SUMMARY_SENTENCE_CHARS)
                piece = piece[: cut if cut > 100 else MAX_SUMMARY_SENTENCE_CHARS] + " …"
            sentences.append(piece)
    return sentences


_SPAN_SENTENCE = re.compile(r"[^\n]+?(?:[.!?。！？](?=\s)|$)|[^\n]+")


@functools.lru_cache(maxsize=4096)
def sentence_spans(text: str) -> tuple[tuple[int, int], ...]:
    """(start, end) of each sentence (or line) of a text, for excerpts that cut between sentences; the whole
    text when it has none. Memoised: recall asks for the same messages call after call."""
    spans = [(m.start(), m.end()) for m in _SPAN_SENTENCE.finditer(text) if m.group(0).strip()]
    return tuple(spans) or ((0, len(text)),)


# Sentences end at . ! ? … followed by a space or the end of the line, at 。！？ and at line breaks: never
# inside 7.31.4, bastion-12.eu2.acme.internal or an e-mail address, nor after an abbreviation (e.g., i.e.).
_PROSE_SENTENCE_END = re.compile(r"[.!?…]+[\"'’”)\]]*(?=\s|$)|[。！？]+")
_ABBREVIATIONS = wordset("e.g i.e etc vs approx incl cf al mr mrs ms dr st no nr fig ca resp")


def prose_sentences(text: str) -> list[str]:
    """The sentences of a message's prose as written, end punctuation kept: code blocks, logs, commands and
    quotes (is_code_line) are left out, and so are list markers."""
    out = []
    for line in CODE_FENCE.sub("\n", text).split("\n"):
        if not line.strip() or is_code_line(line):
            continue
        line = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s+", "", line)  # a list item's marker
        start = 0
        for end in _PROSE_SENTENCE_END.finditer(line):
            if end.group(0) == ".":
                before = re.search(r"[\w.]+$", line[start : end.start()])
                word = before.group(0) if before else ""
                if word.lower() in _ABBREVIATIONS or re.fullmatch(r"[A-Z]", word):  # e.g. / J. Smith
                    continue
            out.append(line[start : end.end()])
            start = end.end()
        out.append(line[start:])
    return [s.strip() for s in out if without_end_mark(s)]


def without_end_mark(sentence: str) -> str:
    """The sentence without surrounding space and its final full stop or exclamation mark."""
    return sentence.strip().rstrip(".!。！…")
