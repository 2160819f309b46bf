# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Baselines as users have them: PEP 751 ``pylock.toml`` and requirements files (``pip freeze``,
``uv export``, ``uv pip compile``, with hashes, editables, markers and direct URLs).

Both parse into ``{canonical name: {"name", "version" (a pin, or None), "spec"}}``. A line that
is neither is a BaselineError naming the file and the line.

Python 3.9 targets have no tomllib, and tomllib (3.11) would make one lock valid on one target
and not on another: the TOML read here is a small scanner of the subset a lock needs (tables,
arrays of tables, keys, strings; other values skipped), one pass over the text, bounded in size.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._names import canonical_name

MAX_BYTES = 16 << 20  # torch's own lock is some kilobytes; a larger file is no lock


class BaselineError(GpufleetError):
    """A baseline that cannot be read as a lock: the message names the file and the line."""


def is_pylock(what, text):
    """A PEP 751 lock by its name (``pylock.toml``, ``pylock.<name>.toml``), or, for any other
    name, by its first statement (``lock-version`` or a ``[[packages]]`` table)."""
    base = os.path.basename(what)
    if base.endswith(".toml") or base == "uv.lock":
        return True
    for raw in text.split("\n", 200)[:200]:
        line = raw.strip()
        if line and not line.startswith("#"):
            return line.startswith(("lock-version", "["))  # no requirement starts with a bracket
    return False


def parse_lock(data, what):
    """The packages a baseline pins, from a pylock.toml or a requirements file (bytes)."""
    if len(data) > MAX_BYTES:
        raise BaselineError("%s is %d bytes, more than a lock holds (%d): not read" % (what, len(data), MAX_BYTES))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise BaselineError("%s line %d is not valid UTF-8 (%s)" % (what, line, exc.reason)) from None
    text = text.removeprefix("\ufeff")
    return parse_pylock(text, what) if is_pylock(what, text) else parse_requirements(text, what)


# ---------------------------------------------------------------------------- requirements

_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _NAME_START | frozenset("._-")


def _logical_lines(text):
    """(first line number, text) of each logical line: a trailing backslash continues it (as
    uv and pip-compile write ``--hash`` options under a pin)."""
    start, parts = None, []
    for lineno, physical in enumerate(text.split("\n"), 1):
        raw = physical.removesuffix("\r")
        if start is None:
            start = lineno
        if raw.endswith("\\"):
            parts.append(raw[:-1])
            continue
        parts.append(raw)
        yield start, " ".join(parts)
        start, parts = None, []
    if parts:
        yield start, " ".join(parts)


def _strip_comment(line):
    """A line without its comment: ``#`` at its start or after whitespace (a URL's ``#egg=`` stays)."""
    if line.lstrip().startswith("#"):
        return ""
    for sep in (" #", "\t#"):
        line = line.split(sep, 1)[0]
    return line.strip()


def _split_name(line):
    """(name, rest) of a requirement, or (None, line) when it starts with no name."""
    if not line or line[0] not in _NAME_START:
        return None, line
    end = 1
    while end < len(line) and line[end] in _NAME_CHARS:
        end += 1
    name = line[:end].rstrip("._-")
    return name, line[len(name):]


def _wheel_version(url, name):
    """The version in a wheel URL's file name, when it is this project's wheel."""
    base = url.rsplit("/", 1)[-1].split("#", 1)[0].split("?", 1)[0]
    if not base.endswith(".whl"):
        return None
    parts = base[:-4].split("-")
    if len(parts) >= 5 and canonical_name(parts[0]) == canonical_name(name):
        return parts[1]
    return None


def parse_requirements(text, what):
    """A requirements file, as ``pip freeze``, ``uv pip freeze``, ``uv export`` and ``uv pip
    compile`` write it: ``name==version``, ``name[extra]==version``, ``name @ url``,
    ``--hash`` options (on continuation lines), ``; markers``, comments, ``-e`` (named by
    ``#egg=``; a bare path names no package and is left out), other options (``-r``,
    ``--index-url``) skipped."""
    wanted = {}
    for lineno, logical in _logical_lines(text):
        line = _strip_comment(logical)
        if not line:
            continue
        if line.startswith("-"):
            option = line.split(None, 1)[0].split("=", 1)[0]
            value = line[len(option):].lstrip(" \t=")
            if option in ("-e", "--editable") and "#egg=" in value:
                name = value.split("#egg=", 1)[1].split("&", 1)[0].strip()
                if name:
                    wanted[canonical_name(name)] = {"name": name, "version": None, "spec": line}
            continue
        line = line.split(";", 1)[0].strip()  # environment markers: the pin holds where the venv is
        # --hash options after the pin (any other option here is not a requirement's)
        line = " ".join(w for w in line.split() if not w.startswith("--hash")).strip()
        name, rest = _split_name(line)
        if name is None:
            raise BaselineError("%s line %d is not a requirement: %r" % (what, lineno, logical.strip()[:80]))
        rest = rest.strip()
        if rest.startswith("["):
            close = rest.find("]")
            if close < 0:
                raise BaselineError("%s line %d has an unclosed [extras]: %r" % (what, lineno, logical.strip()[:80]))
            rest = rest[close + 1:].strip()
        version = None
        if rest.startswith("@"):
            url = rest[1:].strip()
            if not url or " " in url:
                raise BaselineError("%s line %d has no URL after '@': %r" % (what, lineno, logical.strip()[:80]))
            version = _wheel_version(url, name)
        elif rest.startswith("==="):
            version = rest[3:].strip()
        elif rest.startswith("==") and "," not in rest and "*" not in rest:
            version = rest[2:].strip()
        elif rest and not rest.startswith(("==", ">=", "<=", "!=", "~=", "<", ">", "(")):
            raise BaselineError("%s line %d is not a requirement: %r" % (what, lineno, logical.strip()[:80]))
        if version is not None and (not version or " " in version):
            raise BaselineError("%s line %d has a malformed version: %r" % (what, lineno, logical.strip()[:80]))
        wanted[canonical_name(name)] = {"name": name, "version": version, "spec": rest}
    return wanted


# ---------------------------------------------------------------------------- pylock.toml

_BARE_KEY = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\", "e": "\x1b"}


class _Scanner(object):
    """One pass over a TOML text, reading only what a lock's packages need."""

    def __init__(self, text, what):
        self.s = text
        self.n = len(text)
        self.i = 0
        self.line = 1
        self.what = what

    def fail(self, msg):
        raise BaselineError("%s line %d: %s (not a PEP 751 pylock.toml)" % (self.what, self.line, msg))

    def peek(self, k=1):
        return self.s[self.i:self.i + k]

    def spaces(self):
        while self.i < self.n and self.s[self.i] in " \t":
            self.i += 1

    def blank(self):
        """Whitespace, newlines and comments (inside arrays)."""
        while self.i < self.n:
            c = self.s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "#":
                self.comment()
            else:
                return

    def comment(self):
        end = self.s.find("\n", self.i)
        self.i = self.n if end < 0 else end

    def end_of_line(self):
        self.spaces()
        if self.peek() == "#":
            self.comment()
        if self.peek(2) == "\r\n":
            self.i += 1
        if self.i < self.n and self.s[self.i] != "\n":
            self.fail("unexpected %r after a value" % self.s[self.i:self.i + 20].split("\n", 1)[0])
        if self.i < self.n:
            self.i += 1
            self.line += 1

    def string(self):
        quote = self.s[self.i]
        if self.peek(3) == quote * 3:
            return self.multiline(quote * 3)
        self.i += 1
        out = []
        while True:
            if self.i >= self.n or self.s[self.i] == "\n":
                self.fail("a string is not closed on its line")
            c = self.s[self.i]
            if c == quote:
                self.i += 1
                return "".join(out)
            if c == "\\" and quote == '"':
                self.i += 1
                out.append(self.escape())
                continue
            out.append(c)
            self.i += 1

    def escape(self):
        c = self.peek()
        if c in _ESCAPES:
            self.i += 1
            return _ESCAPES[c]
        if c in ("u", "U"):
            width = 4 if c == "u" else 8
            digits = self.s[self.i + 1:self.i + 1 + width]
            try:
                value = chr(int(digits, 16)) if len(digits) == width else None
            except ValueError:
                value = None
            if value is None:
                self.fail("a malformed \\%s escape" % c)
            self.i += 1 + width
            return value
        self.fail("an unknown escape \\%s" % c)
        return ""

    def multiline(self, delim):
        end = self.s.find(delim, self.i + 3)
        if end < 0:
            self.fail("a multi-line string is not closed")
        while end + 3 < self.n and self.s[end + 3] == delim[0]:
            end += 1  # up to two quotes may end the content
        value = self.s[self.i + 3:end]
        self.line += value.count("\n")
        self.i = end + 3
        return value

    def key(self):
        """A dotted key, as a tuple of parts."""
        parts = []
        while True:
            self.spaces()
            c = self.peek()
            if c in ('"', "'"):
                if self.peek(3) == c * 3:
                    self.fail("a key cannot be a multi-line string")
                parts.append(self.string())
            else:
                start = self.i
                while self.i < self.n and self.s[self.i] in _BARE_KEY:
                    self.i += 1
                if start == self.i:
                    self.fail("expected a key, found %r" % self.s[self.i:self.i + 20])
                parts.append(self.s[start:self.i])
            self.spaces()
            if self.peek() != ".":
                return tuple(parts)
            self.i += 1

    def value(self):
        """A string's text; any other value is skipped (None). Arrays and inline tables may run
        over lines; their strings are read so that a bracket inside one is not counted."""
        c = self.peek()
        if c in ('"', "'"):
            return self.string()
        if c in ("[", "{"):
            closers = []
            opened = self.line
            while True:
                c = self.peek()
                if not c:
                    self.line = opened
                    self.fail("an array or inline table is not closed")
                if c in ("[", "{"):
                    closers.append("]" if c == "[" else "}")
                    self.i += 1
                elif c in ("]", "}"):
                    if c != closers.pop():
                        self.fail("mismatched %r" % c)
                    self.i += 1
                    if not closers:
                        return None
                elif c in ('"', "'"):
                    self.string()
                elif c in " \t\r\n#":
                    self.blank()
                else:
                    self.i += 1
        start = self.i  # a number, a boolean, a date (which may hold a space): to the line's end
        while self.i < self.n and self.s[self.i] not in "\r\n#,]}":
            self.i += 1
        if not self.s[start:self.i].strip():
            self.fail("expected a value")
        return None

    def header(self):
        """``[table]`` or ``[[array of tables]]``: (key, is_array)."""
        array = self.peek(2) == "[["
        self.i += 2 if array else 1
        key = self.key()
        close = "]]" if array else "]"
        if self.peek(len(close)) != close:
            self.fail("a table header is not closed with %r" % close)
        self.i += len(close)
        return key, array


def parse_pylock(text, what):
    """The ``name`` and ``version`` of every ``[[packages]]`` table of a PEP 751 lock."""
    sc = _Scanner(text, what)
    packages = []  # (line, {key: value})
    current = None  # the [[packages]] table whose keys are being read, else None
    saw_uv_lock = False
    while True:
        sc.blank()
        if sc.i >= sc.n:
            break
        line = sc.line
        if sc.peek() == "[":
            key, array = sc.header()
            current = None
            if key == ("packages",) and array:
                current = {}
                packages.append((line, current))
            elif key == ("package",) and array:
                saw_uv_lock = True
            sc.end_of_line()
            continue
        key = sc.key()
        if sc.peek() != "=":
            sc.fail("expected '=' after the key %s" % ".".join(key))
        sc.i += 1
        sc.spaces()
        value = sc.value()
        sc.end_of_line()
        if current is not None and key in (("name",), ("version",)):
            if key[0] in current:
                raise BaselineError("%s line %d: %s given twice in one [[packages]] table" % (what, line, key[0]))
            if not isinstance(value, str):
                raise BaselineError("%s line %d: %s must be a string" % (what, line, key[0]))
            current[key[0]] = value
    if not packages and saw_uv_lock:
        raise BaselineError(
            "%s is uv's own uv.lock, which lists every platform's packages: give a lock of this venv instead, "
            "from 'uv export --format pylock.toml' or 'uv export --format requirements-txt'" % what)
    wanted = {}
    for line, table in packages:
        name = table.get("name")
        if not name or _split_name(name)[0] != name:
            raise BaselineError("%s line %d: the [[packages]] table has %s" % (
                what, line, "no name" if not name else "a name that is no package name: %r" % name[:80]))
        version = table.get("version")
        wanted[canonical_name(name)] = {"name": name, "version": version, "spec": "==%s" % version if version else ""}
    return wanted
