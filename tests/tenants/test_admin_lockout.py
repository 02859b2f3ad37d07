"""Admin logins are rate limited (django-axes): a username+address pair is locked out after
MNEMO_ADMIN_LOGIN_FAILURE_LIMIT failures, the right password included, until the cool-off ends or someone
lifts it in the admin. Another address, and the API's key authentication, are not affected."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessLog
from django.test import Client
from django.urls import reverse

from tenants.models import Membership
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

ATTACKER = "203.0.113.7"
ELSEWHERE = "198.51.100.20"


def admin_login(client, username, password, ip):
    return client.post(
        reverse("admin:login"),
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=ip,
    )


def logged_in(client):
    return "_auth_user_id" in client.session


def lock_out(username, ip=ATTACKER, tries=30):
    return [admin_login(Client(), username, "wrong password", ip).status_code for _ in range(tries)]


def test_thirty_wrong_passwords_lock_the_username_out_from_that_address(settings, member):
    settings.AXES_FAILURE_LIMIT = 5
    statuses = lock_out(member.user.username)
    # The first four are answered with the login form again; the fifth failure locks the pair out.
    assert statuses[:4] == [200] * 4
    assert statuses[4:] == [429] * 26

    client = Client()
    response = admin_login(client, member.user.username, "pw", ATTACKER)
    assert response.status_code == 429
    assert not logged_in(client)

    # Another address is not locked out, and the same address may still try another username.
    client = Client()
    assert admin_login(client, member.user.username, "pw", ELSEWHERE).status_code == 302
    assert logged_in(client)
    other = UserFactory()
    client = Client()
    assert admin_login(client, other.username, "pw", ATTACKER).status_code == 302


def test_the_api_key_works_from_a_locked_out_address(settings, owner, member, conversation):
    settings.AXES_FAILURE_LIMIT = 5
    lock_out(member.user.username, tries=6)
    response = owner.client.get(f"/api/v1/conversations/{conversation.id}", REMOTE_ADDR=ATTACKER)
    assert response.status_code == 200


def test_the_lockout_ends_after_the_cool_off(settings, member):
    settings.AXES_FAILURE_LIMIT = 5
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    lock_out(member.user.username, tries=5)
    assert admin_login(Client(), member.user.username, "pw", ATTACKER).status_code == 429
    # The last failure was 16 minutes ago.
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16)
    )
    assert admin_login(Client(), member.user.username, "pw", ATTACKER).status_code == 302


def test_a_superuser_lifts_the_lockout_in_the_admin(settings, client, admin_user, member):
    settings.AXES_FAILURE_LIMIT = 5
    lock_out(member.user.username)
    attempt = AccessAttempt.objects.get(username=member.user.username)

    client.force_login(admin_user)
    changelist = reverse("admin:axes_accessattempt_changelist")
    page = client.get(changelist)
    assert page.status_code == 200
    assert list(page.context["cl"].result_list) == [attempt]
    response = client.post(changelist, {"action": "lift_lockout", "_selected_action": [attempt.pk]})
    assert response.status_code == 302
    assert not AccessAttempt.objects.exists()

    user_client = Client()
    assert admin_login(user_client, member.user.username, "pw", ATTACKER).status_code == 302
    assert logged_in(user_client)
    # Successful logins are logged, for superusers to read.
    assert AccessLog.objects.filter(username=member.user.username, ip_address=ATTACKER).exists()
    assert client.get(reverse("admin:axes_accesslog_changelist")).status_code == 200


def test_an_operator_lifts_lockouts_of_its_own_tenants_members_only(
    settings, client, owner, member, outsider
):
    settings.AXES_FAILURE_LIMIT = 5
    colleague = MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)
    outsider_operator = MembershipFactory(tenant=outsider.tenant)
    # Also an operator of another tenant: lifting its lockout would let guessing go on against that tenant.
    shared = MembershipFactory(tenant=owner.tenant)
    MembershipFactory(tenant=TenantFactory(), user=shared.user)
    superuser = UserFactory(is_superuser=True)
    MembershipFactory(tenant=owner.tenant, user=superuser)
    for user in (colleague.user, outsider_operator.user, shared.user, superuser):
        lock_out(user.username, tries=5)
    lock_out("nobody-such", tries=5)

    client.force_login(member.user)
    changelist = reverse("admin:axes_accessattempt_changelist")
    page = client.get(changelist)
    assert page.status_code == 200
    assert [a.username for a in page.context["cl"].result_list] == [colleague.user.username]
    hidden = AccessAttempt.objects.get(username=shared.user.username)
    assert client.get(reverse("admin:axes_accessattempt_change", args=[hidden.pk])).status_code == 302
    # Selecting a hidden row does nothing: the action only sees the operator's queryset.
    visible = AccessAttempt.objects.get(username=colleague.user.username)
    client.post(changelist, {"action": "lift_lockout", "_selected_action": [visible.pk, hidden.pk]})
    assert set(AccessAttempt.objects.values_list("username", flat=True)) == {
        outsider_operator.user.username,
        shared.user.username,
        superuser.username,
        "nobody-such",
    }
    assert admin_login(Client(), colleague.user.username, "pw", ATTACKER).status_code == 302
    # The log of every admin login is for superusers.
    assert client.get(reverse("admin:axes_accesslog_changelist")).status_code == 403


def test_support_staff_and_staff_without_a_tenant_see_no_lockouts(client, owner):
    support = MembershipFactory(tenant=owner.tenant, role=Membership.Role.SUPPORT)
    for user in (support.user, UserFactory()):
        client.force_login(user)
        assert client.get(reverse("admin:axes_accessattempt_changelist")).status_code == 403
        assert client.get(reverse("admin:axes_accesslog_changelist")).status_code == 403
