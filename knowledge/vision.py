"""Image descriptions: a vision-capable model describes each stored image once (per tenant and sha256, in the
background), and the attachment decay stage shows the description instead of the pixels. Without such a
model the description is made offline from what the row knows (id, format, size and role), and whoever
shows it says so (vision_status)."""

import base64
import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction

from cold_storage.models import ArchivedImage
from cold_storage.selectors import ImageBytesUnavailable, image_bytes
from knowledge.models import ImageDescription
from providers.llm import LLMConfig, LLMError, chat, llm_config
from tenants.llm_budget import llm_budget_fallback_record, llm_budget_left, llm_usage_record
from tenants.models import Tenant
from tenants.settings_schema import settings_usable

logger = logging.getLogger(__name__)

# "auto": describe when the configured model is known to read images; "on": the endpoint reads images
# whatever its model is called (a local llava, a gateway alias); "off": never. The tenant's settings key
# `image_descriptions` wins over MNEMO_IMAGE_DESCRIPTIONS; `vision_model` (MNEMO_VISION_MODEL) names another
# model of the same endpoint for this work.
MODES = ("auto", "on", "off")
BUDGET_PURPOSE = "image_description"
MAX_DESCRIPTION_TOKENS = 300
# After a failed call the same image is not tried again for this long (the decay stage re-queues images that
# still lack a description, so a broken endpoint would otherwise be called on every context request).
RETRY_AFTER_SECONDS = 600
LOCK_SECONDS = 120

# Model names (after any vendor/ path, lower case) that read images: a prefix, or a word inside the name.
_VISION_PREFIXES = (
    "gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-4-turbo", "gpt-5", "o1", "o3", "o4",
    "claude-3", "claude-sonnet-4", "claude-opus-4", "claude-haiku-4", "claude-4",
    "gemini", "gemma-3", "gemma3", "llava", "bakllava", "pixtral", "moondream", "minicpm-v",
    "qwen-vl", "qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl", "glm-4v", "mistral-small-3",
    "mistral-medium-3", "llama-4", "llama4",
)  # fmt: skip
_VISION_WORDS = ("vision", "-vl", "multimodal")

PROMPT = (
    "Describe this image for someone who cannot see it, in at most 120 words: what it shows, any visible "
    "text (quoted exactly), numbers, names, and any error it displays. Plain text, no preamble."
)


def model_reads_images(model: str) -> bool:
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(_VISION_PREFIXES) or any(word in name for word in _VISION_WORDS)


@dataclass(frozen=True)
class VisionStatus:
    config: LLMConfig | None
    reason: str  # why there is no vision model ("" when there is one)


def _mode(tenant_settings: dict[str, Any]) -> str:
    own = tenant_settings.get("image_descriptions")
    if own in MODES:
        return str(own)
    server = settings.MNEMO_IMAGE_DESCRIPTIONS
    return server if server in MODES else "auto"


def vision_status(tenant: Tenant) -> VisionStatus:
    """The endpoint and model that describe this tenant's images, or why none does. The tenant's settings
    are read as the schema allows (a bad stored value falls back to the server's)."""
    usable = settings_usable(tenant.settings)
    mode = _mode(usable)
    if mode == "off":
        return VisionStatus(None, "image descriptions are turned off (image_descriptions=off)")
    config = llm_config(usable)
    if config is None:
        return VisionStatus(None, "no LLM endpoint is configured")
    model = usable.get("vision_model") or settings.MNEMO_VISION_MODEL
    if isinstance(model, str) and model.strip():
        config = dataclasses.replace(config, model=model.strip()[:100])
    if mode == "auto" and not model_reads_images(config.model):
        return VisionStatus(
            None, f"{config.model} is not known to read images (set image_descriptions=on if it does)"
        )
    return VisionStatus(config, "")


# --- offline descriptions ---------------------------------------------------------------------------------

_ROLE_TEXT: dict[str, str] = {
    ArchivedImage.Role.ANCHOR: "first image of its turn",
    ArchivedImage.Role.RESULT: "last image of its turn",
    ArchivedImage.Role.ERROR: "error frame",
    ArchivedImage.Role.PROCESS: "image",
}


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.0f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def offline_description(image: ArchivedImage) -> str:
    """What can be said without looking: `img_… (PNG, 1280×800 px, 142 KB, error frame)`."""
    role = _ROLE_TEXT.get(image.role, image.role)
    size = human_size(image.size)
    return f"{image.id} ({image.format.upper()}, {image.width}×{image.height} px, {size}, {role})"


def descriptions_by_sha256(*, tenant_id: uuid.UUID, sha256s: set[str]) -> dict[str, ImageDescription]:
    if not sha256s:
        return {}
    rows = ImageDescription.objects.filter(tenant_id=tenant_id, sha256__in=sha256s)
    return {row.sha256: row for row in rows}


# --- describing -------------------------------------------------------------------------------------------


def description_keys(image: ArchivedImage) -> tuple[str, str]:
    base = f"knowledge:describe:{image.tenant_id}:{image.sha256}"
    return f"{base}:lock", f"{base}:failed"


def image_describe(*, image_id: str) -> ImageDescription | None:
    """Describe the image (the original, for a duplicate) with the tenant's vision model, once per sha256.
    None when there is nothing to do or it cannot be done now (no model, budget spent, bytes gone, the call
    failed: logged, and not retried for RETRY_AFTER_SECONDS)."""
    image = ArchivedImage.objects.select_related("duplicate_of", "tenant").filter(pk=image_id).first()
    if image is None:
        return None
    source = image.duplicate_of or image
    existing = ImageDescription.objects.filter(tenant_id=source.tenant_id, sha256=source.sha256).first()
    if existing is not None:
        return existing
    config = vision_status(image.tenant).config
    if config is None or not _budget_allows(image.tenant):
        return None
    lock, failed = description_keys(source)
    if cache.get(failed) is not None or not cache.add(lock, 1, LOCK_SECONDS):
        return None
    try:
        return _describe(source, tenant=image.tenant, config=config, failed_key=failed)
    finally:
        cache.delete(lock)


def _describe(
    image: ArchivedImage, *, tenant: Tenant, config: LLMConfig, failed_key: str
) -> ImageDescription | None:
    try:
        data = image_bytes(image)
    except ImageBytesUnavailable as exc:
        logger.info("image %s not described: %s", image.id, exc.code)
        cache.set(failed_key, exc.code, RETRY_AFTER_SECONDS)
        return None
    url = f"data:{image.media_type};base64,{base64.b64encode(data).decode('ascii')}"
    content = [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": url}}]
    message: dict[str, Any] = {"role": "user", "content": content}
    try:
        reply = chat(config, [message], max_tokens=MAX_DESCRIPTION_TOKENS)
    except LLMError as exc:
        logger.warning("image %s not described by %s: %s", image.id, config.log_label(), exc.code)
        cache.set(failed_key, exc.code, RETRY_AFTER_SECONDS)
        return None
    llm_usage_record(tenant=tenant, reply=reply, purpose=BUDGET_PURPOSE)
    try:
        with transaction.atomic():
            return ImageDescription.objects.create(
                tenant_id=image.tenant_id,
                sha256=image.sha256,
                text=reply.text[:4000],
                model=reply.model[:100],
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
            )
    except IntegrityError:  # described meanwhile by another worker (after its lock expired)
        return ImageDescription.objects.filter(tenant_id=image.tenant_id, sha256=image.sha256).first()


def _budget_allows(tenant: Tenant) -> bool:
    monthly = settings_usable(tenant.settings).get("llm_monthly_token_budget")
    if not isinstance(monthly, int) or isinstance(monthly, bool) or monthly < 0:
        monthly = settings.MNEMO_LLM_MONTHLY_TOKENS
    if llm_budget_left(tenant=tenant, monthly_tokens=monthly) > 0:
        return True
    llm_budget_fallback_record(tenant=tenant, purpose=BUDGET_PURPOSE)
    logger.info("tenant %s: monthly LLM budget spent, images are described offline", tenant.pk)
    return False
