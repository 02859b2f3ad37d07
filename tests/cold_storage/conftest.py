import pytest
from django.conf import settings


def blob_files() -> list[str]:
    """Every image file in both tiers (relative paths), temp files included."""
    root = settings.MEDIA_ROOT / "images"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture(autouse=True)
def _empty_tiers():
    """Each test starts with empty tiers (MEDIA_ROOT is one temp folder for the whole run)."""
    import shutil

    shutil.rmtree(settings.MEDIA_ROOT / "images", ignore_errors=True)
    yield
