from django.urls import path

from cold_storage import apis

urlpatterns = [
    path("images/<str:image_id>", apis.ImageDetailApi.as_view(), name="image-detail"),
    path("images/<str:image_id>/pin", apis.ImagePinApi.as_view(), name="image-pin"),
]
