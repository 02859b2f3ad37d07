"""Signals the summaries app owns, so that other apps react to compaction without this app importing them.

`boundary_moved` is the hook for folding core-memory edits into B2a at a compaction boundary (the system
message changes there anyway, so the prefix cache loses nothing extra). memory is a sibling of summaries
and cannot import it: the context app, which sits above both, connects memory's receiver in its ready().
Sent after the compaction commits. kwargs: conversation_id, boundary_seq, end_seq, trigger."""

from django.dispatch import Signal

boundary_moved = Signal()
