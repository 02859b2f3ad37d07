"""The owner's and the outsider's worlds (tests/security/worlds.py)."""

import pytest

from tests.security.worlds import OUTSIDER_MARK, OWNER_MARK, World, world_build


@pytest.fixture
def worlds(owner, outsider) -> tuple[World, World]:
    return (
        world_build(owner, mark=OWNER_MARK, user="alice", seed=1),
        world_build(outsider, mark=OUTSIDER_MARK, user="mallory", seed=2),
    )
