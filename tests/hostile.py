"""Hypothesis strategies of hostile request input: what an outside check sends to the hub's doors.

- :data:`texts`, :data:`numbers`, :data:`json_values`: any JSON Python's parser hands a
  handler (``NaN``, ``Infinity``, integers hundreds of digits long, lone surrogates, NUL,
  10,000-character keys), nested a few levels;
- :data:`raw_bodies`: bytes that are no usable JSON object (deep nesting, invalid UTF-8,
  numbers too long to read, truncated text);
- :func:`spoilt`: a valid body with at least one field given a value that must be
  refused, and perhaps an unknown key: a body refused by construction. ``JOB_BAD``,
  ``OPTION_BAD``, ``REPORT_BAD``, ``FORM_BAD`` are the bad values per field of each door;
- :func:`strict_json`: parse an answer as a browser would (no ``NaN``, no ``Infinity``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

LONG = "k" * 10_000
SURROGATE = "\ud800"
NAN, INF = float("nan"), float("inf")
#: long values, made when drawn (a strategy listing them would print them whole)
long = st.builds(lambda: LONG)

texts = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=8),  # surrogates included
    st.sampled_from(["", ".", "./", "..", "/", "\x00", SURROGATE, f"a{SURROGATE}b", "\u00e9", "a\nb"]),
    long,
)
numbers = st.one_of(
    st.integers(-3, 10),
    st.integers(),
    st.integers(min_value=10**16, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([NAN, INF, -INF, 10**300, -(10**300), 2**53 + 1, 1e300]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8,
)


def nested(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


raw_bodies = st.one_of(
    st.integers(9, 6000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(9, 6000).map(nested),
    st.sampled_from([
        b"{", b'{"notebook": ', b"\xff\xfe{}", b'{"notebook": "\xff.ipynb"}', b"NaN", b"[NaN]",
        b'{"a": 1}{"b": 2}', b"\x00", b"[]", b'"text"', b"12", b"true", b"\xef\xbb\xbf{}",
    ]),
    st.builds(lambda: b"1" * 5000), st.builds(lambda: b'{"time_limit": ' + b"9" * 5000 + b"}"),
)


def encode(body: Any) -> bytes:
    """A body as a client sends it: Python's JSON, with NaN/Infinity as they come, surrogates escaped."""
    return json.dumps(body, allow_nan=True).encode()


def strict_json(text: str | bytes) -> Any:
    """Parse JSON as a browser does: ``NaN`` and ``Infinity`` are no JSON."""

    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def strings_in(value: Any) -> list[str]:
    """Every string (keys included) inside a body."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def echoes_too_much(message: str, body: Any, limit: int = 100) -> str | None:
    """A string of ``body`` that ``message`` repeats more than ``limit`` characters of, if any."""
    for text in strings_in(body):
        if len(text) > limit and text[: limit + 1] in message:
            return text
    return None


def unknown_keys(known: set[str]) -> st.SearchStrategy[str]:
    reserved = known | {"display_name", "user_options"}  # JupyterHub's own keys of a server body
    return st.one_of(st.sampled_from([SURROGATE, "", "__proto__", "partition", "GPUS", "gpus "]), long,
                     st.text(max_size=12)).filter(lambda k: k not in reserved)


def spoilt(valid: st.SearchStrategy[dict], bad: dict[str, st.SearchStrategy], known: set[str],
           drop: tuple[str, ...] = (), extra: bool = True) -> st.SearchStrategy[tuple[dict, list[str]]]:
    """(a valid body with 1 to 3 fields given bad values, or an unknown key (``extra``), or a required key
    dropped; what was spoilt). Every such body must be refused."""

    @st.composite
    def build(draw):
        body = dict(draw(valid))
        fields = draw(st.lists(st.sampled_from(sorted(bad)), min_size=0 if extra else 1, max_size=3, unique=True))
        for field in fields:
            body[field] = draw(bad[field])
        if extra and (not fields or draw(st.booleans())):  # an unknown key, or a required key left out
            if drop and draw(st.booleans()):
                key = draw(st.sampled_from(drop))
                body.pop(key, None)
            else:
                key = draw(unknown_keys(known))
                body[key] = draw(scalars)
            fields.append(key)
        return body, fields

    return build()


def _non(*kinds: type) -> st.SearchStrategy:
    """JSON values of none of ``kinds`` (bool counts as its own kind)."""
    def excluded(v: Any) -> bool:
        if isinstance(v, bool):
            return bool in kinds
        return isinstance(v, kinds)

    return json_values.filter(lambda v: not excluded(v))


# ------------------------------------------------------------------ the GPU choice (servers and jobs)

#: bad values of the user_options keys, for the test hubs' profiles (cpu: [0]; gpu: [0, 1, 2]; queued: [1];
#: no profile offers images; models a100-sxm4-80gb and t4)
OPTION_BAD = {
    "profile": st.sampled_from(["nope", "", "GPU", SURROGATE, "gpu\x00", "gpu "]) | long | _non(str),
    "gpus": st.sampled_from([-1, 3, 1.5, "1", NAN, INF, 10**300, True, None, [], {}]),
    "gpu_model": st.sampled_from(["v100", "A100", "", SURROGATE, "t4\x00", "a100"]) | long | _non(str),
    "image": texts | _non(str),
}
VALID_OPTIONS = st.sampled_from([
    {}, {"profile": "cpu"}, {"profile": "cpu", "gpus": 0}, {"profile": "gpu", "gpus": 1, "gpu_model": "t4"},
    {"profile": "gpu", "gpus": 2, "gpu_model": "any"}, {"profile": "queued", "gpus": 1, "gpu_model": "t4"},
])

# ------------------------------------------------------------------ the notebook job body

#: bad values of each job key; every one is refused by parse_job itself
JOB_BAD = {
    "notebook": st.sampled_from([
        ".", "./", "", " ", "/etc/passwd.ipynb", "../x.ipynb", "a/../../x.ipynb", "x.txt", "x", ".ipynb",
        f"{SURROGATE}.ipynb", "a\x00.ipynb", "a\\b.ipynb", "n" * 300 + ".ipynb",
    ]) | long.map(lambda t: t + ".ipynb") | _non(str),
    "outputs": st.one_of(
        (st.sampled_from([".", "./", "", "/abs.ipynb", "../x.ipynb", SURROGATE, "ok.ipynb"]) | long).map(
            lambda p: {"ipynb": p}),
        st.sampled_from([{"pdf": "x.pdf"}, {SURROGATE: "x"}, [], {}, "x", 5, {"html": 5}]),
        long.map(lambda k: {k: "x"}),
    ),
    "log": st.sampled_from([".", "./", "", "/abs.log", "../x.log", 5, [], SURROGATE, "ok.ipynb"]) | long,
    "parameters": st.one_of(
        st.sampled_from([[], "x", 5, {"1a": 1}, {"a b": 1}, {SURROGATE: 1}]), long.map(lambda k: {k: 1}),
        (st.sampled_from([NAN, INF, -INF, [1], {"b": 1}, None, 10**300, SURROGATE, "a\x00"]) | long).map(
            lambda v: {"a": v}),
    ),
    "kernel": st.sampled_from(["", "-x", "a b", 5, True, [], SURROGATE, "k" * 100]),
    "time_limit": st.sampled_from([NAN, INF, -INF, 0, -1, "10", True, False, 10**300, 1e300, 601, [], {}]),
    "name": st.sampled_from([5, True, [], {}, "n" * 257, SURROGATE, "a\x00"]) | long,
    "id": st.sampled_from(["", "x", 5, True, [], "0" * 31, "0" * 33, "A" * 32, "0" * 31 + SURROGATE,
                           "00000000-0000-0000-0000-00000000000", "../" + "0" * 29]) | long,
}
JOB_KEYS = {"notebook", "outputs", "log", "parameters", "kernel", "time_limit", "name", "id",
            "profile", "gpus", "gpu_model", "image"}


def job_bodies(notebook: str = "ok.ipynb") -> st.SearchStrategy[dict]:
    """Valid job bodies for a notebook that exists (outputs, log and the rest optional)."""
    extras = st.fixed_dictionaries({}, optional={
        "outputs": st.sampled_from([{"ipynb": "out/run.ipynb"}, {"ipynb": "o.ipynb", "html": "o.html"}]),
        "log": st.just("out/run.log"), "parameters": st.just({"seconds": 0, "label": "x", "ok": True}),
        "kernel": st.just("python3"), "time_limit": st.sampled_from([30, 59.5]), "name": st.just("a run"),
    })
    return st.builds(lambda o, e: {**o, **e, "notebook": notebook}, VALID_OPTIONS, extras)


# ------------------------------------------------------------------ the culler's usage report

REPORT_BAD = {
    "owner": st.sampled_from(["", "alice", 5, None, [], "a" * 600 + "/"]),
    "threshold": st.sampled_from([NAN, INF, -1, 101, "5", True, [], 10**300]),
    "samples": st.one_of(
        st.sampled_from(["x", 5, {}]), st.builds(lambda: [[1_700_000_000, 1]] * 10_001),
        st.sampled_from([[1], [1, 2, 3], "t", 5, None, {}, [NAN, 5], [INF, 5], [-1, 5], [1e12, 5], [1, NAN],
                         [1, -1], [1, 101], [1, "5"], [True, 5], [10**300, 5]]).map(lambda s: [s]),
    ),
    "end_reason": st.sampled_from(["", "nope", 5, [], SURROGATE]) | long,
}
REPORT_KEYS = {"owner", "threshold", "samples", "end_reason"}
VALID_REPORTS = st.fixed_dictionaries({"owner": st.sampled_from(["eve/", "eve/job/0123"])}, optional={
    "threshold": st.sampled_from([0, 5, 99.5]), "samples": st.just([[1_700_000_000, 5], [1_700_000_060, None]]),
    "end_reason": st.sampled_from(["stopped", "culled", None]),
})

# ------------------------------------------------------------------ the spawn form (fields as the browser sends them)

FORM_BAD = {
    "profile": st.sampled_from(["nope", "", "GPU", "gpu\x00", "k" * 300]).map(lambda v: [v]),
    "gpus-gpu": st.sampled_from(["3", "-1", "1.5", "two", "99999", "\uff12", "1\x00"]).map(lambda v: [v])
    | st.just(["1", "2"]),
    "gpu_model-gpu": st.sampled_from(["v100", "A100", "t4\x00", "k" * 300]).map(lambda v: [v]),
    "image-gpu": st.text(min_size=1, max_size=20).map(lambda v: [v]),
}
VALID_FORMS = st.sampled_from([
    {"profile": ["gpu"], "gpus-gpu": ["1"], "gpu_model-gpu": ["t4"]},
    {"profile": ["gpu"], "gpus-gpu": ["2"], "gpu_model-gpu": ["any"], "gpus-cpu": ["0"]},
])


def finite(value: Any) -> bool:
    """Whether every number in ``value`` is finite."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True
