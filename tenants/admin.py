import json
from typing import TYPE_CHECKING, Any, cast

from axes.admin import AccessAttemptAdmin, AccessLogAdmin
from axes.models import AccessAttempt, AccessLog
from axes.utils import reset as axes_reset
from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.forms.models import ModelFormMetaclass
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from tenants.admin_scoping import TenantScopedAdmin, member_tenant_ids
from tenants.models import ApiKey, EndUser, Membership, Tenant
from tenants.services import api_key_create, api_key_revoke
from tenants.settings_schema import (
    BOOL,
    CHOICE,
    INT,
    LIST,
    MAX_TEXT,
    MAX_URL,
    SCHEMA,
    SECRET,
    SETTINGS,
    URL,
    Setting,
    SettingsInvalid,
    settings_read,
    settings_validate,
)

if TYPE_CHECKING:  # the stubs' type of a fieldset's options (django-stubs is a development dependency)
    from django_stubs_ext import FieldOpts

# The site's names: the title bar, the page titles and the index say Mnemo, not Django.
admin.site.site_header = "Mnemo administration"
admin.site.site_title = "Mnemo admin"
admin.site.index_title = "Tenants, conversations and memory"

# --- Tenant settings: one typed field per known setting (tenants/settings_schema.py) ---------------------
# A blank field means "not set" (the server default applies). A nullable number turns its feature off at -1.
OFF = -1


def settings_form_field(setting: Setting) -> forms.Field:
    if setting.kind == INT:
        low = OFF if setting.nullable else setting.minimum
        return forms.IntegerField(required=False, min_value=low, max_value=setting.maximum)
    if setting.kind == BOOL:
        choices = [("", "Default"), ("true", "Yes"), ("false", "No")]
        return forms.NullBooleanField(required=False, widget=forms.Select(choices=choices))
    if setting.kind == CHOICE:
        return forms.ChoiceField(
            required=False, choices=[("", "Default"), *((c, c) for c in setting.choices)]
        )
    if setting.kind == URL:
        return forms.URLField(required=False, max_length=MAX_URL, assume_scheme="https")
    if setting.kind == SECRET:
        return forms.CharField(
            required=False, max_length=MAX_TEXT, widget=forms.PasswordInput(render_value=True)
        )
    if setting.kind == LIST:
        return forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    return forms.CharField(required=False, max_length=MAX_TEXT)


def _to_form(setting: Setting, value: Any) -> Any:
    if setting.kind == LIST and isinstance(value, list):
        return "\n".join(str(item) for item in value)
    if setting.kind == INT and setting.nullable and value is None:
        return OFF
    return value


def _from_form(setting: Setting, value: Any) -> Any:
    """The value to store, or None for a blank field (the setting is left unset)."""
    if value is None or value == "":
        return None
    if setting.kind == LIST:
        return [line.strip() for line in value.splitlines() if line.strip()] or None
    return value


class TenantFormBase(forms.ModelForm):
    """Slug and name, and the settings as typed fields (added per setting below): unknown keys cannot be
    entered, and a stored one is dropped when the form is saved."""

    class Meta:
        model = Tenant
        fields = ["slug", "name"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored = self.instance.settings if isinstance(self.instance.settings, dict) else {}
        for setting in SCHEMA:
            field = self.fields.get(setting.key)
            if field is None:  # read-only for this user
                continue
            off = " -1 turns it off." if setting.nullable else ""
            field.help_text = f"{setting.help}{off} Blank: the server default ({setting.default()!r})."
            if setting.key in stored:
                field.initial = _to_form(setting, stored[setting.key])

    def clean(self) -> dict[str, Any]:
        super().clean()  # ModelForm's returns cleaned_data (the stubs allow a form's clean to return None)
        data = self.cleaned_data
        values: dict[str, Any] = {}
        for setting in SCHEMA:
            if setting.key not in self.fields or setting.key in self.errors:
                continue
            value = _from_form(setting, data.get(setting.key))
            if setting.kind == INT and setting.nullable and value == OFF:
                values[setting.key] = None
            elif value is not None:
                values[setting.key] = value
        try:
            self.settings = settings_validate(values)
        except SettingsInvalid as exc:
            for key, message in exc.errors.items():
                self.add_error(key if key in self.fields else None, f"{key} {message}")
        return data

    def save(self, commit: bool = True) -> Tenant:
        self.instance.settings = self.settings
        return super().save(commit=commit)


# The form's metaclass collects declared fields, so the settings' fields are built into a subclass at import
# (the admin builds its form from the fieldsets' names, which must be declared fields).
TenantAdminForm = cast(
    "type[TenantFormBase]",
    ModelFormMetaclass("TenantAdminForm", (TenantFormBase,), {s.key: settings_form_field(s) for s in SCHEMA}),
)


def _settings_fieldsets() -> list[tuple[str, "FieldOpts"]]:
    groups: dict[str, list[str]] = {}
    for setting in SCHEMA:
        groups.setdefault(setting.group, []).append(setting.key)
    return [(f"Settings: {group}", {"fields": tuple(keys)}) for group, keys in groups.items()]


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    tenant_lookup = ""
    form = TenantAdminForm
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["id", "created_at", "stored_settings"]
    fieldsets = [
        (None, {"fields": ["id", "slug", "name", "created_at", "stored_settings"]}),
        *_settings_fieldsets(),
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Operators tune their tenant's settings; renaming the slug is for superusers.
        if request.user.is_superuser:
            return self.readonly_fields
        return [*self.readonly_fields, "slug"]

    @admin.display(description="Stored settings")
    def stored_settings(self, obj: Tenant) -> str:
        """The settings as stored, with what the service ignores or replaces by a default: a bad value from
        before the schema (or written around it) is shown here until the form is saved."""
        stored = obj.settings if obj is not None and obj.pk else {}
        _, problems = settings_read(stored)
        unknown = sorted(str(k) for k in stored if k not in SETTINGS) if isinstance(stored, dict) else []
        if unknown:
            problems.append(f"Unknown settings, ignored and dropped on save: {', '.join(unknown)}.")
        if isinstance(stored, dict):  # support staff see this page too: keys are not shown
            secret = {s.key for s in SCHEMA if s.kind == SECRET}
            stored = {k: "••••" if k in secret and v else v for k, v in stored.items()}
        return format_html(
            '<pre style="white-space: pre-wrap">{}</pre>{}',
            json.dumps(stored, indent=2, ensure_ascii=False, sort_keys=True),
            format_html_join("", '<p class="errornote">{}</p>', ((p,) for p in problems)),
        )


@admin.register(EndUser)
class EndUserAdmin(TenantScopedAdmin):
    list_display = ["external_id", "tenant", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["external_id"]
    list_select_related = ["tenant"]
    readonly_fields = ["tenant", "external_id", "created_at"]


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = ["__str__", "tenant", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]
    add_roles = TenantScopedAdmin.change_roles

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # A new key goes through the service so it is generated and hashed the one way; the raw key is
        # shown once, here, and never again.
        key, raw_key = api_key_create(tenant=obj.tenant, name=obj.name)
        obj.pk = key.pk
        obj.__dict__.update({f.attname: getattr(key, f.attname) for f in ApiKey._meta.concrete_fields})
        messages.warning(request, f"New API key (shown once, copy it now): {raw_key}")

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Operators revoke keys; support reads. The action is not offered to a user without the role.
        return request.user.is_superuser or self._allowed(request, self.change_roles)

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        keys = list(self.scoped_for(request, queryset, self.change_roles))
        for key in keys:
            api_key_revoke(api_key=key)
        messages.success(request, f"Revoked {len(keys)} key(s).")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    # Who may administer which tenant is decided by superusers only (default Django permissions).
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user"]


# --- Admin login lockouts (django-axes) ---------------------------------------------------------------------
# Attempts and logins name admin users of every tenant, with their addresses: superusers see them all. An
# operator sees, and may lift, only the lockouts of usernames that belong to its tenants alone: not
# superusers, and not someone who also administers a tenant the operator does not, since lifting a lockout
# lets the guessing go on.


def lockout_usernames(request: HttpRequest) -> set[str]:
    """Usernames whose login attempts the request's (non-superuser) user may see and reset (memoised)."""
    cache = getattr(request, "_mnemo_lockout_usernames", None)
    if cache is None:
        cache = set()
        tenant_ids = member_tenant_ids(request, (Membership.Role.OPERATOR,))
        if tenant_ids and request.user.is_active and request.user.is_staff:
            user_model = get_user_model()
            elsewhere = Membership.objects.exclude(tenant_id__in=tenant_ids).values("user_id")
            cache = set(
                user_model._default_manager.filter(memberships__tenant_id__in=tenant_ids, is_superuser=False)
                .exclude(pk__in=elsewhere)
                .values_list(user_model.USERNAME_FIELD, flat=True)
            )
        request._mnemo_lockout_usernames = cache  # type: ignore[attr-defined]
    return cache


class LoginAttemptAdmin(AccessAttemptAdmin):
    actions = ["lift_lockout", "cleanup_expired_attempts"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(username__in=lockout_usernames(request))

    def _operator_allowed(self, request: HttpRequest, obj: Any = None) -> bool:
        usernames = lockout_usernames(request)
        return bool(usernames) if obj is None else obj.username in usernames

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser or self._operator_allowed(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser or self._operator_allowed(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # every field is read-only; lifting is deleting

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser or self._operator_allowed(request, obj)

    def has_cleanup_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser  # it cleans every tenant's expired attempts

    @admin.action(description="Clean up expired attempts", permissions=["cleanup"])
    def cleanup_expired_attempts(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        super().cleanup_expired_attempts(request, queryset)

    @admin.action(
        description="Lift the lockout of the selected usernames and addresses", permissions=("delete",)
    )
    def lift_lockout(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        pairs = set(queryset.values_list("username", "ip_address"))
        for username, ip_address in pairs:
            # axes' own reset, so it also clears what another handler (a cache) would keep.
            axes_reset(username=username, ip=ip_address)
        messages.success(request, f"Lifted {len(pairs)} lockout(s).")


class LoginLogAdmin(AccessLogAdmin):
    """Successful admin logins and logouts: superusers only."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser


admin.site.register(AccessAttempt, LoginAttemptAdmin)
admin.site.register(AccessLog, LoginLogAdmin)
