"""Copy the vectors of the database rows (messages, knowledge chunks, archival memories) into the Milvus
engine before switching MNEMO_VECTOR_STORE to it: in batches, resumable (a vector already there is not
written again), and checked at the end by counting each kind in the engine."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from retrieval.vectors.config import parse_vector_store
from retrieval.vectors.milvus_store import MilvusVectorStore
from retrieval.vectors.rows import DIMENSION, record_batches, row_count
from retrieval.vectors.store import KINDS, Kind, VectorStoreUnavailable


@dataclass
class Tally:
    kind: str
    rows: int = 0  # database rows carrying vectors
    vectors: int = 0  # the vectors in them (a message has one per passage)
    present: int = 0  # already in the engine: skipped
    written: int = 0
    in_store: int = 0

    @property
    def verified(self) -> bool:
        return self.in_store == self.vectors


class Command(BaseCommand):
    help = "Copy the database's vectors into the vector engine (resumable), then verify the counts per kind."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--to", required=True, choices=["milvus", "numpy"], help="The backend to fill")
        parser.add_argument(
            "--uri", help="milvus://host:port or milvus:///abs/path.db (default: MNEMO_VECTOR_STORE)"
        )
        parser.add_argument("--kind", choices=KINDS, action="append", help="Only this kind (repeatable)")
        parser.add_argument("--batch", type=int, default=500, help="Database rows read and written at once")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (e.g. in cron logs)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["to"] == "numpy":
            self.stdout.write("Nothing to copy: the numpy backend searches the database rows themselves.")
            return
        store = self._target(options["uri"])
        tallies = []
        try:
            for kind in options["kind"] or KINDS:
                tallies.append(self._copy(store, kind, options["batch"], options["no_progress"]))
        except VectorStoreUnavailable as exc:
            raise CommandError(f"The vector engine cannot be reached ({exc}); run again to resume.") from exc
        finally:
            store.close()
        self._report(tallies)
        if not all(t.verified for t in tallies):
            raise CommandError(
                "Counts differ: written or deleted meanwhile, or deletes that never reached the engine."
            )

    def _target(self, uri: str | None) -> MilvusVectorStore:
        config = parse_vector_store(uri) if uri else settings.MNEMO_VECTOR_STORE
        if config.backend != "milvus":
            raise CommandError("MNEMO_VECTOR_STORE names no Milvus engine: pass --uri milvus://host:port.")
        return MilvusVectorStore(config.uri, token=config.token, dimension=DIMENSION)

    def _copy(self, store: MilvusVectorStore, kind: Kind, batch_size: int, quiet: bool) -> Tally:
        tally = Tally(kind)
        rows = row_count(kind)
        bar = tqdm(total=rows, desc=kind, unit="row", disable=quiet, file=self.stderr._out)
        with bar:
            for batch in record_batches(kind, batch_size=batch_size):
                present = store.present(kind, [r.key for r in batch])
                missing = [r for r in batch if r.key not in present]
                store.add(missing)
                tally.vectors += len(batch)
                tally.present += len(present)
                tally.written += len(missing)
                done = len({r.id for r in batch})
                tally.rows += done
                bar.update(done)
        store.flush(kind)
        tally.in_store = store.count(kind)
        return tally

    def _report(self, tallies: list[Tally]) -> None:
        header = ("kind", "rows", "vectors", "already there", "written", "in engine", "check")
        lines = [header] + [
            (t.kind, t.rows, t.vectors, t.present, t.written, t.in_store, "ok" if t.verified else "MISMATCH")
            for t in tallies
        ]
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
        for line in lines:
            self.stdout.write(
                "  ".join(
                    str(v).rjust(w) if i else str(v).ljust(w)
                    for i, (v, w) in enumerate(zip(line, widths, strict=True))
                )
            )
