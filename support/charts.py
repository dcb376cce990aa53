"""Dashboard charts: server-rendered SVG (pygal), served by Verity as images.

No CDN and nothing inline in the console page: each chart is an <img> from this origin,
so the page's strict Content-Security-Policy holds. pygal's tooltip script is not
configured (js=[]), and its small config <script> is removed: an SVG shown as an image
never runs scripts anyway, and nothing here needs one.
"""

from __future__ import annotations

import re

import pygal
from pygal.style import Style

from payments.money import currency_code, format_money, to_major
from support import selectors

# Sizes are SVG units at WIDTH; the dashboard draws each chart about as wide as WIDTH
# (two per row at 1440 px, console.css), so a 14-unit label reads at about 14 px and never
# under 11 (tests/browser/test_dashboard_charts_readable.py measures it in Chromium).
WIDTH, HEIGHT = 600, 340
STYLE = Style(
    background="#ffffff",
    plot_background="#ffffff",
    foreground="#1b1f24",
    foreground_strong="#1b1f24",
    foreground_subtle="#4a5360",
    colors=("#0b5cad", "#a3222a", "#8a5a00", "#17663a", "#6b3fa0"),
    font_family="system-ui, sans-serif",
    title_font_size=17,
    label_font_size=14,
    major_label_font_size=14,
    legend_font_size=14,
    value_font_size=14,
    value_label_font_size=14,
    no_data_font_size=16,
)
_SCRIPT = re.compile(rb"<script\b.*?</script>", re.S)


def _config(**kw) -> dict:
    return {
        "js": [],
        "style": STYLE,
        "width": WIDTH,
        "height": HEIGHT,
        "print_values": True,
        "show_y_guides": True,
        "legend_at_bottom": True,
        "truncate_legend": -1,
        "truncate_label": -1,
        **kw,
    }


def _count_labels(values) -> list[int]:
    """Whole-number y labels for counts (pygal would label 0.2, 0.4 … as 0, 0, 1)."""
    top = max([int(v) for v in values if v] or [1])
    step = max(1, -(-top // 5))
    return list(range(0, top + step, step))


def _render(chart) -> bytes:
    return _SCRIPT.sub(b"", chart.render())


def money_at_risk_svg() -> bytes:
    """Unknown exposure per currency (major units), one bar per API client."""
    rows = selectors.money_at_risk()
    currencies = sorted({r.currency for r in rows})
    bars = {
        client: [
            _money_bar(
                sum(
                    r.amount
                    for r in rows
                    if r.currency == c and (r.client or "no client") == client
                ),
                c,
            )
            for c in currencies
        ]
        or [None]
        for client in sorted({r.client or "no client" for r in rows}) or ["none"]
    }
    heights = [b["value"] for values in bars.values() for b in values if b]
    chart = pygal.Bar(
        **_config(
            title="Money at risk (reserved on unknown outcomes)",
            x_title="Currency",
            y_title="Reserved (in the currency)",
            x_labels=[currency_code(c) for c in currencies] or ["—"],
            y_labels=_count_labels(-(-h // 1) for h in heights),
            value_formatter=lambda v: f"{v:,.0f}",
        )
    )
    for client, values in bars.items():
        chart.add(client, values)
    return _render(chart)


def _money_bar(amount_minor: int, currency: str) -> dict | None:
    """One bar: its height in major units, its label from payments.money (a float with
    two decimals would read "1,000.00" for 1 000 JPY)."""
    if not amount_minor:
        return None
    text = format_money(amount_minor, currency)
    return {
        "value": float(to_major(amount_minor, currency)),
        "formatter": lambda _value, text=text: text,
    }


def unknown_age_svg() -> bytes:
    buckets = selectors.unknown_by_age()
    chart = pygal.Bar(
        **_config(
            title="Unknown operations by age",
            show_legend=False,
            x_title="Time since the outcome became unknown",
            y_title="Operations",
            x_labels=[name for name, _ in buckets],
            y_labels=_count_labels(n for _, n in buckets),
            value_formatter=lambda v: f"{v:.0f}" if v else "",
        )
    )
    chart.add("Unknown operations", [n or None for _, n in buckets])
    return _render(chart)


def queue_history_svg() -> bytes:
    labels, series = selectors.queue_history()
    chart = pygal.Line(
        **_config(
            title="Queue sizes, last 7 days",
            x_labels=labels,
            x_title="Day (end of day)",
            y_title="Cases waiting",
            y_labels=_count_labels(v for vs in series.values() for v in vs),
            print_values=False,
            dots_size=3,
            min_scale=1,
            value_formatter=lambda v: f"{v:.0f}",
        )
    )
    for name, values in series.items():
        chart.add(name, values)
    return _render(chart)


def interventions_svg() -> bytes:
    weeks = list(reversed(selectors.manual_interventions()["weeks"]))
    chart = pygal.Bar(
        **_config(
            title="Manual interventions per week",
            x_title="Week starting",
            y_title="Count",
            x_labels=[w.week_start.strftime("%d %b") for w in weeks],
            y_labels=_count_labels(
                n for w in weeks for n in (w.resolutions, w.audited_actions, w.incidents)
            ),
            value_formatter=lambda v: f"{v:.0f}" if v else "",
        )
    )
    chart.add("Manual resolutions", [w.resolutions or None for w in weeks])
    chart.add("Audited actions", [w.audited_actions or None for w in weeks])
    chart.add("Incidents opened", [w.incidents or None for w in weeks])
    return _render(chart)


CHARTS = {
    "money-at-risk": (
        money_at_risk_svg,
        "Money at risk: reserved amounts of operations "
        "whose outcome is unknown, per currency and client",
    ),
    "unknown-age": (unknown_age_svg, "Unknown operations counted by age"),
    "queue-history": (queue_history_svg, "Queue sizes at the end of each of the last 7 days"),
    "interventions": (
        interventions_svg,
        "Manual resolutions, audited actions and incidents per week",
    ),
}
