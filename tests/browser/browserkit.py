# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Open a report in headless Chromium (screenshot, rendered DOM) and read PNGs with the standard library.

Run as a script to render the sample fleet's report and take its screenshot:
    python tests/browser/browserkit.py OUT.png [WIDTHxHEIGHT]
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SETUP = "tests/browser/setup-host.sh"


def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError("chromium is not installed: run `sudo bash %s`" % SETUP)
    return path


def command(url, user_data_dir, screenshot=None, dump_dom=False, size=(1400, 900)):
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            "--user-data-dir=%s" % user_data_dir, "--window-size=%d,%d" % size]
    if screenshot:
        argv.append("--screenshot=%s" % screenshot)
    if dump_dom:
        argv.append("--dump-dom")
    argv.append(url)
    return argv


def _run(argv, timeout=90):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def screenshot(html_path, png_path, size=(1400, 900)):
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = _run(command("file://" + os.path.abspath(html_path), profile, screenshot=os.path.abspath(png_path), size=size))
    if proc.returncode != 0 or not os.path.exists(png_path):
        raise RuntimeError("chromium failed (rc %d): %s" % (proc.returncode, proc.stderr[-2000:]))
    return proc


def dump_dom(html_path, size=(1400, 900)):
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = _run(command("file://" + os.path.abspath(html_path), profile, dump_dom=True, size=size))
    if proc.returncode != 0:
        raise RuntimeError("chromium failed (rc %d): %s" % (proc.returncode, proc.stderr[-2000:]))
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# PNG, standard library only


def png_chunks(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError("bad CRC in %r chunk" % kind)
        yield kind, body
        pos += 12 + length


def png_header(data):
    kind, body = next(png_chunks(data))
    if kind != b"IHDR":
        raise ValueError("first chunk is not IHDR")
    width, height, depth, color, _comp, _filt, interlace = struct.unpack(">IIBBBBB", body)
    return {"width": width, "height": height, "depth": depth, "color": color, "interlace": interlace}


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def png_rows(data):
    """Decoded rows (bytes, RGB or RGBA) of an 8-bit, non-interlaced truecolour PNG."""
    hdr = png_header(data)
    if hdr["depth"] != 8 or hdr["color"] not in (2, 6) or hdr["interlace"]:
        raise ValueError("unsupported PNG layout %r" % hdr)
    bpp = 3 if hdr["color"] == 2 else 4
    raw = zlib.decompress(b"".join(body for kind, body in png_chunks(data) if kind == b"IDAT"))
    stride = hdr["width"] * bpp
    prev = bytearray(stride)
    rows, pos = [], 0
    for _row in range(hdr["height"]):
        ftype = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                line[i] = (line[i] + _paeth(a, b, c)) & 0xFF
            elif ftype != 0:
                raise ValueError("bad filter type %d" % ftype)
        rows.append(bytes(line))
        prev = line
    return hdr, bpp, rows


def colour_counts(data, step=2):
    """{(r, g, b): pixels} over every step-th pixel of every step-th row."""
    hdr, bpp, rows = png_rows(data)
    counts = {}
    for row in rows[::step]:
        for x in range(0, hdr["width"] * bpp, bpp * step):
            rgb = (row[x], row[x + 1], row[x + 2])
            counts[rgb] = counts.get(rgb, 0) + 1
    return counts


def render_sample(dest, title="Nightly GPU hygiene", hosts=None):
    """Write the sample fleet's report into dest (through the code the fleet_report action runs)."""
    sys.path[:0] = [os.path.join(ROOT, ".ansible", "collections"), os.path.join(ROOT, "tests", "lib")]
    from fleet_sample import RUN_STARTED, realistic_fleet

    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._report import FleetReport

    FleetReport(hosts if hosts is not None else realistic_fleet(), dest, title=title, run_started=RUN_STARTED).apply()
    return os.path.join(dest, "report.html")


if __name__ == "__main__":
    out = sys.argv[1]
    w, h = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "1400x900").split("x"))
    with tempfile.TemporaryDirectory() as d:
        screenshot(render_sample(d), out, size=(w, h))
    with open(out, "rb") as f:
        print(out, png_header(f.read()))
