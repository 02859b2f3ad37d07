"""tenants/validation.py: the depth check that runs before parsing (brackets inside strings do not count,
deep documents are refused early, wide ones are cheap) and the checks of parsed JSON."""

import json
import time

import pytest

from tenants.validation import (
    MAX_JSON_DEPTH,
    HostileInput,
    json_depth_check,
    json_loads,
    text_is_clean,
)


def nested(depth: int, inner: str = "") -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


@pytest.mark.parametrize("depth", [0, 1, MAX_JSON_DEPTH])
def test_documents_up_to_the_limit_pass(depth):
    json_depth_check(nested(depth))
    json_depth_check(("{" + '"a":' * 0 + "}").encode())


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 5_000_000])
def test_deeper_documents_are_refused(depth):
    with pytest.raises(HostileInput) as caught:
        json_depth_check(nested(depth))
    assert caught.value.code == "json_too_deep"


def test_objects_and_arrays_both_count():
    doc = ('{"a":[' * 17 + "1" + "]}" * 17).encode()  # 34 levels
    with pytest.raises(HostileInput):
        json_depth_check(doc)
    json_depth_check(('{"a":[' * 16 + "1" + "]}" * 16).encode())  # 32


def test_brackets_in_strings_are_not_structure():
    text = json.dumps({"a": "[[[[{{{{" * 100, "b": '\\"[[[[' * 100, "c": ["]]]]" * 100]})
    json_depth_check(text.encode())
    assert json_loads(text)["a"].startswith("[[[[")


def test_a_deep_core_inside_a_wide_document_is_found():
    wide = ",".join(["[]"] * 100_000)
    json_depth_check(nested(MAX_JSON_DEPTH - 1, wide))
    with pytest.raises(HostileInput):
        json_depth_check(nested(MAX_JSON_DEPTH, wide))
    with pytest.raises(HostileInput):
        json_depth_check(("[" + wide + "," + nested(MAX_JSON_DEPTH).decode() + "]").encode())


def test_the_check_is_quick_on_large_bodies():
    started = time.perf_counter()
    with pytest.raises(HostileInput):
        json_depth_check(nested(8_000_000))
    json_depth_check(("[" + ",".join(["[]"] * 2_000_000) + "]").encode())  # passed
    assert time.perf_counter() - started < 5  # generous on a loaded machine; about 0.5 s here


@pytest.mark.parametrize(
    ("raw", "code", "path"),
    [
        (b'{"a":"x\\u0000"}', "null_characters_not_allowed", ("a",)),
        (b'{"a\\u0000":1}', "null_characters_not_allowed", ("a\\x00",)),
        (b'{"a":[1,{"b":"\\ud800"}]}', "surrogate_characters_not_allowed", ("a", "1", "b")),
        (b'{"a":1e400}', "number_out_of_range", ()),
    ],
)
def test_hostile_values_are_refused_with_where_they_are(raw, code, path):
    with pytest.raises(HostileInput) as caught:
        json_loads(raw)
    assert (caught.value.code, caught.value.path) == (code, path)


@pytest.mark.parametrize("raw", [b"[NaN]", b"[Infinity]", b"{", b'"\xff"'])
def test_what_is_not_json_is_a_value_error(raw):
    with pytest.raises(ValueError):
        json_loads(raw)


def test_escaped_text_that_is_fine_passes():
    assert json_loads(b'["\\ud83d\\ude00", "\\u00e9", "\\\\u0000"]') == ["\U0001f600", "é", "\\u0000"]


@pytest.mark.parametrize(
    ("value", "ok"),
    [("alice", True), ("a" * 255, True), ("a" * 256, False), ("", False), ("a\x00", False), (5, False)],
)
def test_text_is_clean(value, ok):
    assert text_is_clean(value, max_length=255) is ok
