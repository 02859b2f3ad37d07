from django.apps import AppConfig


class PrefixCacheConfig(AppConfig):
    name = "prefix_cache"
    verbose_name = "Prefix cache"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Receivers connect once the app registry is ready (they name models).
        from prefix_cache import receivers  # noqa: F401
