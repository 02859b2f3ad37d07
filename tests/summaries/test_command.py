"""manage.py resummarize: rebuilds outdated and truncated segments (or all with --all), scoped by --tenant and
--conversation, with a progress bar, from raw messages."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from summaries.models import SummarySegment
from summaries.prompts import TEMPLATE_VERSION
from summaries.selectors import segments_live
from summaries.services import compaction_run
from tests.summaries.helpers import history

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("resummarize", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def two_tenants(conversation, outsider_conversation):
    for c in (conversation, outsider_conversation):
        history(c, 20)
        compaction_run(conversation=c, trigger="manual")
    SummarySegment.objects.update(template_version="summary-v0")
    return conversation, outsider_conversation


def test_dry_run_counts_and_changes_nothing(two_tenants):
    out, _ = run("--dry-run")
    assert "2 segment(s) would be rebuilt" in out
    assert SummarySegment.objects.count() == 2


def test_outdated_segments_of_one_tenant_are_rebuilt_with_a_progress_bar(owner, two_tenants):
    mine, theirs = two_tenants
    out, err = run("--tenant", owner.tenant.slug)
    assert "Rebuilt 1 segment(s), skipped 0, failed 0" in out
    assert "resummarize" in err and "1/1" in err  # the progress bar
    (segment,) = segments_live(conversation=mine)
    assert segment.template_version == TEMPLATE_VERSION
    assert segments_live(conversation=theirs)[0].template_version == "summary-v0"
    # Up to date now: a second run has nothing to do.
    out, _ = run("--tenant", owner.tenant.slug, "--no-progress")
    assert "Rebuilt 0 segment(s)" in out


def test_one_conversation_and_all_segments(two_tenants):
    mine, _ = two_tenants
    run("--conversation", str(mine.pk), "--no-progress")
    (current,) = segments_live(conversation=mine)
    out, _ = run("--conversation", str(mine.pk), "--all", "--no-progress")
    assert "Rebuilt 1 segment(s)" in out
    (again,) = segments_live(conversation=mine)
    assert again.pk != current.pk and again.text == current.text  # deterministic offline summary


def test_a_truncation_segment_becomes_a_summary(conversation, monkeypatch):
    history(conversation, 20)
    with monkeypatch.context() as patch:
        patch.setattr(
            "summaries.services.summarise.summarise", lambda *a, **k: (_ for _ in ()).throw(RuntimeError)
        )
        compaction_run(conversation=conversation, trigger="auto")
    assert segments_live(conversation=conversation)[0].source == "truncation"
    run("--no-progress")
    (segment,) = segments_live(conversation=conversation)
    assert segment.source == "extractive"


def test_an_unknown_tenant_is_an_error(db):
    with pytest.raises(CommandError):
        run("--tenant", "nope")
