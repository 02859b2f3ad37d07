"""Images made on the spot for the visual-memory tests: small UI-like frames, and bad files of every kind."""

import base64
import io
import random
import zlib

from PIL import Image, ImageDraw


def frame(seed: int, *, size: tuple[int, int] = (320, 200), fmt: str = "PNG", marker: str = "") -> bytes:
    """A UI-like frame: a title bar and random panels. Different seeds give frames far apart in every hash;
    the same seed gives the same bytes; ``marker`` adds a little text (a near-duplicate)."""
    rng = random.Random(seed)
    image = Image.new("RGB", size, (rng.randrange(200, 255),) * 3)
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, size[0], 16], fill=(40, 40, 60))
    for _ in range(6):
        x0, y0 = rng.randrange(size[0] - 40), rng.randrange(20, size[1] - 30)
        color = tuple(rng.randrange(256) for _ in range(3))
        draw.rectangle([x0, y0, x0 + rng.randrange(20, 160), y0 + rng.randrange(10, 90)], fill=color)
    if marker:
        draw.text((size[0] - 60, size[1] - 14), marker, fill=(0, 0, 0))
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_part(data: bytes, **extra: object) -> dict:
    return {"type": "image", "data": b64(data), "media_type": "image/png", **extra}


def truncated_png() -> bytes:
    data = frame(1)
    return data[: len(data) // 2]


def bomb_png(width: int = 20_000, height: int = 20_000) -> bytes:
    """A tiny PNG whose header claims width×height pixels (a decompression bomb)."""
    raw = b"".join(b"\x00" + b"\x00" * ((width + 7) // 8) for _ in range(16))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (255, 0, 0)).save(out, "GIF")
    return out.getvalue()


def bmp() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 255, 0)).save(out, "BMP")
    return out.getvalue()
