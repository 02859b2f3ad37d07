"""Which code language a file's name names: those tree-sitter reads here, those read as windows of lines,
and files known by their whole name. Below both the format detection and the code chunker."""

from pathlib import PurePosixPath

LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".java": "java",
    ".go": "go",
}
# Read as windows of lines (no grammar shipped for them).
LINE_LANGUAGES = {
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".cs": "csharp", ".rs": "rust",
    ".rb": "ruby", ".php": "php", ".kt": "kotlin", ".swift": "swift", ".scala": "scala", ".sh": "shell",
    ".bash": "shell", ".sql": "sql", ".lua": "lua", ".r": "r", ".m": "objc", ".css": "css", ".scss": "css",
    ".vue": "vue", ".svelte": "svelte", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".ini": "ini",
    ".cfg": "ini", ".json": "json", ".xml": "xml", ".proto": "protobuf", ".gradle": "gradle",
    ".dockerfile": "dockerfile", ".tf": "terraform", ".ex": "elixir", ".exs": "elixir", ".dart": "dart",
}  # fmt: skip
NAMED_FILES = {"dockerfile": "dockerfile", "makefile": "make"}


def language_for(path: str) -> str:
    name = PurePosixPath(path.lower())
    return LANGUAGES.get(name.suffix) or LINE_LANGUAGES.get(name.suffix) or NAMED_FILES.get(name.name, "")
