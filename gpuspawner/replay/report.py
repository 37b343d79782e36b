"""The replay's figures for people: a table (plain or Markdown) and a chart of the day."""

from __future__ import annotations

from .simulation import Result

COLUMNS = [("policy", "policy", "{}"), ("held_idle_pct", "held-idle %", "{:.1f}"),
           ("median_wait_min", "median wait min", "{:.1f}"), ("p95_wait_min", "p95 wait min", "{:.1f}"),
           ("refusals", "refusals", "{}"), ("gave_up", "gave up", "{}"), ("utilisation_pct", "utilisation %", "{:.1f}"),
           ("culled_warned", "culled, warned", "{}"), ("culled_unwarned", "culled, no warning", "{}"),
           ("came_back", "culled, came back", "{}")]


def table(results: list, markdown: bool = False, columns: list[tuple[str, str, str]] = COLUMNS) -> str:
    """``results`` (objects with the ``columns``' attributes: key, title, format) as a plain or Markdown table."""
    rows = [[fmt.format(getattr(r, key)) for key, _t, fmt in columns] for r in results]
    titles = [title for _k, title, _f in columns]
    if markdown:
        lines = ["| " + " | ".join(titles) + " |", "|" + "|".join(" --- " for _ in titles) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(t), *(len(r[i]) for r in rows)) for i, t in enumerate(titles)]
    lines = ["  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def chart(results: list[Result], path: str, capacity: int) -> bool:
    """A PNG of busy/idle/free GPUs over the day, one panel per policy; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.0 * len(results)), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        hours = [t / 3600 for t, *_ in result.series]
        busy, idle, free = ([row[i] for row in result.series] for i in (1, 2, 3))
        ax.stackplot(hours, busy, idle, free, labels=["busy", "held, idle", "free"],
                     colors=["#2e7d32", "#e65100", "#cfd8dc"], step="post")
        ax.set_ylim(0, capacity)
        ax.set_ylabel("GPUs")
        ax.set_title(f"{result.policy}: held-idle {result.held_idle_pct:.0f}%, median wait "
                     f"{result.median_wait_min:g} min, p95 wait {result.p95_wait_min:.0f} min, "
                     f"utilisation {result.utilisation_pct:.0f}%", fontsize=9)
    axes[0, 0].legend(loc="upper left", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("hour of the day")
    axes[-1, 0].set_xlim(0, 24)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
