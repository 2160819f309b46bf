# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HTML fleet report opened in a real headless Chromium: it renders, it is not blank, hostile input stays text.

Needs Debian's chromium: `sudo bash tests/browser/setup-host.sh`. Without it these tests fail (they do not skip).
"""

from __future__ import annotations

import html.parser
import os

import browserkit
import pytest
from fleet_sample import HOSTILE_NAME, hostile_fleet, realistic_fleet


def _hex(colour):
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("report"))
    return browserkit.render_sample(d)


def test_png_reader_rejects_garbage(tmp_path):
    with pytest.raises(ValueError):
        browserkit.png_header(b"GIF89a" + b"\0" * 40)


def test_screenshot_is_the_size_asked_and_not_blank(report, tmp_path):
    png = tmp_path / "report.png"
    browserkit.screenshot(report, str(png), size=(1400, 900))
    data = png.read_bytes()
    hdr = browserkit.png_header(data)
    assert (hdr["width"], hdr["height"]) == (1400, 900)
    counts = browserkit.colour_counts(data)
    assert len(counts) > 50, "a blank or nearly blank page: %d colours" % len(counts)
    # Solid areas the stylesheet paints: the header band, the stale holder's red bar, the job's blue bars.
    for name, colour, least in (("header", "#111827", 5000), ("stale GPU bar", "#d92d20", 40), ("job GPU bar", "#1d63d8", 100)):
        assert counts.get(_hex(colour), 0) >= least, "%s (%s) not painted: %d pixels" % (name, colour, counts.get(_hex(colour), 0))
    background = max(counts, key=counts.get)
    assert counts[background] < 0.8 * sum(counts.values())


class DomParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.text, self.attrs = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        cls = dict(attrs).get("class") or ""
        if tag == "tr":
            self.rows.append(cls)

    def handle_data(self, data):
        self.text.append(data)


def test_rendered_dom_holds_the_matrix(report):
    dom = browserkit.dump_dom(report)
    p = DomParser()
    p.feed(dom)
    assert "table" in p.tags
    hosts = [r for r in p.rows if r.startswith("h ")]
    assert len(hosts) == len(realistic_fleet()) == 12
    assert sum(1 for r in hosts if r == "h bad") == 6  # four not ready, two with warnings
    assert len([r for r in p.rows if r.startswith("node ")]) == 3
    text = "".join(p.text)
    assert "What needs attention" in text and "train-b1" in text
    # The job's last tok/s against its baseline, and each GPU's health with what to do.
    assert "tok/s" in text and "12,80064% of 20,000" in text
    assert "GPU health" in text and "GPU1 degraded" in text and "GPU0 unhealthy" in text
    assert "GPU0: Xid 48: double-bit ECC error (uncorrectable) at 02:58:11" in text
    assert "\u2192 drain the GPU, reset it (nvidia-smi -r); RMA if it recurs" in text


def _painted(hosts, tmp_path, name, colour):
    page = browserkit.render_sample(str(tmp_path / name), hosts=hosts)
    png = tmp_path / (name + ".png")
    browserkit.screenshot(page, str(png), size=(1400, 2000))
    return browserkit.colour_counts(png.read_bytes()).get(_hex(colour), 0)


def test_the_throughput_cell_and_the_gpu_health_cards_are_painted(tmp_path):
    """The same page but for the job's tok/s at its baseline and gpu_healthy without its GPUs (the
    matrix laid out alike): the low tok/s cell's amber and the GPU health cards' red chips are
    painted only in the page that has them."""
    bare = realistic_fleet()
    for h in bare:
        for c in h["checks"]:
            c.pop("gpus", None)
            if c.get("throughput"):
                c["throughput"].update(tokens_per_s=20000.0, ratio=1.0)
    amber = _painted(realistic_fleet(), tmp_path, "full", "#fef4e6") - _painted(bare, tmp_path, "bare", "#fef4e6")
    red = _painted(realistic_fleet(), tmp_path, "full2", "#fdecea") - _painted(bare, tmp_path, "bare2", "#fdecea")
    # The low tok/s cell and the degraded GPU's chip; the unhealthy GPU's chip.
    assert amber > 1200 and red > 400, (amber, red)


def test_hostile_names_stay_text_in_the_browser(tmp_path):
    page = browserkit.render_sample(str(tmp_path), title='<img src=x onerror="document.title=1">', hosts=hostile_fleet())
    dom = browserkit.dump_dom(page)
    p = DomParser()
    p.feed(dom)
    assert "img" not in p.tags and "svg" not in p.tags and "u" not in p.tags and "em" not in p.tags
    # ours: the GPU's label, the tok/s value; the GPU's bar
    assert p.tags.count("b") == 2 and p.tags.count("i") == 1
    assert [a for a in p.attrs if a[0] == "href"] == [("href", n) for n in ("report.json", "report.junit.xml", "gpufleet_hygiene.prom")]
    assert not [a[0] for a in p.attrs if a[0].startswith("on")]
    assert p.tags.count("script") == 1
    text = "".join(p.text)
    assert HOSTILE_NAME.split("\n", maxsplit=1)[0] in text
    assert '<b onmouseover="alert(2)">python3</b>' in text
    assert '<svg onload="alert(3)">Xid</svg>' in text and "<a href=x>reset</a>" in text
    assert "driver <em>570</em> pinned 570.133.20" in text and "1,234" in text
    assert os.path.exists(page)
