from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    name = "knowledge"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Receivers connect once the app registry is ready (they name models).
        from knowledge import receivers  # noqa: F401
