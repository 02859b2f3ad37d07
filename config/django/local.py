"""Developer machine: the base settings as they are."""

from config.django.base import *  # noqa: F403
