# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shipped scheduling files read as systemd and cron read them, so that tests run what they
would run: the service's settings in order (Environment= repeats), its ExecStart expanded as
systemd expands it, the cron entry's variables and command. Plain Python, no pytest."""

from __future__ import annotations

import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = os.path.join(ROOT, "contrib", "systemd")
SERVICE = os.path.join(UNITS, "gpufleet-hygiene.service")
TIMER = os.path.join(UNITS, "gpufleet-hygiene.timer")
CRON = os.path.join(ROOT, "contrib", "cron", "gpufleet-hygiene")

# The paths the files document, which a test replaces with its own.
INSTALL_DIR = "/opt/gpufleet-hygiene"
CONFIG_DIR = "/etc/gpufleet-hygiene"
STATE_DIR = "/var/lib/gpufleet-hygiene"
# The run lock: its directory (the user's, 0700) in the state directory; the runner that takes it.
LOCK_DIR = STATE_DIR + "/lock"
LOCK = LOCK_DIR + "/gpufleet-hygiene.lock"
RUNNER = INSTALL_DIR + "/contrib/bin/gpufleet-hygiene-run"


def unit(path):
    """{section: [(key, value), ...]} in file order: keys such as Environment= repeat."""
    sections, current, pending = {}, None, ""
    with open(path) as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            if line.endswith("\\"):
                pending = line[:-1] + " "  # systemd joins a continued line with a space
                continue
            pending = ""
            stripped = line.strip()
            if not stripped or stripped[0] in "#;":
                continue
            if stripped.startswith("[") and stripped.endswith("]"):
                current = sections.setdefault(stripped[1:-1], [])
            else:
                key, _sep, value = stripped.partition("=")
                current.append((key.strip(), value.strip()))
    return sections


def setting(section, key):
    """The last value of key in a section, as systemd takes a single-valued setting."""
    values = [v for k, v in section if k == key]
    return values[-1] if values else None


def _unquote(value):
    value = value.strip()
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def environment_file(path):
    """{name: value} of an EnvironmentFile (KEY=value lines, comments, quoted values)."""
    env = {}
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            key, _sep, value = line.partition("=")
            env[key.strip()] = _unquote(value)
    return env


def service_environment(service, base, substitute):
    """The service's environment: base, then Environment= in order, then each EnvironmentFile=
    (which systemd reads last: its settings override Environment=), every path substituted."""
    env = dict(base)
    for key, value in service:
        if key == "Environment":
            for word in shlex.split(substitute(value)):
                name, _sep, val = word.partition("=")
                env[name] = val
    for key, value in service:
        if key == "EnvironmentFile":
            optional = value.startswith("-")
            path = substitute(value.lstrip("-"))
            if os.path.exists(path):
                env.update(environment_file(path))
            elif not optional:
                raise FileNotFoundError(path)
    return env


_WHOLE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def exec_argv(command, env):
    """ExecStart's argv as systemd makes it: "$NAME" alone is the value split at whitespace
    (no word when empty), "${NAME}" is the value as part of one word."""
    argv = []
    for word in shlex.split(command):
        whole = _WHOLE.match(word)
        if whole:
            argv += env.get(whole.group(1), "").split()
        else:
            argv.append(_BRACED.sub(lambda m: env.get(m.group(1), ""), word))
    return argv


def cron():
    """(variables, entries) of the cron.d file: {name: value} and [(schedule, user, command)]."""
    variables, entries = {}, []
    with open(CRON) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if re.match(r"^[A-Za-z_][A-Za-z0-9_]*\s*=", line):
                name, _sep, value = line.partition("=")
                variables[name.strip()] = _unquote(value)
                continue
            minute, hour, dom, month, dow, user, command = line.split(None, 6)
            entries.append(((minute, hour, dom, month, dow), user, command))
    return variables, entries


def substituter(mapping):
    """A function replacing each documented path (a key of mapping) by the test's own."""

    def substitute(text):
        for documented in sorted(mapping, key=len, reverse=True):
            text = text.replace(documented, mapping[documented])
        return text

    return substitute


def _runner_at(argv):
    return next((i for i, a in enumerate(argv) if a.endswith("/gpufleet-hygiene-run")), None)


def lock_file(argv):
    """The lock file a command line takes: gpufleet-hygiene-run's (LOCK_DIR -- ...), or that of a
    flock command line (flock [options] FILE COMMAND ...), as earlier units had."""
    at = _runner_at(argv)
    if at is not None:
        return os.path.join(argv[at + 1], "gpufleet-hygiene.lock")
    assert os.path.basename(argv[0]) == "flock", argv
    return next(a for a in argv[1:] if not a.startswith("-") and not a.isdigit())


def with_command(argv, command):
    """The command line with the playbook's command replaced by command (the lock taken as before)."""
    at = _runner_at(argv)
    if at is not None:
        return argv[:argv.index("--", at) + 1] + list(command)
    return argv[:argv.index(lock_file(argv)) + 1] + list(command)


def success_statuses(service):
    """The exit statuses systemd counts as the service's success: 0 and SuccessExitStatus=."""
    return {0} | {int(v) for v in (setting(service, "SuccessExitStatus") or "").split() if v.isdigit()}
