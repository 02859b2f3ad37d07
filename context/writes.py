"""The writes of a context call, in one place: the stages only note what the call changes (state.writes:
the pipeline state row, core-memory snapshots, the window start, the prefix hints and the cache-usage row,
queued compaction and image descriptions); writes_apply makes them once, after the stages, when the request
records. The admin inspector's dry run (record=False) changes nothing."""

from django.db import transaction

from context.state import ContextState


def writes_apply(state: ContextState) -> None:
    """Apply the call's writes in the order the stages noted them, in one transaction (work is queued on its
    commit), or none of them when the request records nothing."""
    if not state.request.record:
        return
    with transaction.atomic():
        for write in state.writes:
            write()
