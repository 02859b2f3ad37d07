"""Image bytes for the prompt. The context pipeline hands each history message a lazy mapping
image_id → (media_type, base64): an image is read (from whichever tier holds it, sha256-checked) only when
rendering asks for it, i.e. only for images the prompt actually carries as pixels — not for duplicates,
placeholders, or messages the budget dropped. A read that fails is a degradation, and the image renders as
"[Image unavailable: img_…]"."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cold_storage.selectors import ImageBytesUnavailable, image_bytes, images_by_id

if TYPE_CHECKING:
    from context.state import ContextState
from conversations.parts import iter_image_parts


class ImageLoader(Mapping[str, tuple[str, str]]):
    def __init__(
        self, *, tenant_id: Any, image_ids: set[str], on_missing: Callable[[str, str], None]
    ) -> None:
        self._tenant_id = tenant_id
        self._ids = image_ids
        self._on_missing = on_missing
        self._rows: dict[str, Any] | None = None
        self._loaded: dict[str, tuple[str, str] | None] = {}

    def _row(self, image_id: str) -> Any:
        if self._rows is None:
            # One query for every image the history names; bytes are read one by one, on demand.
            self._rows = images_by_id(tenant_id=self._tenant_id, image_ids=self._ids)
        return self._rows.get(image_id)

    def __getitem__(self, image_id: str) -> tuple[str, str]:
        if image_id not in self._loaded:
            self._loaded[image_id] = self._load(image_id)
        value = self._loaded[image_id]
        if value is None:
            raise KeyError(image_id)
        return value

    def _load(self, image_id: str) -> tuple[str, str] | None:
        row = self._row(image_id) if image_id in self._ids else None
        if row is None:
            self._on_missing(image_id, "no such image in this tenant")
            return None
        try:
            data = image_bytes(row)
        except ImageBytesUnavailable as exc:
            self._on_missing(image_id, exc.code)
            return None
        source = row.duplicate_of or row
        return source.media_type, base64.b64encode(data).decode("ascii")

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def reads(self) -> int:
        return sum(1 for value in self._loaded.values() if value is not None)


def attach_images(state: ContextState) -> None:
    """Give the history messages that carry images the loader for their bytes (called at the end of the
    pipeline's history load)."""
    with_images = [m for m in state.layout.history if any(True for _ in iter_image_parts(m.parts))]
    if not with_images:
        return
    ids = {p["image_id"] for m in with_images for p in iter_image_parts(m.parts) if "image_id" in p}

    def on_missing(image_id: str, reason: str) -> None:
        state.degrade("render", "image_unavailable", f"{image_id}: {reason}; rendered as text.")

    loader = ImageLoader(tenant_id=state.conversation.tenant_id, image_ids=ids, on_missing=on_missing)
    carriers = {id(m) for m in with_images}
    state.layout.history = [
        dataclasses.replace(m, images=loader) if id(m) in carriers else m for m in state.layout.history
    ]
