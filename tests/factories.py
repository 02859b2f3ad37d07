"""factory-boy factories for the test cast and the objects tests write."""

from typing import Any

import factory
from django.contrib.auth import get_user_model

from cold_storage.models import ArchivedImage
from conversations.models import Conversation, Message, Turn
from tenants.models import EndUser, Membership, Tenant


def _same_tenant(tenant: Tenant, *owners: Any) -> None:
    """A row and the rows it belongs to share one tenant: a factory cannot build what the API never could."""
    for owner in owners:
        if owner is not None and owner.tenant_id != tenant.pk:
            raise ValueError(f"{owner!r} belongs to another tenant than {tenant!r}")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class EndUserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EndUser

    tenant = factory.SubFactory(TenantFactory)
    external_id = factory.Sequence(lambda n: f"user-{n}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"staff{n}")
    is_staff = True
    password = factory.django.Password("pw")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Membership.Role.OPERATOR


class ConversationFactory(factory.django.DjangoModelFactory):
    """A conversation of its end user's tenant (a new tenant when it has none)."""

    class Meta:
        model = Conversation

    end_user = None
    tenant = factory.Maybe(
        "end_user",
        yes_declaration=factory.SelfAttribute("end_user.tenant"),
        no_declaration=factory.SubFactory(TenantFactory),
    )
    model = "gpt-4o"
    title = factory.Sequence(lambda n: f"Conversation {n}")

    @classmethod
    def _create(cls, model_class: type[Conversation], *args: Any, **kwargs: Any) -> Conversation:
        _same_tenant(kwargs["tenant"], kwargs.get("end_user"))
        return super()._create(model_class, *args, **kwargs)


class TurnFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Turn

    conversation = factory.SubFactory(ConversationFactory)
    index = factory.Sequence(lambda n: n + 1)


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Message

    conversation = factory.SubFactory(ConversationFactory)
    seq = factory.Sequence(lambda n: n + 1)
    role = Message.Role.USER
    content = factory.Faker("sentence")


class ArchivedImageFactory(factory.django.DjangoModelFactory):
    """An image row without bytes: enough for a part that names it (tests/cold_storage stores real ones)."""

    class Meta:
        model = ArchivedImage

    class Params:
        conversation = None  # the image's conversation: its id and its tenant

    tenant = factory.Maybe(
        "conversation",
        yes_declaration=factory.SelfAttribute("conversation.tenant"),
        no_declaration=factory.SubFactory(TenantFactory),
    )
    conversation_id = factory.Maybe(
        "conversation",
        yes_declaration=factory.SelfAttribute("conversation.pk"),
        no_declaration=factory.Faker("uuid4", cast_to=None),
    )
    sha256 = factory.Sequence(lambda n: f"{n:064x}")
    phash = dhash = ahash = "0" * 16
    width, height = 1920, 1080
    format = "PNG"
    media_type = "image/png"
    size = 1
