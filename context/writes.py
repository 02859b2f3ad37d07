"""The writes of a context call, in one place: the stages only note what the call changes (state.writes:
the pipeline state row, core-memory snapshots, the window start, queued compaction and image descriptions;
state.records: the prefix hints and the cache-usage row); writes_apply makes them once, after the stages,
when the request records. The admin inspector's dry run (record=False) changes nothing."""

from django.db import transaction

from context.state import ContextState
from tenants.statements import writes_pipelined


def writes_apply(state: ContextState) -> None:
    """Apply the call's writes in the order the stages noted them, in one transaction (work is queued on its
    commit), then its records, sent together (tenants.statements.writes_pipelined): outside a transaction
    they are one implicit transaction of their own and one round trip, where a transaction of their own
    would cost its BEGIN and COMMIT too, on every call. None of them when the request records nothing."""
    if not state.request.record:
        return
    if state.writes:
        with transaction.atomic():
            for write in state.writes:
                write()
    if state.records:
        with writes_pipelined():
            for record in state.records:
                record()
