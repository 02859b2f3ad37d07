from django.apps import AppConfig


class ContextConfig(AppConfig):
    name = "context"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from context.receivers import fold_core_memory, resume_window_at_boundary
        from summaries.signals import boundary_moved

        boundary_moved.connect(fold_core_memory, dispatch_uid="context.fold_core_memory")
        boundary_moved.connect(resume_window_at_boundary, dispatch_uid="context.resume_window_at_boundary")
