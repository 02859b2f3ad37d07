"""python manage.py create_tenant SLUG [--name NAME] [--json]: a tenant and its first API key."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenants.errors import ApplicationError
from tenants.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant and its first API key (the key is printed once and never stored)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--json",
            action="store_true",
            help='Print exactly one JSON object {"tenant_id", "slug", "api_key"}.',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant, raw_key = tenant_create(slug=options["slug"], name=options["name"])
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        if options["json"]:
            self.stdout.write(
                json.dumps({"tenant_id": str(tenant.id), "slug": tenant.slug, "api_key": raw_key})
            )
            return
        self.stdout.write(f"Tenant {tenant.slug} ({tenant.id})")
        self.stdout.write(f"API key (shown once): {raw_key}")
