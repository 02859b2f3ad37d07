"""Reads: agent profiles inside a tenant."""

from context.models import AgentProfile
from tenants.models import Tenant
from tenants.scoping import access_object


def access_agent_profile(*, tenant: Tenant, profile_id: object) -> AgentProfile:
    return access_object(AgentProfile.objects.all(), pk=profile_id, tenant=tenant)
