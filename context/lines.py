"""How a stored turn reads in a prompt: its speaker's name before it when the client named one, a date line
where the day changes, and its relative dates resolved ("yesterday (2023-05-07)"). Pure functions of the
stored rows, so the history's bytes, and the provider's cached prefix, stay the same from call to call."""

from datetime import datetime

from providers.dates import annotate

# Roles whose text is a turn of the conversation (a tool result or a system note keeps its own shape).
SPOKEN_ROLES = ("user", "assistant")


def date_line(created_at: datetime) -> str:
    return f"[{created_at.strftime('%A, %Y-%m-%d')}]"


def turn_text(content: str, *, role: str, name: str, created_at: datetime, new_day: bool) -> str:
    """The text a history turn is shown with: date line (on a new day), "name: " and its resolved dates."""
    if role not in SPOKEN_ROLES or not content:
        return content
    text = annotate(content, created_at.date())
    if name:
        text = f"{name}: {text}"
    return f"{date_line(created_at)}\n{text}" if new_day else text
