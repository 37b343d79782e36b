"""GPU-hour budgets, the pure core: periods, weights, who is counted, when a spent budget opens again."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner import budgets
from gpuspawner.budgets import BudgetError, BudgetPolicy, BudgetSpec, Standing

H = 3600.0


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def row(user="alice", started=0.0, ended=None, count=1, model="a100-sxm4-80gb", groups=()):
    return SimpleNamespace(user=user, started=started, ended=ended, gpu_count=count, model=model,
                           groups=json.dumps(list(groups)), busy_seconds=0.0, idle_seconds=0.0)


NOW = at("2026-11-25T12:00:00")  # a Wednesday


def test_calendar_periods_are_utc_days_weeks_from_monday_and_months():
    assert BudgetSpec(1, "day").window(NOW) == (at("2026-11-25T00:00:00"), at("2026-11-26T00:00:00"))
    assert BudgetSpec(1, "week").window(NOW) == (at("2026-11-23T00:00:00"), at("2026-11-30T00:00:00"))
    assert BudgetSpec(1, "month").window(NOW) == (at("2026-11-01T00:00:00"), at("2026-12-01T00:00:00"))
    assert BudgetSpec(1, "month").window(at("2026-12-31T23:59:00")) == (at("2026-12-01T00:00:00"),
                                                                       at("2027-01-01T00:00:00"))
    assert BudgetSpec(1, "week", rolling=True).window(NOW) == (NOW - 7 * 24 * H, NOW)


def test_weights_match_globs_then_slug_prefixes_and_default_to_one():
    weights = budgets.parse_weights({"a100*": 4, "t4": 1.5, "nvidia.com/mig-1g*": 0.25})
    assert budgets.weight("a100-sxm4-80gb", weights) == 4
    assert budgets.weight("t4", weights) == 1.5
    assert budgets.weight("t4-16gb", weights) == 1.5  # a slug pattern matches the models it begins, up to a dash
    assert budgets.weight("t40", weights) == 1.0
    assert budgets.weight("nvidia.com/mig-1g.10gb", weights) == 0.25
    assert budgets.weight("h100", weights) == 1.0
    assert budgets.cost_per_hour(2, "a100-pcie-40gb", weights) == 8


def test_used_counts_count_x_overlap_x_weight_in_the_period_and_held_ones_up_to_now():
    policy = BudgetPolicy(per_user=BudgetSpec(20, "week"), weights=budgets.parse_weights({"a100*": 4}))
    monday = at("2026-11-23T00:00:00")
    rows = [
        row(started=monday - 2 * H, ended=monday + 1 * H, count=2),  # 1 h of it inside: 2 GPUs x 1 h x 4 = 8
        row(started=NOW - 1.5 * H, ended=None, count=1, model="t4"),  # still held: 1.5 h x 1
        row(user="bob", started=NOW - 5 * H, ended=NOW - H, count=4),  # someone else's
        row(started=monday - 10 * H, ended=monday - 5 * H, count=8),  # last week's
    ]
    standing = policy.standing("alice", [], rows, NOW)
    line, = standing.lines
    assert (line.scope, line.name) == ("user", "alice")
    assert line.used == pytest.approx(9.5)
    assert line.left == pytest.approx(10.5)
    assert not standing.exhausted
    assert standing.summary() == "10.5 of 20 GPU-hours left this week"
    assert line.resets == at("2026-11-30T00:00:00")


def test_a_group_budget_is_shared_by_its_members_and_an_override_replaces_the_user_budget():
    policy = BudgetPolicy(per_user=BudgetSpec(10, "day"), per_group={"students": BudgetSpec(3, "day")},
                          overrides={"carol": BudgetSpec(100, "day"), "dave": None}, unit="A100-hours")
    rows = [row(user="bob", started=NOW - 2 * H, ended=NOW - H, groups=["students"]),
            row(user="carol", started=NOW - 3 * H, ended=NOW - H, groups=["students"])]
    carol = policy.standing("carol", ["students"], rows, NOW)
    assert [(b.scope, b.name, b.limit, b.used) for b in carol.lines] == [("user", "carol", 100, 2),
                                                                         ("group", "students", 3, 3)]
    assert carol.exhausted and carol.binding.name == "students"
    assert carol.sentence() == (
        "Your GPU budget is spent: group 'students' has used 3 of 3 A100-hours today. GPU profiles open again "
        "at 2026-11-26 00:00 UTC. CPU-only profiles still start; ask an administrator if you need more.")
    assert [b.scope for b in policy.standing("dave", ["students"], rows, NOW).lines] == ["group"]
    assert policy.standing("erin", [], rows, NOW).summary() == "10 of 10 A100-hours left today"
    assert BudgetPolicy().standing("erin", ["students"], rows, NOW).lines == ()


def test_a_spent_rolling_budget_opens_again_when_enough_use_has_left_the_window():
    policy = BudgetPolicy(per_user=BudgetSpec(2, "day", rolling=True))
    rows = [row(started=NOW - 10 * H, ended=NOW - 8 * H)]  # 2 GPU-hours, 10 to 8 hours ago
    line, = policy.standing("alice", [], rows, NOW).lines
    assert line.exhausted
    # the window [t - 24 h, now] holds less than 2 h once t - 24 h passes now - 10 h
    assert line.available_again == pytest.approx(NOW + 14 * H, abs=1)
    assert line.resets == NOW - 10 * H + 24 * H  # the oldest counted moment leaves the window
    body = policy.standing("alice", [], rows, NOW).quota_json()
    assert body["error"] == "compute-quota-exceeded"
    assert (body["used"], body["limit"], body["left"], body["scope"]) == (2, 2, 0, {"user": "alice"})
    assert body["reset"] == datetime.fromtimestamp(line.available_again, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_zero_budget_is_spent_and_never_opens_again_by_itself():
    line, = BudgetPolicy(per_user=BudgetSpec(0, "week")).standing("alice", [], [], NOW).lines
    assert line.exhausted and line.available_again is None
    standing = Standing("alice", "GPU-hours", NOW, (line,))
    assert "open again" not in standing.sentence() and "used 0 of 0 GPU-hours this week" in standing.sentence()


def test_low_is_crossed_once_when_left_falls_to_the_share():
    policy = BudgetPolicy(per_user=BudgetSpec(10, "week"))
    before = policy.standing("alice", [], [row(started=NOW - 8 * H, ended=NOW - 0.5 * H)], NOW)  # 7.5 used
    after = policy.standing("alice", [], [row(started=NOW - 9.5 * H, ended=NOW)], NOW)  # 9.5 used: 5 % left
    assert not budgets.crossed_low(None, before, 0.1)
    assert budgets.crossed_low(before, after, 0.1)
    assert not budgets.crossed_low(after, after, 0.1)
    assert budgets.crossed_low(None, after, 0.1)


@pytest.mark.parametrize(("value", "needle"), [
    (-1, "not a number of GPU-hours"), (float("nan"), "not a number"), ("20", "not a number"), (True, "not a number"),
    ({"hours": 5, "period": "year"}, "period 'year'"), ({"period": "day"}, "needs 'hours'"),
    ({"hours": 5, "every": "day"}, "unknown key 'every'"), ({"hours": 5, "rolling": "yes"}, "rolling must be"),
])
def test_bad_budgets_are_refused_naming_the_setting(value, needle):
    with pytest.raises(BudgetError, match=needle) as e:
        budgets.parse_spec(value, "gpu_budget_per_group['students']")
    assert str(e.value).startswith("gpu_budget_per_group['students']: ")


def test_bad_weights_are_refused_naming_the_entry():
    with pytest.raises(BudgetError, match=r"gpu_budget_weights\['a100\*'\]: -4"):
        budgets.parse_weights({"a100*": -4})
    with pytest.raises(BudgetError, match="not a model pattern"):
        budgets.parse_weights({"": 2})
    with pytest.raises(BudgetError, match="must be a dict"):
        budgets.parse_weights([("a100", 4)])


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.text(max_size=5), st.floats(allow_nan=True), st.integers(-5, 10**6),
                 st.dictionaries(st.sampled_from(["hours", "period", "rolling", "x"]),
                                 st.one_of(st.integers(-3, 50), st.sampled_from(["day", "week", "month", "year"]),
                                           st.booleans()), max_size=4)))
def test_any_budget_value_is_a_budget_or_a_sentence_naming_the_setting(value):
    try:
        spec = budgets.parse_spec(value, "gpu_budget_per_user", allow_none=True)
    except BudgetError as e:
        assert str(e).startswith("gpu_budget_per_user: ")
        return
    if value is None:
        assert spec is None
        return
    assert spec.hours >= 0 and spec.period in ("day", "week", "month") and isinstance(spec.rolling, bool)


allocations = st.lists(st.tuples(st.floats(-40, 0), st.floats(0, 30), st.integers(1, 4),
                                 st.sampled_from(["a100-sxm4-80gb", "t4", "h100"]), st.booleans()), max_size=8)


@settings(max_examples=120, deadline=None)
@given(allocations, st.floats(0, 60), st.sampled_from(["day", "week"]), st.booleans())
def test_used_is_the_sum_over_allocations_and_left_never_below_zero(found, limit, period, rolling):
    weights = budgets.parse_weights({"a100*": 4, "h100": 6})
    rows = [row(started=NOW + s * H, ended=None if held else min(NOW, NOW + (s + d) * H), count=c, model=m)
            for s, d, c, m, held in found]
    spec = BudgetSpec(limit, period, rolling)
    line, = BudgetPolicy(per_user=spec, weights=weights).standing("alice", [], rows, NOW).lines
    since, until = spec.window(NOW)
    expected = sum(max(0.0, min(r.ended if r.ended is not None else NOW, until) - max(r.started, since))
                   * r.gpu_count * budgets.weight(r.model, weights) for r in rows) / H
    assert line.used == pytest.approx(expected, abs=1e-9)
    assert line.left == pytest.approx(max(0.0, limit - expected))
    assert line.exhausted == (expected >= limit)
    if line.exhausted and limit > 0:
        assert line.available_again >= NOW
    if line.exhausted and limit > 0 and rolling:  # the first second at which less than the limit is counted
        def counted(t: float) -> float:
            return budgets._weighted_hours(rows, t - spec.length, NOW, NOW, weights)[0]

        assert counted(line.available_again) < limit
        assert line.available_again - 2 < NOW or counted(line.available_again - 2) >= limit - 1e-9


@settings(max_examples=60, deadline=None)
@given(allocations, st.floats(0, 40), st.sampled_from(["day", "week", "month"]), st.booleans(),
       st.lists(st.sampled_from(["ml", "physics"]), unique=True, max_size=2))
def test_the_rest_bodies_are_json_and_agree_with_the_standing(found, limit, period, rolling, groups):
    rows = [row(started=NOW + s * H, ended=None if held else min(NOW, NOW + (s + d) * H), count=c, model=m,
                groups=groups) for s, d, c, m, held in found]
    policy = BudgetPolicy(per_user=BudgetSpec(limit, period, rolling), per_group={"ml": BudgetSpec(30, "week")},
                          weights=budgets.parse_weights({"a100*": 4}), unit="T4-hours")
    standing = policy.standing("alice", groups, rows, NOW)
    body = json.loads(json.dumps(standing.as_json()))
    assert body["user"] == "alice" and len(body["budgets"]) == 1 + ("ml" in groups)
    assert body["left"] == min(b["left"] for b in body["budgets"]) and body["exhausted"] == standing.exhausted
    for b in body["budgets"]:
        assert b["left"] == pytest.approx(max(0.0, b["limit"] - b["used"]), abs=1e-3)
        assert datetime.fromisoformat(b["since"].replace("Z", "+00:00")).timestamp() <= NOW
    if standing.exhausted:
        refusal = json.loads(json.dumps(standing.quota_json()))
        assert refusal["error"] == "compute-quota-exceeded" and refusal["left"] == 0
        assert refusal["used"] >= refusal["limit"] and refusal["unit"] == "T4-hours"
        assert refusal["reset"] is None or refusal["reset"] >= body["at"]
        assert f"of {round(standing.binding.limit, 2):g} T4-hours" in standing.sentence()
