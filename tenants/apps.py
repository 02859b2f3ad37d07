from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Receivers connect once the app registry is ready (they name models).
        from tenants import receivers  # noqa: F401
