import pytest

pytestmark = pytest.mark.django_db


def test_cast_is_isolated(owner, outsider, conversation, outsider_conversation):
    assert owner.client.get(f"/api/v1/conversations/{conversation.id}").status_code == 200
    response = outsider.client.get(f"/api/v1/conversations/{conversation.id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
