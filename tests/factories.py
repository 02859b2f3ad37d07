"""factory-boy factories for the test cast and the objects tests write."""

import factory
from django.contrib.auth import get_user_model

from cold_storage.models import ArchivedImage
from conversations.models import Conversation, Message, Turn
from tenants.models import EndUser, Membership, Tenant


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
    class Meta:
        model = Conversation

    tenant = factory.SubFactory(TenantFactory)
    model = "gpt-4o"
    title = factory.Sequence(lambda n: f"Conversation {n}")


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

    tenant = factory.SubFactory(TenantFactory)
    conversation_id = factory.Faker("uuid4", cast_to=None)
    sha256 = factory.Sequence(lambda n: f"{n:064x}")
    phash = dhash = ahash = "0" * 16
    width, height = 1920, 1080
    format = "PNG"
    media_type = "image/png"
    size = 1
