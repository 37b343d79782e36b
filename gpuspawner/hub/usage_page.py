"""The usage page, ``/hub/gpus/usage``: GPU-hours, busy and idle, per server and job, and how each ended.

Every logged-in user sees their own (``?since=&until=``); readers of everyone's GPUs
(admins) see everyone's, per user and per group too, or one user's (``?user=NAME``),
as :class:`~.usage._Usage` rules. A bad parameter is a 400 naming it.
"""

from __future__ import annotations

import html
import json
from collections import Counter

from jupyterhub.handlers import BaseHandler
from tornado import web

from ..owner import Owner, OwnerError
from ..usage import END_REASON_WORDS
from .budgets import budget_policy, standings
from .usage import BadParameter, Share, _Usage, allocation_rows, answer

#: the most allocations the page lists, newest first (the CSV has them all)
HISTORY_ROWS = 200


def owner_words(owner: str) -> str:
    """A server or job as the page names it: ``default server``, ``server gpu1``, ``job 3``."""
    try:
        parsed = Owner.parse(owner)
    except OwnerError:
        return owner
    if parsed.is_job:
        return f"job {parsed.job}"
    return f"server {parsed.server}" if parsed.server else "default server"


def held_words(gpus_json: str, count: int, model: str) -> str:
    """What an allocation held: ``2 x NVIDIA A100-SXM4-80GB`` (cluster-placed: its resource)."""
    names = Counter(g.get("name") or g.get("model") or "GPU" for g in json.loads(gpus_json or "[]"))
    if not names:
        return f"{count} x {model or 'GPU'}"
    return ", ".join(f"{n} x {name}" for name, n in sorted(names.items()))


def history(parts: list[Share], limit: int = HISTORY_ROWS) -> list[dict]:
    """The allocations of a period, newest first, with what they held and how they ended, in words."""
    held = {p.row.id: held_words(p.row.gpus, p.row.gpu_count, p.row.model) for p in parts}
    rows = allocation_rows(parts)[::-1][:limit]
    for row in rows:
        words, meaning = END_REASON_WORDS.get(row["end_reason"], (row["end_reason"], ""))
        row.update(what=owner_words(row["owner"]), held=held[row["id"]], how=words, meaning=meaning)
    return rows


def svg_bars(rows: list[dict], what: str, width: int = 640) -> str:
    """A horizontal stacked bar per row (busy, idle, unsampled GPU-hours) of ``what``, as inline SVG."""
    rows = rows[:15]
    top = max((r["gpu_hours"] for r in rows), default=0) or 1.0
    label_w, bar_h, gap = 140, 18, 6
    scale = (width - label_w - 70) / top
    height = len(rows) * (bar_h + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="GPU-hours per {html.escape(what)}: busy, idle, unsampled" class="gpuspawner-usage-chart">']
    colours = (("busy_gpu_hours", "#2e7d32"), ("idle_gpu_hours", "#e65100"), ("unsampled_gpu_hours", "#9e9e9e"))
    for i, row in enumerate(rows):
        y = i * (bar_h + gap)
        key = html.escape(str(row["key"])[:24])
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" font-size="12">{key}</text>')
        x = float(label_w)
        for field, colour in colours:
            w = row[field] * scale
            if w > 0:
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colour}">'
                             f'<title>{field.replace("_gpu_hours", "")}: {row[field]:.2f} GPU-hours</title></rect>')
                x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 13}" font-size="12">{row["gpu_hours"]:.2f}</text>')
    y = len(rows) * (bar_h + gap) + 12
    for i, (field, colour) in enumerate(colours):
        parts.append(f'<rect x="{label_w + i * 110}" y="{y}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{label_w + i * 110 + 16}" y="{y + 11}" font-size="12">'
                     f'{field.replace("_gpu_hours", "")}</text>')
    parts.append("</svg>")
    return "".join(parts)



class UsagePageHandler(_Usage, BaseHandler):
    """``GET /hub/gpus/usage``: GPU-hours of a period per server and job, how each allocation ended,
    and (admins, unfiltered) per user and group, with a chart."""

    @web.authenticated
    async def get(self) -> None:
        viewer = self.viewer()
        try:
            whose = self.whose()
            since, until, parts = self.parts(whose)
        except BadParameter as e:
            raise web.HTTPError(400, "%s", str(e)) from e
        everyone = viewer is None and whose is None
        per_server = answer(since, until, "server", parts, whose)
        users = {p.row.owner: p.row.user for p in parts}
        for row in per_server["rows"]:
            row["what"], row["user"] = owner_words(row["key"]), users[row["key"]]
        by_user = answer(since, until, "user", parts, whose) if everyone else None
        by_group = answer(since, until, "group", parts, whose) if everyone else None
        if everyone:
            chart = svg_bars(by_user["rows"], "user")
        else:
            chart = svg_bars([{**r, "key": r["what"]} for r in per_server["rows"]], "server or job")
        policy = budget_policy(self.settings)
        budget = standings(self, policy, whose)[0] if whose is not None and policy.enabled else None
        self.set_header("Cache-Control", "no-store")
        self.finish(await self.render_template(
            "gpuspawner_usage.html", usage=per_server, budget=budget, viewer=viewer, whose=whose, everyone=everyone,
            by_user=by_user, by_group=by_group, chart=chart, history=history(parts), history_limit=HISTORY_ROWS,
            reasons=END_REASON_WORDS, since=self.get_argument("since", ""), until=self.get_argument("until", ""),
            asked_user=self.get_argument("user", ""),
        ))


def handlers() -> list[tuple[str, type]]:
    return [(r"/gpus/usage", UsagePageHandler)]
