"""`bench/run_all.py --svg FILE`: the ratios of one run against their goals, as one SVG.

pygal (a project dependency, also used by the console's charts) renders the SVG on the
server; `js=[]` keeps it a plain image (no tooltip script, no CDN). One bar per row that
has a ratio; the goal of each row (`>= 0.60`) is a second bar beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

_GOAL = re.compile(r">=\s*([0-9.]+)")


def _float(text: str) -> float | None:
    try:
        return float(text.rstrip("x"))
    except (TypeError, ValueError):
        return None


def ratio_chart_svg(rows, *, title: str) -> str:
    import pygal
    from pygal.style import Style

    labels, ratios, goals = [], [], []
    for r in rows:
        value = _float(r.ratio)
        if value is None:
            continue
        goal = _GOAL.search(r.goal or "")
        goal_value = float(goal.group(1)) if goal and "dup/new" not in r.goal else None
        labels.append(f"{r.bench}: {r.metric}")
        ratios.append(
            {
                "value": value,
                "color": ("#2e7d32" if goal_value is None or value >= goal_value else "#c62828"),
            }
        )
        goals.append(goal_value)
    style = Style(
        background="white",
        plot_background="white",
        colors=("#2e7d32", "#9e9e9e"),
        font_family="sans-serif",
        label_font_size=11,
        major_label_font_size=11,
    )
    chart = pygal.HorizontalBar(
        title=title,
        style=style,
        js=[],
        width=900,
        height=max(300, 60 + 42 * len(labels)),
        show_legend=True,
        legend_at_bottom=True,
        print_values=True,
        value_formatter=lambda v: f"{v:.2f}" if v is not None else "",
        range=(0, max([1.0, *[r["value"] for r in ratios], *[g for g in goals if g]]) * 1.05),
    )
    chart.x_labels = labels
    chart.add("ratio (green: goal met, red: missed)", ratios)
    chart.add("goal", goals)
    # pygal's small config <script> is dropped, as in support/charts.py: a plain image.
    return re.sub(r"<script\b.*?</script>", "", chart.render(is_unicode=True), flags=re.S)


def write_ratio_chart(rows, path: str, *, title: str) -> None:
    Path(path).write_text(ratio_chart_svg(rows, title=title), encoding="utf-8")


__all__ = ["ratio_chart_svg", "write_ratio_chart"]
