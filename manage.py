#!/usr/bin/env python
import os
import sys


def main() -> None:
    # Development settings: the servers' entry points (config/asgi.py, wsgi.py, celery.py) default to
    # production, management commands (and `make run`, which names them too) to the developer's machine.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.local")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
