from django.apps import AppConfig


class ContextConfig(AppConfig):
    name = "context"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from context.receivers import fold_core_memory
        from summaries.signals import boundary_moved

        boundary_moved.connect(fold_core_memory, dispatch_uid="context.fold_core_memory")
