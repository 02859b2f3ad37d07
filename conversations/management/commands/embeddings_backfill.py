"""Compute the retrieval vectors that messages lack: after installing (or changing) the embedding model, or
for history written while vectors were off. Resumable: every run fills only what is still missing, so an
interrupted run just starts again."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Exists, OuterRef
from tqdm import tqdm

from conversations.embedding import FILL_BATCH, message_vectors_fill
from conversations.models import Conversation, Message, MessageVector
from providers.embeddings import embedder_status
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Compute the retrieval vectors of messages that have none for the current embedding model."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="Only this tenant (slug)")
        parser.add_argument("--conversation", help="Only this conversation (id)")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (e.g. in cron logs)")

    def _missing(self, options: dict[str, Any], model: str) -> Any:
        messages = Message.objects.filter(kind=Message.Kind.MESSAGE).filter(
            ~Exists(MessageVector.objects.filter(message_id=OuterRef("pk"), model=model))
        )
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
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
