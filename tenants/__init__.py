"""Tenants, their end users, API keys and admin memberships, and the tenant-scoping every app uses."""
