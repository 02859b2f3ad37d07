"""python manage.py bootstrap_demo: once, a demo tenant, API key and admin user for `make run`.

The credentials are printed when created and also written to var/demo-credentials.env (mode 600) so the
README's curl examples can read them; this is for the embedded developer setup only."""

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from tenants.models import Membership, Tenant
from tenants.services import tenant_create

DEMO_SLUG = "demo"
DEMO_ADMIN = "admin"


def credentials_path() -> Path:
    return Path(settings.VAR_DIR) / "demo-credentials.env"


class Command(BaseCommand):
    help = "Create the demo tenant, its API key and an admin user, once."

    def handle(self, *args: Any, **options: Any) -> None:
        path = credentials_path()
        if Tenant.objects.filter(slug=DEMO_SLUG).exists():
            self.stdout.write(
                f"Demo tenant exists; its credentials were printed at creation and are in {path}."
            )
            if path.exists():
                self.stdout.write(path.read_text())
            return
        password = secrets.token_urlsafe(12)
        with transaction.atomic():
            tenant, raw_key = tenant_create(slug=DEMO_SLUG, name="Demo tenant")
            User = get_user_model()
            user = User.objects.filter(username=DEMO_ADMIN).first()
            if user is None:
                user = User.objects.create_superuser(DEMO_ADMIN, email="", password=password)
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
            Membership.objects.get_or_create(
                user=user, tenant=tenant, defaults={"role": Membership.Role.OPERATOR}
            )
        text = (
            f"MNEMO_TENANT={tenant.slug}\n"
            f"MNEMO_API_KEY={raw_key}\n"
            f"MNEMO_ADMIN_USER={DEMO_ADMIN}\n"
            f"MNEMO_ADMIN_PASSWORD={password}\n"
        )
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
        self.stdout.write(self.style.SUCCESS("Created the demo tenant, API key and admin user:"))
        self.stdout.write(text)
        self.stdout.write(f"(also saved in {path})")
