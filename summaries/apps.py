from django.apps import AppConfig


class SummariesConfig(AppConfig):
    name = "summaries"
    verbose_name = "Summaries and compaction"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connected once the apps are loaded: the receivers import models.
        from summaries import receivers  # noqa: F401
