"""Rebuild summary segments from their raw messages with the current template, e.g. after TEMPLATE_VERSION
changed or an LLM was configured. By default only segments made with an older template or by truncation."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from summaries.locks import LockBusy
from summaries.prompts import TEMPLATE_VERSION
from summaries.selectors import segments_to_rebuild
from summaries.services import segment_rebuild
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Rebuild summary segments from their raw messages with the current template."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="Only this tenant (slug)")
        parser.add_argument("--conversation", help="Only this conversation (id)")
        parser.add_argument(
            "--all", action="store_true", help="Every live segment, not only outdated and truncated ones"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be rebuilt, change nothing"
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar (e.g. in cron logs)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
        segments = list(
            segments_to_rebuild(
                tenant=tenant, conversation_id=options["conversation"], only_outdated=not options["all"]
            )
        )
        if options["dry_run"]:
            self.stdout.write(f"{len(segments)} segment(s) would be rebuilt (template {TEMPLATE_VERSION}).")
            return
        rebuilt = skipped = failed = 0
        bar = tqdm(
            segments,
            desc="resummarize",
            unit="segment",
            disable=options["no_progress"],
            file=self.stderr._out,
        )
        for segment in bar:
            try:
                result = segment_rebuild(segment=segment)
            except LockBusy:
                skipped += 1  # a compaction is running on it; the next run picks it up
                continue
            except Exception as exc:
                failed += 1
                self.stderr.write(f"segment {segment.id}: {type(exc).__name__}: {exc}")
                continue
            if result is None:
                skipped += 1
            else:
                rebuilt += 1
            bar.set_postfix(rebuilt=rebuilt, skipped=skipped, failed=failed)
        self.stdout.write(
            self.style.SUCCESS(
                f"Rebuilt {rebuilt} segment(s), skipped {skipped}, failed {failed} "
                f"(template {TEMPLATE_VERSION})."
            )
        )
        if failed:
            raise CommandError(f"{failed} segment(s) could not be rebuilt.")
