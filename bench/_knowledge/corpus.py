"""The knowledge benchmark's material: Django's own source as a repository upload, its documented functions as
search targets, and a generated PDF."""

from __future__ import annotations

import ast
import io
import random
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from knowledge.identifiers import symbol_words
from tests.knowledge.files import pdf_bytes


@dataclass(frozen=True)
class Target:
    path: str
    line: int  # the def line
    name: str
    qualified: str
    first_sentence: str


def corpus_files(root: Path, folders: list[str]) -> dict[str, bytes]:
    files = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root.parent).as_posix()
            if "/migrations/" in relative or "/locale/" in relative:
                continue
            files[relative] = path.read_bytes()
    return files


def targets(files: dict[str, bytes]) -> list[Target]:
    """Functions and methods (module or class level) with a docstring of at least four words."""
    found = []
    for path, data in files.items():
        try:
            tree = ast.parse(data)
        except SyntaxError:
            continue
        scopes = [(node, "") for node in tree.body]
        for node, prefix in scopes:
            if isinstance(node, ast.ClassDef):
                scopes += [(child, f"{prefix}{node.name}.") for child in node.body]
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node) or ""
            sentence = re.split(r"(?<=\.)\s|\n\n", doc.strip(), maxsplit=1)[0].replace("\n", " ").strip()
            if len(sentence.split()) >= 4:
                found.append(Target(path, node.lineno, node.name, prefix + node.name, sentence))
    return found


def split_name(qualified: str) -> str:
    return symbol_words(qualified.replace(".", " "))


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def pdf_pages(count: int, rng: random.Random) -> bytes:
    words = ["invoice", "ledger", "refund", "policy", "customer", "account", "retention", "backup", "audit"]
    pages = [[" ".join(rng.choice(words) for _ in range(14)) for _ in range(18)] for _ in range(count)]

    return pdf_bytes(pages)
