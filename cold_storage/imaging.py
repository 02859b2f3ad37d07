"""Decoding, validation and hashing of image bytes, with no database: what intake does before anything is
stored. A bad image raises ImageRejected with a stable code; nothing else is raised for bad input."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass

import imagehash
from PIL import Image, UnidentifiedImageError

HASH_ALGORITHMS = ("phash", "dhash", "ahash")
# Hashes are taken on the frame shrunk by this factor (box filter): a 1920×1080 screenshot becomes 240×135,
# which is still far above the 32×32 the hashes read, so they stay the same (bench/visual.py measures it)
# at a fraction of the cost.
HASH_REDUCE = 8
# A 64-bit perceptual hash reads the layout of a frame, not its text: on screenshots, typing, a hover or even
# another page of the same app barely move it. So a duplicate must also match a 32×32 grid of mean
# brightness (1 KB) within a few levels per cell, which small local changes do move and identical screens do
# not (bench/visual.py measures both).
GRID = 32

MEDIA_TYPES = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}


class ImageRejected(Exception):
    def __init__(self, message: str, *, code: str, extra: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.extra = extra or {}


@dataclass(frozen=True)
class DecodedImage:
    data: bytes
    format: str  # Pillow's name: PNG, JPEG, WEBP
    media_type: str
    width: int
    height: int
    sha256: str
    phash: str
    dhash: str
    ahash: str
    grid: bytes = b""

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def extension(self) -> str:
        return EXTENSIONS.get(self.format, "bin")

    def hash(self, algorithm: str) -> str:
        return getattr(self, algorithm)


def b64decode(text: str) -> bytes:
    """Standard base64 (a data: URL prefix is allowed); anything malformed is rejected, not skipped."""
    if text.startswith("data:"):
        _, _, text = text.partition(",")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected(
            "data is not valid base64.", code="invalid_image", extra={"reason": "base64"}
        ) from None


def hamming(a: str, b: str) -> int:
    return (int(a, 16) ^ int(b, 16)).bit_count()


def grid_distance(a: bytes, b: bytes) -> int:
    """The largest brightness difference between two grids' cells (256 when they cannot be compared)."""
    if len(a) != len(b) or not a:
        return 256
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def hash_frame(image: Image.Image, *, reduce: int = HASH_REDUCE) -> tuple[str, str, str, bytes]:
    """(phash, dhash, ahash) as 16 hex digits each, and the brightness grid, taken on the frame shrunk by
    ``reduce``."""
    if image.mode not in ("L", "RGB", "RGBA", "LA"):
        image = image.convert("RGBA" if "A" in image.mode or "transparency" in image.info else "RGB")
    small = image
    if reduce > 1 and min(image.size) >= reduce * 32:
        small = image.reduce(reduce)
    gray = small.convert("L")
    grid = gray.resize((GRID, GRID), Image.Resampling.BOX).tobytes()
    return (str(imagehash.phash(gray)), str(imagehash.dhash(gray)), str(imagehash.average_hash(gray)), grid)


def decode(
    data: bytes,
    *,
    allowed_formats: tuple[str, ...],
    max_pixels: int,
    max_bytes: int,
    declared_media_type: str | None = None,
) -> DecodedImage:
    """Validate ``data`` as an image Mnemo stores and hash it. Checks, in order: size in bytes, that Pillow
    recognises it, an allowed format, the declared media type, one frame, the pixel limit (read from the
    header, before any pixel is decoded: a decompression bomb is refused without being expanded), then a
    full decode (a truncated file fails here)."""
    _check_bytes(data, max_bytes=max_bytes)
    with _open(data) as image:
        fmt, media_type = _check_format(
            image, allowed_formats=allowed_formats, declared_media_type=declared_media_type
        )
        width, height = _check_pixels(image, max_pixels=max_pixels)
        _load(image)
        phash, dhash, ahash, grid = hash_frame(image)
    return DecodedImage(
        data=data,
        format=fmt,
        media_type=media_type,
        width=width,
        height=height,
        sha256=hashlib.sha256(data).hexdigest(),
        phash=phash,
        dhash=dhash,
        ahash=ahash,
        grid=grid,
    )


def _check_bytes(data: bytes, *, max_bytes: int) -> None:
    if not data:
        raise ImageRejected("The image is empty.", code="invalid_image", extra={"reason": "empty"})
    if len(data) > max_bytes:
        raise ImageRejected(
            f"The image is {len(data)} bytes; the limit is {max_bytes}.",
            code="image_too_large",
            extra={"size_bytes": len(data), "limit_bytes": max_bytes},
        )


def _open(data: bytes) -> Image.Image:
    """The image with its header read and no pixel decoded."""
    # Pillow's own bomb guard (a warning past 89 Mpx, an error past twice that) stays as it is: warnings
    # filters are process-global and this runs on many threads; the explicit check in _check_pixels is the
    # limit.
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise ImageRejected(
            "The image has more pixels than allowed.", code="image_too_large", extra={"reason": "pixels"}
        ) from None
    except UnidentifiedImageError:
        raise ImageRejected(
            "The data is not an image this server can read.",
            code="invalid_image",
            extra={"reason": "unknown"},
        ) from None
    except (OSError, SyntaxError, ValueError):
        raise ImageRejected(
            "The image header is damaged.", code="invalid_image", extra={"reason": "damaged"}
        ) from None


def _check_format(
    image: Image.Image, *, allowed_formats: tuple[str, ...], declared_media_type: str | None
) -> tuple[str, str]:
    """(format, media type) of an allowed format that matches the declared media type, if any."""
    fmt = (image.format or "").upper()
    if fmt not in allowed_formats:
        raise ImageRejected(
            f"{fmt or 'This'} images are not accepted; send one of {', '.join(allowed_formats)}.",
            code="image_format_not_allowed",
            extra={"format": fmt, "allowed": list(allowed_formats)},
        )
    media_type = MEDIA_TYPES.get(fmt, "application/octet-stream")
    declared = (declared_media_type or "").lower().replace("image/jpg", "image/jpeg")
    if declared and declared != media_type:
        raise ImageRejected(
            f"media_type says {declared_media_type} but the data is {media_type}.",
            code="invalid_image",
            extra={"reason": "media_type_mismatch", "detected": media_type},
        )
    return fmt, media_type


def _check_pixels(image: Image.Image, *, max_pixels: int) -> tuple[int, int]:
    """(width, height) of a still image within the pixel limit, read from the header."""
    if getattr(image, "n_frames", 1) > 1:
        raise ImageRejected(
            "Animated images are not accepted.", code="invalid_image", extra={"reason": "animated"}
        )
    width, height = image.size
    if width <= 0 or height <= 0 or width * height > max_pixels:
        raise ImageRejected(
            f"The image is {width}×{height} = {width * height} pixels; the limit is {max_pixels}.",
            code="image_too_large",
            extra={"width": width, "height": height, "limit_pixels": max_pixels},
        )
    return width, height


def _load(image: Image.Image) -> None:
    """Decodes every pixel: a truncated or corrupt file fails here."""
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise ImageRejected(
            "The image is truncated or corrupt.", code="invalid_image", extra={"reason": "truncated"}
        ) from None


def thumbnail_png(data: bytes, *, size: int = 160) -> bytes:
    """A small PNG for the admin."""
    with Image.open(io.BytesIO(data)) as image:
        image.thumbnail((size, size))
        out = io.BytesIO()
        image.convert("RGB").save(out, "PNG")
        return out.getvalue()
