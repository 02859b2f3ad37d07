"""The retrieval app: everything that finds candidates for B5. It has no models; at start-up it connects its
receivers and installs the archival search that memory's agent calls through memory.archival."""

from django.apps import AppConfig


class RetrievalConfig(AppConfig):
    name = "retrieval"

    def ready(self) -> None:
        # Imported here, not at the top: they read models, which exist only once the apps are loaded.
        from memory.archival import archival_search_install
        from retrieval import receivers  # noqa: F401
        from retrieval.archival import archival_search

        archival_search_install(archival_search)
