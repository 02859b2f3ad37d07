"""Image ids no image can have (longer than the column, a NUL) are a 404 in the error shape without a
query: PostgreSQL refused the NUL with an error (500), so the test is marked postgres; the 5,000-character
id was already a 404 and is kept as a guard. An outsider gets the same 404."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.postgres
@pytest.mark.parametrize("image_id", ["img_" + "a" * 5000, "img_ab%00cdef"], ids=["5000-chars", "nul"])
@pytest.mark.parametrize("suffix", ["", "/pin"])
def test_an_impossible_image_id_is_a_404(owner, outsider, image_id, suffix):
    for actor in (owner, outsider):
        client = actor.client
        response = (
            client.post(f"/api/v1/images/{image_id}{suffix}")
            if suffix
            else client.get(f"/api/v1/images/{image_id}")
        )
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
