"""Code files into chunks: tree-sitter (one grammar package per language: Python, JavaScript, TypeScript,
Java, Go) finds every function, method and class; each becomes a chunk with its qualified symbol and lines
(the comments right above it included). A class's chunk is its skeleton: its own lines with each method
reduced to its first line, the methods being chunks of their own. Code outside any definition (imports,
constants, scripts), definitions too long for one chunk, and languages without a grammar here are cut into
windows of lines."""

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from knowledge.chunking import MAX_TOKENS, TARGET_TOKENS, Draft
from knowledge.languages import language_for
from providers.tokens import count_text

logger = logging.getLogger(__name__)

# Node types that are definitions, per grammar.
DEFINITIONS = {
    "python": {"function_definition", "class_definition"},
    "javascript": {
        "function_declaration", "generator_function_declaration", "class_declaration", "method_definition",
    },
    "typescript": {
        "function_declaration", "generator_function_declaration", "class_declaration", "method_definition",
        "abstract_class_declaration", "interface_declaration", "enum_declaration", "function_signature",
        "abstract_method_signature",
    },
    "java": {
        "class_declaration", "interface_declaration", "enum_declaration", "record_declaration",
        "method_declaration", "constructor_declaration", "annotation_type_declaration",
    },
    "go": {"function_declaration", "method_declaration", "type_spec"},
}  # fmt: skip
DEFINITIONS["tsx"] = DEFINITIONS["typescript"]
# `const f = () => …` and `const f = function () {…}` are functions too.
_FUNCTION_VALUES = {"arrow_function", "function_expression", "function", "generator_function"}
_CONTAINERS = ("class", "interface", "enum", "record", "type_spec", "annotation_type")
_COMMENTS = {"comment", "line_comment", "block_comment"}


@lru_cache(maxsize=8)
def _parser(language: str) -> Any:
    # tree-sitter and each grammar package load only when code of that language arrives.
    from tree_sitter import Language, Parser

    if language == "python":
        import tree_sitter_python

        capsule = tree_sitter_python.language()
    elif language in ("javascript",):
        import tree_sitter_javascript

        capsule = tree_sitter_javascript.language()
    elif language in ("typescript", "tsx"):
        import tree_sitter_typescript

        if language == "tsx":
            capsule = tree_sitter_typescript.language_tsx()
        else:
            capsule = tree_sitter_typescript.language_typescript()
    elif language == "java":
        import tree_sitter_java

        capsule = tree_sitter_java.language()
    else:
        import tree_sitter_go

        capsule = tree_sitter_go.language()
    return Parser(Language(capsule))


@dataclass
class Definition:
    node: Any
    symbol: str
    start: int  # 0-based first line (its leading comments included)
    end: int  # 0-based last line
    signature: int  # 0-based line of the definition itself (after comments and decorators)
    children: list["Definition"]


def _name(node: Any, language: str) -> str | None:
    """The definition's name, or None when the node is not a definition."""
    if node.type in DEFINITIONS[language]:
        name = node.child_by_field_name("name")
        return name.text.decode("utf-8", "replace") if name is not None else None
    if node.type in ("lexical_declaration", "variable_declaration") and language != "python":
        for declarator in node.named_children:
            value = declarator.child_by_field_name("value")
            name = declarator.child_by_field_name("name")
            if value is not None and name is not None and value.type in _FUNCTION_VALUES:
                return name.text.decode("utf-8", "replace")
    return None


def _receiver(node: Any) -> str:
    """A Go method's receiver type, which qualifies its name (`Server.Serve`)."""
    receiver = node.child_by_field_name("receiver")
    if receiver is None:
        return ""
    for sub in receiver.named_children:
        kind = sub.child_by_field_name("type")
        if kind is not None:
            return kind.text.decode("utf-8", "replace").lstrip("*").split("[")[0]
    return ""


def _first_line(node: Any) -> int:
    """The definition's first line, moved up over the comments (and Python decorators) right above it."""
    start = node.start_point[0]
    sibling = node.prev_named_sibling
    while sibling is not None and sibling.type in _COMMENTS and sibling.end_point[0] >= start - 1:
        start = sibling.start_point[0]
        sibling = sibling.prev_named_sibling
    return start


def _definitions(node: Any, language: str, scope: tuple[str, ...]) -> list[Definition]:
    found: list[Definition] = []
    for child in node.named_children:
        target = child
        if child.type in ("decorated_definition", "export_statement"):
            inner = child.child_by_field_name("definition") or child.child_by_field_name("declaration")
            target = inner if inner is not None else child
        name = _name(target, language) if target is not None else None
        if name is None:
            found += _definitions(child, language, scope)
            continue
        if language == "go" and target.type == "method_declaration" and _receiver(target):
            name = f"{_receiver(target)}.{name}"
        symbol = ".".join((*scope, name))
        # A function's inner functions stay in its chunk; a class's methods are chunks of their own.
        container = any(word in target.type for word in _CONTAINERS)
        inner_defs = _definitions(target, language, (*scope, name)) if container else []
        start, signature = _first_line(child), target.start_point[0]
        found.append(Definition(child, symbol, start, child.end_point[0], signature, inner_defs))
    return found


def line_windows(lines: list[str], first: int, last: int, **fields: Any) -> list[Draft]:
    """Lines first..last (0-based, inclusive) as drafts of about TARGET_TOKENS, cut at a blank line near the
    end of a window when there is one."""
    drafts: list[Draft] = []
    start, size, blank = first, 0, -1
    for number in range(first, last + 1):
        tokens = count_text(lines[number]) + 1
        if number > start and size + tokens > TARGET_TOKENS:
            cut = blank if blank > start + (number - start) // 2 else number - 1
            drafts.append(_window(lines, start, cut, **fields))
            start, size, blank = cut + 1, sum(count_text(x) + 1 for x in lines[cut + 1 : number]), -1
        size += tokens
        if not lines[number].strip():
            blank = number
    if start <= last:
        drafts.append(_window(lines, start, last, **fields))
    return [d for d in drafts if d.content.strip()]


def _window(lines: list[str], start: int, end: int, **fields: Any) -> Draft:
    content = "\n".join(lines[start : end + 1]).strip("\n")
    return Draft(
        content=content, start_line=start + 1, end_line=end + 1, tokens=count_text(content), **fields
    )


def _definition_drafts(lines: list[str], definition: Definition, **fields: Any) -> list[Draft]:
    """The definition's chunk (a skeleton when it holds definitions of its own), then theirs."""
    covered: set[int] = set()
    for child in definition.children:
        covered.update(range(child.start, child.end + 1))
    for child in definition.children:
        covered.discard(child.signature)  # a method keeps its signature line in the skeleton
    own = [n for n in range(definition.start, definition.end + 1) if n not in covered]
    content = "\n".join(lines[n] for n in own)
    tokens = count_text(content)
    drafts: list[Draft] = []
    if tokens <= MAX_TOKENS:
        drafts.append(
            Draft(
                content=content, start_line=definition.start + 1, end_line=definition.end + 1,
                symbol=definition.symbol, tokens=tokens, **fields,
            )
        )  # fmt: skip
    elif not definition.children:
        drafts += line_windows(lines, definition.start, definition.end, symbol=definition.symbol, **fields)
    else:
        head_end = definition.children[0].start - 1
        drafts += line_windows(lines, definition.start, max(definition.start, head_end),
                               symbol=definition.symbol, **fields)  # fmt: skip
    for child in definition.children:
        drafts += _definition_drafts(lines, child, **fields)
    return drafts


def code_chunks(path: str, data: bytes) -> list[Draft]:
    """The drafts of one source file (windows of lines when its language has no grammar here or it does
    not parse)."""
    language = language_for(path)
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    fields = {"path": path, "language": language}
    if not lines:
        return []
    if language not in DEFINITIONS:
        return line_windows(lines, 0, len(lines) - 1, **fields)
    try:
        tree = _parser(language).parse(data)
    except Exception as exc:  # a grammar that gives up: the file is still searchable
        logger.warning("tree-sitter could not parse %s: %s", path, exc)
        return line_windows(lines, 0, len(lines) - 1, **fields)
    definitions = _definitions(tree.root_node, language, ())
    drafts: list[Draft] = []
    cursor = 0
    for definition in definitions:
        if definition.start > cursor:
            drafts += line_windows(lines, cursor, definition.start - 1, **fields)
        drafts += _definition_drafts(lines, definition, **fields)
        cursor = max(cursor, definition.end + 1)
    if cursor < len(lines):
        drafts += line_windows(lines, cursor, len(lines) - 1, **fields)
    return [d for d in drafts if d.content.strip()]
