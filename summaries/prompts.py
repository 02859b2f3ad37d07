"""The summary prompt. TEMPLATE_VERSION is stored on every segment; change it whenever the prompt, the
extractive summariser or the fact check changes what a segment says, and `manage.py resummarize` rebuilds
the segments made with an older version."""

from providers.summariser import VERSION as EXTRACTIVE_VERSION

TEMPLATE_VERSION = f"summary-v1+{EXTRACTIVE_VERSION}"

SYSTEM_PROMPT = """You summarise part of a conversation between a user and an AI agent. The agent will \
continue the conversation with your summary in place of these messages, so keep everything it needs and \
nothing else. Write plain text under these headings, leaving out a heading with nothing under it:

Requests and intent: what the user asked for and why.
Decisions: what was decided or agreed, and by whom.
Key facts: names, numbers, identifiers, file paths, URLs and dates, copied exactly as written.
Errors and fixes: what went wrong and how it was fixed (or that it was not).
Open tasks: what is still to do or was promised.
Attachments and documents: the files, images and documents that mattered most, by name.

Do not invent anything, do not address the user, and stay under {words} words."""


def summary_messages(*, transcript: str, target_tokens: int, instructions: str = "") -> list[dict[str, str]]:
    # ~0.75 words per token for English prose.
    system = SYSTEM_PROMPT.format(words=max(40, int(target_tokens * 0.75)))
    if instructions:
        system += f"\n\nThe operator adds: {instructions.strip()}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Conversation to summarise:\n\n{transcript}"},
    ]
