"""REST endpoints for stored images: the bytes (from whichever tier holds them, sha256-checked) and pins.
Every image is fetched through the caller's tenant."""

from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from cold_storage import services
from cold_storage.models import ArchivedImage
from cold_storage.selectors import access_image, image_bytes
from tenants.api import (
    ERROR_SCHEMA,
    StrictBooleanField,
    StrictSerializer,
    error_responses,
    optional_body,
    validated,
)


class ImageOutputSerializer(serializers.ModelSerializer):
    duplicate_of = serializers.CharField(source="duplicate_of_id", allow_null=True, read_only=True)
    conversation_id = serializers.UUIDField(read_only=True)
    turn_id = serializers.UUIDField(read_only=True, allow_null=True)
    message_id = serializers.UUIDField(read_only=True, allow_null=True)

    class Meta:
        model = ArchivedImage
        fields = [
            "id",
            "conversation_id",
            "turn_id",
            "message_id",
            "media_type",
            "width",
            "height",
            "size",
            "sha256",
            "phash",
            "dhash",
            "ahash",
            "tier",
            "role",
            "duplicate_of",
            "hamming_distance",
            "pinned",
            "compacted_at",
            "purged_at",
            "created_at",
        ]
        read_only_fields = fields


_GONE = {410: OpenApiResponse(ERROR_SCHEMA, description="Its bytes were deleted by retention (image_purged)")}


class ImageDetailApi(APIView):
    @extend_schema(
        responses={(200, "image/*"): OpenApiTypes.BINARY, **error_responses(_GONE)},
        description="The image's bytes as received, from the hot or the cold tier, checked against their "
        "sha256 (a duplicate answers with the bytes of the image it repeats). Headers name the sha256, the "
        "tier and the role. Use it to expand a [Visual_Placeholder: img_…].",
    )
    def get(self, request: Any, image_id: str) -> HttpResponse:
        image = access_image(tenant=request.auth.tenant, image_id=image_id)
        data = image_bytes(image)
        services.image_touch(image=image)
        source = image.duplicate_of or image
        response = HttpResponse(data, content_type=source.media_type)
        response["ETag"] = f'"{source.sha256}"'
        response["Cache-Control"] = "private, max-age=31536000, immutable"
        response["X-Image-Sha256"] = source.sha256
        response["X-Image-Tier"] = source.tier
        response["X-Image-Role"] = image.role
        if image.duplicate_of_id:
            response["X-Image-Duplicate-Of"] = image.duplicate_of_id
        return response


class ImagePinInputSerializer(StrictSerializer):
    pinned = StrictBooleanField(required=False, default=True)


class ImagePinApi(APIView):
    @extend_schema(
        request=ImagePinInputSerializer,
        responses={200: ImageOutputSerializer, **error_responses()},
        description='Pin an image (or unpin with {"pinned": false}): retention never deletes a pinned '
        "image's bytes. Pinning a duplicate pins the image whose bytes it shows.",
    )
    def post(self, request: Any, image_id: str) -> Response:
        image = access_image(tenant=request.auth.tenant, image_id=image_id)
        data = validated(ImagePinInputSerializer, optional_body(request))
        image = services.image_pin(image=image, pinned=data["pinned"])
        return Response(ImageOutputSerializer(image).data)
