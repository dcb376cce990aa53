"""The dashboard's charts read at a glance on a 1440×900 screen: every word in them is
at least 11 CSS pixels as drawn on the page (the font size inside the SVG times the scale
the page draws the image at), and each axis says what it counts."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from support import charts
from tests.factories import make_client

from .pages import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

MIN_PX = 11.0


def test_chart_words_are_readable_and_axes_are_titled(person_at_desk, live_server, console_people):
    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())
    page = person_at_desk
    log_in(page, live_server.url, "sam")
    page.locator("#charts-h").scroll_into_view_if_needed()
    page.wait_for_function(
        "Array.from(document.querySelectorAll('.charts img'))"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )
    drawn = page.eval_on_selector_all(
        ".charts img",
        "imgs => imgs.map(i => [i.getAttribute('src'), i.getBoundingClientRect().width])",
    )
    screenshot(page, "console-dashboard-charts.png", docs=True, only=".charts")
    assert len(drawn) == len(charts.CHARTS)

    for src, width in drawn:
        page.goto(live_server.url + src)
        svg = page.evaluate("""() => {
          const svg = document.querySelector('svg');
          const texts = Array.from(svg.querySelectorAll('text'))
            .filter(t => t.textContent.trim() && t.getBBox().width > 0);
          return {
            viewBox: svg.viewBox.baseVal.width,
            sizes: texts.map(t => [t.textContent.trim(),
                                   parseFloat(getComputedStyle(t).fontSize)]),
            axisTitles: Array.from(svg.querySelectorAll('.titles .title, text.title'))
              .map(t => t.textContent.trim()),
          };
        }""")
        scale = width / svg["viewBox"]
        smallest = min(svg["sizes"], key=lambda s: s[1])
        assert smallest[1] * scale >= MIN_PX, (src, round(scale, 2), smallest)
        # The chart's title, then the x axis's and the y axis's.
        assert len(svg["axisTitles"]) >= 3, (src, svg["axisTitles"])
