"""The admin cast on top of tests/conftest.py: a support member of the owner tenant, and a user who operates
the owner tenant but only supports the outsider tenant."""

import pytest

from tenants.models import Membership
from tests.factories import MembershipFactory


@pytest.fixture
def support(owner) -> Membership:
    return MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)


@pytest.fixture
def operator_and_support(owner, outsider) -> Membership:
    """Operator of the owner tenant, support of the outsider tenant: one changelist shows both."""
    membership = MembershipFactory(tenant=owner.tenant, role=Membership.Role.OPERATOR)
    MembershipFactory(user=membership.user, tenant=outsider.tenant, role=Membership.Role.SUPPORT)
    return membership


def action_names(page) -> set[str]:
    """The actions a changelist offers (empty when it offers none)."""
    form = page.context.get("action_form")
    return {name for name, _label in form.fields["action"].choices if name} if form else set()
