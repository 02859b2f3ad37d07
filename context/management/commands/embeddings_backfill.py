"""Compute the retrieval vectors that messages lack: after installing (or changing) the embedding model, or
for history written while vectors were off. Resumable: every run fills only what is still missing, so an
interrupted run just starts again. Archival memories and knowledge chunks whose vectors are of another model
(or missing) are embedded again too, unless one conversation is asked for: search compares only vectors of
the current model, so until then they are found by their words alone."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Exists, OuterRef, QuerySet
from django.utils import timezone
from tqdm import tqdm

from conversations.embedding import FILL_BATCH, message_vectors_fill
from conversations.models import Conversation, Message, MessageVector
from knowledge.models import Chunk, Document
from knowledge.vectors import embedding_text
from memory.models import ArchivalMemory
from providers.embeddings import Embedder, embedder_status, to_bytes
from tenants.models import Tenant

# Memories or chunks embedded and written per transaction.
REFRESH_BATCH = 64


class Command(BaseCommand):
    help = (
        "Compute the retrieval vectors of messages that have none for the current embedding model, and embed "
        "again archival memories and knowledge chunks of another model (not with --conversation)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="Only this tenant (slug)")
        parser.add_argument("--conversation", help="Only this conversation (id)")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (e.g. in cron logs)")

    def _tenant(self, options: dict[str, Any]) -> Tenant | None:
        if not options["tenant"]:
            return None
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        return tenant

    def _missing(self, options: dict[str, Any], model: str) -> Any:
        messages = Message.objects.filter(kind=Message.Kind.MESSAGE).filter(
            ~Exists(MessageVector.objects.filter(message_id=OuterRef("pk"), model=model))
        )
        tenant = self._tenant(options)
        if tenant is not None:
            messages = messages.filter(conversation__tenant=tenant)
        if options["conversation"]:
            if not Conversation.objects.filter(pk=options["conversation"]).exists():
                raise CommandError(f"No conversation {options['conversation']!r}.")
            messages = messages.filter(conversation_id=options["conversation"])
        return messages

    def handle(self, *args: Any, **options: Any) -> None:
        embedder = embedder_status().embedder
        if embedder is None:
            raise CommandError(f"No embedding model: {embedder_status().reason}")
        missing = self._missing(options, embedder.name)
        counts = dict(
            missing.order_by()
            .values("conversation_id")
            .annotate(n=Count("pk"))
            .values_list("conversation_id", "n")
        )
        bar = tqdm(
            total=sum(counts.values()),
            desc="embeddings",
            unit="message",
            disable=options["no_progress"],
            file=self.stderr._out,
        )
        written = 0
        for conversation_id, count in counts.items():
            while count > 0:
                done = message_vectors_fill(conversation_id=conversation_id, limit=FILL_BATCH)
                if not done:
                    break
                count -= done
                written += done
                bar.update(done)
        bar.close()
        self.stdout.write(f"{written} message(s) embedded with {embedder.name}.")
        if not options["conversation"]:
            self._refresh_others(options, embedder)

    def _refresh_others(self, options: dict[str, Any], embedder: Embedder) -> None:
        tenant = self._tenant(options)
        memories = ArchivalMemory.objects.exclude(embedding_model=embedder.name)
        chunks = Chunk.objects.exclude(embedding_model=embedder.name)
        if tenant is not None:
            memories, chunks = memories.filter(end_user__tenant=tenant), chunks.filter(tenant=tenant)
        done = self._refresh(memories, embedder, options, unit="memory", text=lambda m: m.content)
        self.stdout.write(f"{done} archival memory(ies) embedded with {embedder.name}.")
        done = self._refresh(chunks, embedder, options, unit="chunk", text=embedding_text)
        self.stdout.write(f"{done} knowledge chunk(s) embedded with {embedder.name}.")

    def _refresh(
        self, rows: QuerySet[Any], embedder: Embedder, options: dict[str, Any], *, unit: str, text: Any
    ) -> int:
        """Embed `rows` again with the current model, REFRESH_BATCH at a time, in primary-key order (a run
        that stops leaves the rest with their old model, which the next run takes up). Documents whose
        chunks changed are marked processed now, so that servers reload their knowledge indexes."""
        bar = tqdm(
            total=rows.count(), desc=unit, unit=unit, disable=options["no_progress"], file=self.stderr._out
        )
        done, after = 0, None
        while True:
            page = rows.order_by("pk")
            batch = list((page.filter(pk__gt=after) if after is not None else page)[:REFRESH_BATCH])
            if not batch:
                break
            vectors = embedder.embed([text(row) for row in batch])
            for row, vector in zip(batch, vectors, strict=True):
                row.embedding, row.embedding_model = to_bytes(vector), embedder.name
            type(batch[0]).objects.bulk_update(batch, ["embedding", "embedding_model"])
            if isinstance(batch[0], Chunk):
                Document.objects.filter(pk__in={c.document_id for c in batch}).update(
                    processed_at=timezone.now()
                )
            after, done = batch[-1].pk, done + len(batch)
            bar.update(len(batch))
        bar.close()
        return done
