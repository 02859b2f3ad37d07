from django.apps import AppConfig


class ColdStorageConfig(AppConfig):
    name = "cold_storage"
    verbose_name = "Images and cold storage"
    default_auto_field = "django.db.models.BigAutoField"
