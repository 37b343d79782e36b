"""Hostile request bodies at every door, without a hub: each body gives a checked value or a short
refusal naming its field, never another exception (gpuspawner.inputs and the parsers built on it).

The doors: the notebook job body (``parse_job``), the server's user_options (``parse_options``) and
the spawn form (``options_from_form``), the culler's usage report (``parse_report``) and the
monitor's notices (``parse_notice``). The hub-level versions of these checks, against a real hub,
are in tests/jobs/test_hostile_input.py.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from tornado import web

from gpuspawner.hub.usage import MAX_SAMPLES, Report, parse_report
from gpuspawner.inputs import MAX_DEPTH, MAX_NUMBER, OptionsError, check_json, dumps, field_name, read_json, shown
from gpuspawner.jobmodel.spec import JobSpec, parse_job
from gpuspawner.monitor.notices import parse_notice
from gpuspawner.profiles import OPTION_KEYS, load_profiles, options_from_form, parse_options
from hostile import (
    FORM_BAD,
    JOB_BAD,
    JOB_KEYS,
    LONG,
    OPTION_BAD,
    REPORT_BAD,
    REPORT_KEYS,
    SURROGATE,
    VALID_FORMS,
    VALID_OPTIONS,
    VALID_REPORTS,
    echoes_too_much,
    encode,
    finite,
    job_bodies,
    json_values,
    nested,
    raw_bodies,
    spoilt,
    strict_json,
    strings_in,
)
from jobnotebooks import PROFILES

MAX_TIME = 600.0
NOW = 1_800_000_000.0
MODELS = {"a100-sxm4-80gb", "t4"}
HUB_PROFILES = load_profiles(PROFILES)
MAX_MESSAGE = 300  # a refusal is one short sentence
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_short_refusal(e: OptionsError, body: object, fields: set[str]) -> None:
    """The refusal names a field of the body (or the body), in a short sentence that repeats little of it."""
    message = str(e)
    assert message.startswith(f"{e.field}: "), message
    assert len(e.field) <= 60, e.field  # a field's path names at most 40 characters of any key in it
    assert len(message) <= MAX_MESSAGE, message
    assert echoes_too_much(message, body) is None, message[:200]
    keys = {field_name(k) for k in body} if isinstance(body, dict) else set()
    assert any(e.field == k or e.field.startswith((f"{k}.", f"{k}[")) for k in fields | keys | {"body"}), e.field


def json_safe(value: object) -> bool:
    """What a database stores and a browser parses: finite numbers, UTF-8 text without NUL."""
    json.dumps(value, allow_nan=False)  # ValueError on NaN or Infinity
    for text in strings_in(value):
        text.encode()  # UnicodeEncodeError on a lone surrogate
        if "\0" in text:
            return False
    return True


# ------------------------------------------------------------------ reading a body


@FAST
@given(raw_bodies | st.binary(max_size=40) | json_values.map(encode))
def test_any_bytes_read_as_checked_json_or_refused_as_the_body(raw):
    try:
        value = read_json(raw)
    except OptionsError as e:
        assert len(str(e)) <= MAX_MESSAGE and e.field.split(".")[0].split("[")[0] is not None
        return
    assert finite(value) and json_safe(value)


@pytest.mark.parametrize("raw, words", [
    (b"[" * 5000 + b"]" * 5000, "nested more than"),  # a RecursionError in the hub before
    (b'{"time_limit": ' + b"9" * 5000 + b"}", "too large to read"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"a": ', "not valid JSON"),
    (b"x" * (1 << 21), "larger than"),
])
def test_unreadable_bodies_are_refused_as_the_body(raw, words):
    with pytest.raises(OptionsError) as e:
        read_json(raw)
    assert e.value.field == "body" and words in str(e.value)


@pytest.mark.parametrize("body, field", [
    ({"time_limit": float("nan")}, "time_limit"),
    ({"time_limit": float("inf")}, "time_limit"),
    ({"parameters": {"x": -float("inf")}}, "parameters.x"),
    ({"gpus": 10**300}, "gpus"),
    ({"samples": [[1, 2], [3, 10**20]]}, "samples[1][1]"),
    ({"name": SURROGATE}, "name"),
    ({"notebook": "a\x00.ipynb"}, "notebook"),
    ({SURROGATE: 1}, "\\ud800"),
    ({"parameters": {"x": {"y": {"z": {"a": {"b": {"c": {"d": {"e": 1}}}}}}}}}, "parameters.x.y.z.a.b.c.d"),
])
def test_check_json_names_the_field(body, field):
    with pytest.raises(OptionsError) as e:
        check_json(body)
    assert e.value.field == field and len(str(e.value)) <= MAX_MESSAGE


def test_nesting_is_refused_where_it_goes_too_deep():
    with pytest.raises(OptionsError) as e:
        read_json(nested(MAX_DEPTH + 1))
    assert e.value.field == ".".join(["a"] * MAX_DEPTH) and "nested more than" in str(e.value)
    assert read_json(nested(MAX_DEPTH - 1))


def test_largest_numbers_pass():
    check_json({"a": MAX_NUMBER, "b": -MAX_NUMBER, "c": 1e15, "d": "\u00e9\U0001f600"})


@FAST
@given(json_values)
def test_dumps_always_writes_json_a_browser_parses(value):
    text = dumps(value)
    parsed = strict_json(text)
    if finite(value):
        assert parsed == json.loads(json.dumps(value))


@given(st.text(max_size=400) | st.text(alphabet=st.characters(exclude_categories=()), max_size=400) | json_values)
def test_shown_and_field_names_stay_short(value):
    assert len(shown(value)) <= 104
    assert len(field_name(value)) <= 40


# ------------------------------------------------------------------ the notebook job body


def job(body):
    return parse_job(body, MAX_TIME)


@FAST
@given(spoilt(job_bodies(), JOB_BAD, JOB_KEYS, drop=("notebook",)))
def test_a_job_body_with_a_spoilt_field_is_refused_naming_a_field(case):
    body, _spoilt = case
    with pytest.raises(OptionsError) as e:
        job(body)
    assert_short_refusal(e.value, body, JOB_KEYS)


@FAST
@given(json_values | st.dictionaries(st.sampled_from(sorted(JOB_KEYS)) | st.text(max_size=6), json_values,
                                     max_size=6) | job_bodies())
def test_any_job_body_gives_a_json_safe_spec_or_a_short_refusal(body):
    try:
        spec = job(body)
    except OptionsError as e:
        assert_short_refusal(e, body, JOB_KEYS)
        return
    assert isinstance(spec, JobSpec) and json_safe(spec.to_dict())
    for path in (spec.notebook, spec.log, *spec.outputs.values()):
        assert not path.startswith("/") and ".." not in path.split("/") and path.rsplit("/", 1)[-1] not in ("", ".")
    assert len({spec.notebook, spec.log, *spec.outputs.values()}) == 2 + len(spec.outputs)
    assert spec.time_limit is None or 0 < spec.time_limit <= MAX_TIME
    assert isinstance(spec.name, str) and len(spec.name) <= 256


@pytest.mark.parametrize("body, field", [  # issue 25's bodies that were accepted or answered 500
    ({"notebook": "a.ipynb", "time_limit": float("nan")}, "time_limit"),
    ({"notebook": "a.ipynb", "time_limit": float("inf")}, "time_limit"),
    ({"notebook": "a.ipynb", "time_limit": 10**300}, "time_limit"),
    ({"notebook": "a.ipynb", "parameters": {"n": 10**300}}, "parameters.n"),
    ({"notebook": "a.ipynb", "parameters": {"n": float("nan")}}, "parameters.n"),
    ({"notebook": "a.ipynb", "parameters": {"p" * 64: None}}, "parameters." + "p" * 40),  # found by Hypothesis
    ({"notebook": f"{SURROGATE}.ipynb"}, "notebook"),
    ({"notebook": "a.ipynb", "name": f"x{SURROGATE}"}, "name"),
    ({"notebook": "a.ipynb", "outputs": {"ipynb": "."}}, "outputs.ipynb"),
    ({"notebook": "a.ipynb", "outputs": {"ipynb": "./"}}, "outputs.ipynb"),
    ({"notebook": "a.ipynb", "log": "."}, "log"),
    ({"notebook": "a.ipynb", LONG: 1}, "k" * 40),
    ({"notebook": "a.ipynb", "outputs": {"ipynb": "a.ipynb"}}, "outputs.ipynb"),
    ({"notebook": "n" * 300 + ".ipynb"}, "notebook"),
])
def test_issue_bodies_are_refused_naming_their_field(body, field):
    with pytest.raises(OptionsError) as e:
        job(body)
    assert e.value.field == field
    assert_short_refusal(e.value, body, JOB_KEYS)


def test_the_job_name_defaults_to_the_notebook_name():
    assert job({"notebook": "n" * 240 + ".ipynb"}).name == "n" * 240  # 255 bytes at most: a file name
    assert job({"notebook": "d/run.ipynb", "name": ""}).name == "run"


# ------------------------------------------------------------------ the server's user_options and the form


@FAST
@given(spoilt(VALID_OPTIONS, OPTION_BAD, set(OPTION_KEYS)))
@example(({"gpus": float("nan")}, ["gpus"]))
def test_server_options_with_a_spoilt_field_are_refused_naming_a_field(case):
    body, _spoilt = case
    with pytest.raises(OptionsError) as e:
        parse_options(body, HUB_PROFILES, MODELS)
    assert_short_refusal(e.value, body, set(OPTION_KEYS) | {"user_options"})


@FAST
@given(spoilt(VALID_FORMS, FORM_BAD, set(), extra=False))
def test_a_form_with_a_spoilt_field_is_refused(case):
    form, _spoilt = case
    with pytest.raises(OptionsError) as e:
        parse_options(options_from_form(form), HUB_PROFILES, MODELS)
    assert len(str(e.value)) <= MAX_MESSAGE and e.value.field in OPTION_KEYS


@FAST
@given(VALID_OPTIONS)
def test_the_valid_options_of_the_strategies_are_valid(body):
    parse_options(body, HUB_PROFILES, MODELS)


# ------------------------------------------------------------------ the usage report


@FAST
@given(spoilt(VALID_REPORTS, REPORT_BAD, REPORT_KEYS, drop=("owner",)))
def test_a_usage_report_with_a_spoilt_field_is_refused_naming_a_field(case):
    body, _spoilt = case
    with pytest.raises(OptionsError) as e:
        parse_report(body, NOW)
    assert_short_refusal(e.value, body, REPORT_KEYS)


@FAST
@given(json_values | VALID_REPORTS | st.dictionaries(st.sampled_from(sorted(REPORT_KEYS)), json_values, max_size=4))
def test_any_usage_report_gives_a_checked_report_or_a_short_refusal(body):
    try:
        report = parse_report(body, NOW)
    except OptionsError as e:
        assert_short_refusal(e, body, REPORT_KEYS)
        return
    assert isinstance(report, Report) and 0 <= report.threshold <= 100 and len(report.samples) <= MAX_SAMPLES
    for at, utilisation in report.samples:
        assert 0 < at <= NOW + 300 and (utilisation is None or 0 <= utilisation <= 100)
    assert all(math.isfinite(at) for at, _ in report.samples)


def test_a_sample_from_the_future_is_refused():
    with pytest.raises(OptionsError) as e:
        parse_report({"owner": "a/", "samples": [[NOW + 3600, 50]]}, NOW)
    assert e.value.field == "samples[0]" and "future" in str(e.value)


# ------------------------------------------------------------------ the monitor's notices


NOTICE_KEYS = {"message", "level", "id", "source"}


@FAST
@given(raw_bodies | json_values.map(encode)
       | st.dictionaries(st.sampled_from(sorted(NOTICE_KEYS)), json_values, max_size=4).map(encode))
@example(encode({"message": "stop soon", LONG: 1}))
@example(encode({"message": f"bad {SURROGATE}"}))
def test_any_notice_gives_a_notice_or_a_short_400(raw):
    try:
        notice = parse_notice(raw)
    except web.HTTPError as e:
        message = e.log_message % e.args
        assert e.status_code == 400 and len(message) <= MAX_MESSAGE
        field = message.split(": ")[0]
        assert field.split(".")[0].split("[")[0] in NOTICE_KEYS | {"body"} or all(
            len(re.sub(r"(\[\d+\])+$", "", part)) <= 40 for part in field.split(".")), message  # short names
        return
    assert json_safe(notice) and notice["message"] and notice["level"] in ("info", "warning", "error")


# ------------------------------------------------------------------ JupyterLab's Create Job dialog (parameters as text)


@FAST
@given(st.text(max_size=30) | st.sampled_from(["-" * 100_000 + "1", "(" * 300 + ")" * 300, "[" * 10**5, "1e999"]))
def test_a_parameter_typed_in_the_dialog_is_a_literal_or_stays_text(text):
    from gpuspawner.labjobs.scheduler import parameter_value

    value = parameter_value(text)
    assert isinstance(value, (bool, int, float, str))
