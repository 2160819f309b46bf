# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Xid events: every code's severity and action pinned one by one, the driver's MIG form, and the
lines that only look like the driver's (forged) refused: quoted inside another kernel message,
written to /dev/kmsg by a process (user facility), or after a user-space prefix. The read is
bounded in time (the last 24 hours unless told), on the node path too.

The line formats are the driver's own (open-gpu-kernel-modules' format strings):
``NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s`` and, on a MIG GPU,
``NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, ...`` (or with ``GPU-I`` only)."""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import stat
import subprocess
import sys
import time

import pytest
from gpufakes import H200_XML  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _findings, _health, _xid, _xml
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _node

STANDINS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "standins"))

NOW = datetime.datetime(2026, 12, 1, 16, 0, 0, tzinfo=datetime.timezone.utc)
BOOT = (NOW - datetime.timedelta(days=3)).timestamp()  # booted three days before NOW


def kmsg(message, prio=4, ago=60.0, seq=1):
    """A /dev/kmsg record of ``message`` logged ``ago`` seconds before NOW (prio: facility << 3 | level)."""
    usec = int((NOW.timestamp() - ago - BOOT) * 1e6)
    return "%d,%d,%d,-;%s\n" % (prio, seq, usec, message)


# Every code of the table: (code, severity, the action asked for, why: the test id).
TABLE = [
    (13, "warn", "restart the application; if it recurs on this GPU only, run diagnostics (dcgmi diag)",
     "13-graphics-exception-is-the-application-s-fault-warn"),
    (31, "warn", "restart the application; if it recurs across applications, reset the GPU and run diagnostics",
     "31-mmu-fault-is-an-invalid-address-of-the-application-warn"),
    (43, "warn", "restart the application", "43-channel-reset-gpu-stays-usable-warn"),
    (45, "warn", "look at the Xid logged before it; alone it needs no action", "45-preemptive-cleanup-follows-another-event-warn"),
    (48, "fail", "drain the GPU and reset it; if it recurs or row remapping fails, RMA", "48-double-bit-ecc-uncorrectable-fail"),
    (63, "fail", "drain and reset the GPU to apply the remapping (no RMA yet)", "63-row-remap-pending-needs-a-reset-fail"),
    (64, "fail", "drain the GPU and RMA it (the memory can no longer be repaired in the field)",
     "64-row-remap-failure-cannot-be-repaired-fail"),
    (74, "fail", "drain and reset the GPU (all GPUs of the NVLink domain if needed); if it recurs, check the links and RMA",
     "74-nvlink-fault-fail"),
    (79, "fail", "drain the node and reboot (power-cycle) it; if it recurs, check PCIe, power and cooling, then RMA",
     "79-fallen-off-the-bus-needs-a-power-cycle-fail"),
    (92, "warn", "watch the ECC counters; reset the GPU at the next drain, RMA if it persists",
     "92-high-single-bit-rate-is-corrected-warn"),
    (94, "fail", "restart the affected application; reset the GPU at the next drain to remap the row",
     "94-contained-ecc-still-needs-a-row-remap-fail"),
    (95, "fail", "drain the GPU and reset it; if it recurs, RMA", "95-uncontained-ecc-hits-every-application-fail"),
    (119, "fail", "drain and reset the GPU; if it recurs, reboot the node and update the driver, then contact support",
     "119-gsp-rpc-timeout-fail"),
]


def test_the_table_has_a_row_for_every_code_and_no_other():
    """A code added to (or dropped from) the collection's table without its row here fails."""
    assert sorted(_xid.XID_CODES) == sorted(row[0] for row in TABLE)


@pytest.mark.parametrize("code, severity, action", [pytest.param(*row[:3], id=row[3]) for row in TABLE])
def test_every_code_s_severity_and_action_read_from_the_driver_s_lines(code, severity, action):
    """The code as the driver logs it, without and with MIG attribution: the same verdict."""
    records = [kmsg("NVRM: Xid (PCI:0000:3b:00): %d, pid=4242, name=python3, event text" % code, seq=1),
               kmsg("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): %d, pid=4242, name=python3, event text" % code, seq=2)]
    events = _xid.parse_kmsg(records, BOOT)
    assert [(e["xid"], e["severity"], e["action"]) for e in events] == [(code, severity, action)] * 2
    assert _xid.explain(code) == {"severity": severity, "meaning": _xid.XID_CODES[code][1], "action": action}


def test_a_code_not_in_the_table_warns_and_says_where_to_look():
    event = _xid.parse_line("NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action")
    assert (event["xid"], event["severity"], event["action"]) == (154, "warn", "look it up in NVIDIA's Xid catalog")


@pytest.mark.parametrize("line, pci, gi, ci, code, pid", [
    pytest.param("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 13, pid=9, name=python3, Graphics Exception",
                 "0000:3b:00", 1, 0, 13, 9, id="mig-gpu-and-compute-instance"),
    pytest.param("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
                 "0000:01:00", 5, None, 94, 7194, id="mig-gpu-instance-only-contained-ecc"),
    pytest.param("NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No",
                 "0000:01:00", None, None, 95, 7062, id="no-mig-uncontained-ecc"),
    pytest.param("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", None, None, 14, None,
                 id="older-driver-without-pci-prefix"),
])
def test_the_driver_s_line_forms_are_parsed(line, pci, gi, ci, code, pid):
    event = _xid.parse_line(line)
    assert (event["pci"], event.get("gpu_instance"), event.get("compute_instance"), event["xid"], event["pid"]) == (
        pci, gi, ci, code, pid)


def test_a_mig_xid_lands_on_its_gpu_by_pci_address():
    """The MIG form's address ties the event to the GPU (the recorded H200's, PCI 0000:00:06) as the
    plain form does: an Xid 79 of one of its instances makes the GPU unhealthy."""
    _driver, gpus = _xml.parse_xml(H200_XML)
    [event] = _xid.parse_kmsg([kmsg("NVRM: Xid (PCI:0000:00:06 GPU-I:01 GPU-CI:00): 79, pid=1, name=a, GPU has fallen off the bus.")],
                              BOOT)
    host = _findings.assess(gpus, "580.159.04", None, [event], None, True)
    assert host == [] and [e["xid"] for e in gpus[0]["xid"]] == [79]
    assert ("xid_79", "fail") in [(f["code"], f["severity"]) for f in gpus[0]["findings"]] and not gpus[0]["healthy"]


# ------------------------------------------------------------------------------- forged lines

FORGED_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus."


@pytest.mark.parametrize("record", [
    # A refused overlay mount in a user namespace logs the option it was given, at kernel facility.
    pytest.param(kmsg('overlayfs: failed to resolve \'%s\': -2' % FORGED_79), id="unanchored-quoted-in-another-kernel-message"),
    pytest.param(kmsg("x " + FORGED_79), id="unanchored-anything-before-it"),
    # What a process writes to /dev/kmsg gets the user facility (1) whatever prefix it sends.
    pytest.param(kmsg(FORGED_79, prio=(1 << 3) | 4), id="wrong-facility-user-written-to-kmsg"),
    pytest.param(kmsg(FORGED_79, prio=(3 << 3) | 3), id="wrong-facility-daemon"),
    pytest.param(kmsg("python3[4242]: " + FORGED_79, prio=(1 << 3) | 6), id="user-space-prefix"),
    pytest.param(kmsg("NVRM: Xid (PCI:0000:3b:00): 79 GPU has fallen off the bus."), id="not-the-driver-s-format-no-comma"),
    pytest.param(kmsg("NVRM: Xid (PCI:0000:3b:00 owned-by-me): 79, x"), id="not-the-driver-s-format-odd-parenthesis"),
])
def test_a_forged_kmsg_line_is_no_event(record):
    assert _xid.parse_kmsg([record, kmsg("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, real", seq=2)], BOOT) == [
        dict(_xid.parse_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, real"),
             time=(NOW - datetime.timedelta(seconds=60)).isoformat())]


DMESG_STAMP = "2026-12-01T15:59:00,000000+00:00"


@pytest.mark.parametrize("line, events", [
    pytest.param("%s %s" % (DMESG_STAMP, FORGED_79), 1, id="the-driver-s-line"),
    pytest.param("%s [  T4242] %s" % (DMESG_STAMP, FORGED_79), 1, id="the-driver-s-line-with-printk-caller"),
    pytest.param("%s overlayfs: failed to resolve '%s'" % (DMESG_STAMP, FORGED_79), 0, id="unanchored-quoted"),
    pytest.param("%s python3[4242]: %s" % (DMESG_STAMP, FORGED_79), 0, id="user-space-prefix"),
    pytest.param("    %s" % FORGED_79, 0, id="no-timestamp-a-continuation-line"),
])
def test_dmesg_lines_count_only_at_the_message_s_start(line, events):
    assert len(_xid.parse_dmesg(line + "\n")) == events


def test_dmesg_is_asked_for_the_kernel_facility_only(tmp_path):
    """A real dmesg run (a stand-in script) gets --facility kern: what processes log is not read."""
    argv_file = tmp_path / "argv"
    dmesg = tmp_path / "dmesg"
    dmesg.write_text("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s\necho '%s %s'\n" % (argv_file, DMESG_STAMP, FORGED_79))
    os.chmod(dmesg, stat.S_IRWXU)
    rc, out, _err = _xid.run_dmesg(str(dmesg), 10)
    args = argv_file.read_text().split()
    assert rc == 0 and args[args.index("--facility") + 1] == "kern" and FORGED_79 in out


def test_a_file_in_the_place_of_dev_kmsg_is_not_the_kernel_s_log(tmp_path):
    fake = tmp_path / "kmsg"
    fake.write_text(kmsg(FORGED_79))
    with pytest.raises(OSError) as exc:
        _xid.read_kmsg(str(fake))
    assert "not the kernel's log device" in str(exc.value)
    os.symlink("/dev/kmsg", str(tmp_path / "link"))
    with pytest.raises(OSError):
        _xid.read_kmsg(str(tmp_path / "link"))  # a link is not followed, even to the real device


# ------------------------------------------------------------------------------- the read's bound

def test_since_defaults_to_the_last_24_hours_and_boot_reads_everything():
    assert _xid.parse_since(None, now=NOW) == NOW - datetime.timedelta(hours=24)
    assert _xid.parse_since("", now=NOW) == NOW - datetime.timedelta(hours=24)
    assert _xid.parse_since("boot", now=NOW) is None
    assert _xid.parse_since("3600", now=NOW) == NOW - datetime.timedelta(hours=1)
    records = [kmsg(FORGED_79, ago=2 * 86400, seq=1), kmsg(FORGED_79.replace("79", "48", 1), ago=3600, seq=2)]
    assert [e["xid"] for e in _xid.parse_kmsg(records, BOOT, _xid.parse_since(None, now=NOW))] == [48]
    assert [e["xid"] for e in _xid.parse_kmsg(records, BOOT, None)] == [79, 48]


def test_a_record_without_a_time_is_not_within_a_bound():
    assert _xid.parse_kmsg(["4,1,notatime,-;" + FORGED_79], BOOT, NOW - datetime.timedelta(hours=1)) == []


class _Module:
    def __init__(self):
        self.warnings = []

    def get_bin_path(self, name):
        return None

    def warn(self, text):
        self.warnings.append(text)


def test_the_node_path_reads_only_the_last_24_hours_by_default(monkeypatch):
    """node_readiness's fold (gpu_read=node): an Xid 79 of two days ago in the node's ring buffer is
    not folded into its containers' checks; one of an hour ago is."""
    now = datetime.datetime.now(datetime.timezone.utc)
    boot = (now - datetime.timedelta(days=3)).timestamp()

    def record(code, ago, seq):
        return "4,%d,%d,-;NVRM: Xid (PCI:0000:3b:00): %d, pid=1, name=a, text\n" % (seq, int((now.timestamp() - ago - boot) * 1e6), code)

    buffer = [record(79, 2 * 86400, 1)]
    seen = []

    def reader(since=None, **_kw):
        seen.append(since)
        return _xid.parse_kmsg(buffer, boot, since), None

    real = _health.read_health
    monkeypatch.setattr(_node, "read_health", lambda **kw: real(cdll=_no_nvml, xid_reader=reader, **kw))
    containers = [{"host": "train-101", "args": {"gpu_health": True}}]
    results = {"train-101": {"ready": True, "checks": []}}
    assert _node.fold_node_health(_Module(), results, containers, None, 5) == 0
    assert seen[0] is not None and now - datetime.timedelta(hours=24, seconds=30) < seen[0] < now - datetime.timedelta(hours=23)
    buffer.append(record(13, 3600, 2))
    assert _node.fold_node_health(_Module(), results, containers, None, 5) == 1


def _no_nvml(name):
    raise OSError("no %s here" % name)


# ------------------------------------------------------------------------------- PCI addresses


@pytest.mark.parametrize("bus_id, key", [
    pytest.param("0000:3b:00", (0, 0x3B, 0), id="the-driver-s-form"),
    pytest.param("00000000:3B:00.0", (0, 0x3B, 0), id="nvidia-smi-s-form-long-domain-function-upper-case"),
    pytest.param("0001:ff:1f", (1, 0xFF, 0x1F), id="hexadecimal-digits-above-nine"),
    pytest.param("3b:00", (0, 0x3B, 0), id="no-domain-is-domain-0"),
    pytest.param("3b", None, id="a-bus-alone-is-no-address"),
    pytest.param("1:0000:3b:00", None, id="four-parts-are-no-address"),
    pytest.param("0000:zz:00", None, id="not-hexadecimal"),
    pytest.param("", None, id="empty"),
])
def test_a_pci_address_is_keyed_by_domain_bus_and_device(bus_id, key):
    assert _xid.pci_key(bus_id) == key


def test_an_xid_of_a_longer_address_lands_on_no_gpu_of_its_last_three_parts():
    """An address of four parts is no GPU's: its event stays on the host, not on the GPU whose
    domain, bus and device its last three parts are."""
    _driver, gpus = _xml.parse_xml(H200_XML)
    event = dict(_xid.parse_line("NVRM: Xid (PCI:0000:00:06): 79, pid=1, name=a, GPU has fallen off the bus."),
                 pci="0001:0000:00:06")
    host = _findings.assess(gpus, "580.159.04", None, [event], None, True)
    assert gpus[0]["xid"] == [] and [f["code"] for f in host] == ["xid_79"]


# ------------------------------------------------------------------------------- /dev/kmsg records


def test_an_event_within_the_second_after_since_counts():
    """``since`` is compared to the record's microseconds: a record 0.5 s into a second is after a
    bound 0.3 s into it (and before one 0.7 s into it)."""
    boot = datetime.datetime(2026, 12, 1, 14, 0, tzinfo=datetime.timezone.utc)
    record = "4,1,%d,-;%s\n" % (3600500000, FORGED_79)  # 15:00:00.5
    hour = boot + datetime.timedelta(hours=1)
    assert [e["xid"] for e in _xid.parse_kmsg([record], boot.timestamp(), hour + datetime.timedelta(milliseconds=300))] == [79]
    assert _xid.parse_kmsg([record], boot.timestamp(), hour + datetime.timedelta(milliseconds=700)) == []


def test_a_record_of_two_fields_has_no_time_and_is_read_without_a_bound():
    [event] = _xid.parse_kmsg(["4,1;" + FORGED_79], BOOT)
    assert (event["xid"], event["time"]) == (79, None)


def test_a_record_of_three_fields_has_its_time():
    """prio,seq,usec without the flags field: the time is the third field's."""
    [event] = _xid.parse_kmsg(["4,1,%d;%s" % (int((NOW.timestamp() - 60 - BOOT) * 1e6), FORGED_79)], BOOT)
    assert event["time"] == (NOW - datetime.timedelta(seconds=60)).isoformat()


@pytest.mark.parametrize("usec, when", [
    pytest.param(259199900000, "2026-12-01T15:59:59+00:00", id="nine-tenths-into-a-second"),
    pytest.param(259199100000, "2026-12-01T15:59:59+00:00", id="one-tenth-into-a-second"),
])
def test_a_record_s_time_is_boot_plus_its_microseconds_to_the_second(usec, when):
    """Three days after boot a divisor off by one part in a million moves the time by 0.26 s: the
    record's second is boot + usec / 1,000,000, cut to the second."""
    [event] = _xid.parse_kmsg(["4,1,%d,-;%s" % (usec, FORGED_79)], BOOT)
    assert event["time"] == when


class _Reads:
    """os.read of one descriptor replaced by a script of results (bytes, or an errno to raise);
    every other descriptor read for real. Records the descriptor's flags at the first read."""

    def __init__(self, script):
        self.script = iter(script)
        self.fd = None
        self.flags = None
        self.real = os.read

    def __call__(self, fd, size):
        if self.fd is None:
            self.fd = fd
            self.flags = (fcntl.fcntl(fd, fcntl.F_GETFL), fcntl.fcntl(fd, fcntl.F_GETFD))
        if fd != self.fd:
            return self.real(fd, size)
        step = next(self.script)
        if isinstance(step, int):
            raise OSError(step, os.strerror(step))
        return step


def _read_kmsg_with(monkeypatch, tmp_path, script):
    path = tmp_path / "kmsg"
    path.write_text("")
    reads = _Reads(script)
    monkeypatch.setattr(os, "read", reads)
    return _xid.read_kmsg(str(path), device=None), reads


def test_the_kernel_log_is_read_without_waiting_and_not_passed_to_children(monkeypatch, tmp_path):
    """/dev/kmsg is opened non-blocking (the read ends at the buffer's end instead of waiting for the
    next record) and close-on-exec (no program run later inherits the kernel's log)."""
    records, reads = _read_kmsg_with(monkeypatch, tmp_path, [b"4,1,1,-;a\n", errno.EAGAIN])
    status, fd_flags = reads.flags
    assert records == ["4,1,1,-;a\n"]
    assert status & os.O_NONBLOCK and fd_flags & fcntl.FD_CLOEXEC


def test_a_record_of_the_kernel_s_largest_size_is_read_whole(monkeypatch, tmp_path):
    """The kernel formats a /dev/kmsg record into at most 8192 bytes (CONSOLE_EXT_LOG_MAX) and fails
    a read whose buffer is smaller than the record with EINVAL: every read asks for 8192 bytes."""
    record = b"4,1,1,-;" + b"x" * (8192 - 9) + b"\n"
    script = iter([record])
    real = os.read
    path = tmp_path / "kmsg"
    path.write_text("")
    fds = []

    def kernel_read(fd, size):
        if not fds:
            fds.append(fd)
        if fd != fds[0]:
            return real(fd, size)
        step = next(script, None)
        if step is None:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        if len(step) > size:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return step

    monkeypatch.setattr(os, "read", kernel_read)
    assert len(record) == 8192 and _xid.read_kmsg(str(path), device=None) == [record.decode()]


def test_a_record_overwritten_while_read_is_skipped_and_the_read_goes_on(monkeypatch, tmp_path):
    records, _reads = _read_kmsg_with(monkeypatch, tmp_path, [errno.EPIPE, b"4,2,1,-;b\n", errno.EAGAIN])
    assert records == ["4,2,1,-;b\n"]


@pytest.mark.parametrize("code", [errno.EIO, errno.EINVAL, errno.EBADF, errno.EOVERFLOW])
def test_any_other_read_error_of_the_kernel_log_is_raised(monkeypatch, tmp_path, code):
    """Neither the end of the buffer (EAGAIN) nor an overwritten record (EPIPE): the read fails with
    it, so the caller tries dmesg and says why (nothing is read past an error)."""
    with pytest.raises(OSError) as exc:
        _read_kmsg_with(monkeypatch, tmp_path, [code, b"4,3,1,-;c\n", errno.EAGAIN])
    assert exc.value.errno == code


def test_boot_time_is_now_less_the_uptime(tmp_path):
    """/proc/uptime's first number is the uptime, its second the idle time of all CPUs."""
    (tmp_path / "uptime").write_text("100.25 5000.00\n")
    before = time.time()
    boot = _xid.boot_time(str(tmp_path))
    assert before - 100.25 - 1 < boot < time.time() - 100.25 + 1


def test_dmesg_that_cannot_run_is_named_with_the_kmsg_error(tmp_path):
    def missing(dmesg, timeout):
        raise subprocess.TimeoutExpired([dmesg], timeout)

    events, problem = _xid.read_xid_events(dmesg="/bin/dmesg", kmsg=str(tmp_path / "kmsg"), run=missing)
    assert events == []
    assert problem.startswith("%s: No such file or directory; dmesg: " % (tmp_path / "kmsg")) and "timed out after 15" in problem


@pytest.mark.parametrize("value, when", [
    pytest.param("2026-12-01T17:00:00+01:00", NOW, id="an-offset-is-kept"),
    pytest.param("2026-12-01T10:00:00-06:00", NOW, id="a-negative-offset-is-kept"),
    pytest.param("2026-12-01T16:00:00", NOW, id="no-offset-is-utc"),
    pytest.param("2026-12-01T16:00:00z", NOW, id="lower-case-z-is-utc"),
])
def test_since_as_a_time_of_day_keeps_its_offset(value, when):
    since = _xid.parse_since(value, now=NOW)
    assert since == when and since.utcoffset() is not None


def test_since_given_in_seconds_is_counted_back_from_the_clock():
    before = datetime.datetime.now(datetime.timezone.utc)
    since = _xid.parse_since("60")
    assert before - datetime.timedelta(seconds=61) < since <= datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=60)


def test_since_unset_without_a_default_reads_the_whole_buffer():
    assert _xid.parse_since(None, now=NOW, default=None) is None
    assert _xid.parse_since("", now=NOW, default=None) is None


def test_an_event_exactly_at_since_counts_in_kmsg_and_dmesg():
    """``since`` is inclusive ("at or after"), in both readers."""
    at = datetime.datetime(2026, 12, 1, 15, 59, tzinfo=datetime.timezone.utc)
    assert [e["xid"] for e in _xid.parse_dmesg("%s %s\n" % (DMESG_STAMP, FORGED_79), at)] == [79]
    assert [e["xid"] for e in _xid.parse_kmsg([kmsg(FORGED_79, ago=60)], BOOT, at)] == [79]


def test_the_read_of_the_kernel_log_stops_at_its_limit(monkeypatch, tmp_path):
    """At most ``limit`` records (200,000 by default) are read, however many the buffer holds."""
    record = b"4,1,1,-;a\n"
    records, _reads = _read_kmsg_with(monkeypatch, tmp_path, [record] * 200001 + [errno.EAGAIN])
    assert len(records) == 200000
    path = tmp_path / "kmsg"
    monkeypatch.setattr(os, "read", _Reads([record] * 5 + [errno.EAGAIN]))
    assert len(_xid.read_kmsg(str(path), limit=3, device=None)) == 3


@pytest.mark.parametrize("path", [
    pytest.param("/dev/null", id="dev-null-1-3-below-1-11"),
    pytest.param("/dev/ptmx", id="dev-ptmx-5-2-above-1-11"),
])
def test_another_character_device_in_the_place_of_dev_kmsg_is_refused(path):
    with pytest.raises(OSError) as exc:
        _xid.read_kmsg(path)
    assert exc.value.errno == errno.EPERM and "not the kernel's log device" in str(exc.value)


def test_the_character_device_asked_for_is_read():
    """The device check accepts the device of the number it is given (here /dev/null's, read to its end)."""
    st = os.stat("/dev/null")
    assert _xid.read_kmsg("/dev/null", device=(os.major(st.st_rdev), os.minor(st.st_rdev))) == []


def test_dmesg_that_succeeded_gives_its_events():
    def run(dmesg, timeout):
        return 0, "%s %s\n" % (DMESG_STAMP, FORGED_79), ""

    events, problem = _xid.read_xid_events(dmesg="/bin/dmesg", kmsg="/nonexistent/kmsg", run=run)
    assert problem is None and [e["xid"] for e in events] == [79]


def test_since_boot_from_module_arguments_reads_the_whole_buffer():
    """"boot" as it arrives from a module's JSON arguments (another string object than the literal)."""
    assert _xid.parse_since(json.loads('"boot"'), now=NOW) is None


@pytest.mark.parametrize("rc", [1, -9])
def test_dmesg_that_failed_or_was_killed_gives_no_events_and_its_error(tmp_path, rc):
    """A dmesg killed by a signal (rc -9) failed as one that exited 1 did: its output is not read;
    its error is given, on one line, cut at 200 characters."""
    err = "dmesg: read kernel buffer failed:\n" + "x" * 300

    def run(dmesg, timeout):
        return rc, "%s %s\n" % (DMESG_STAMP, FORGED_79), err

    events, problem = _xid.read_xid_events(dmesg="/bin/dmesg", kmsg=str(tmp_path / "kmsg"), run=run)
    assert events == []
    assert problem.endswith("; dmesg (rc=%d): %s" % (rc, " ".join(err.split())[:200]))


def test_the_device_checked_for_is_this_kernel_s_dev_kmsg():
    """The character device the read insists on is the one /dev/kmsg is on this machine (1:11)."""
    st = os.stat("/dev/kmsg")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == _xid.KMSG_DEVICE


@pytest.mark.parametrize("record", [
    pytest.param(" SUBSYSTEM=pci", id="a-continuation-line"),
    pytest.param("x,1,1,-;" + FORGED_79, id="priority-not-a-number"),
    pytest.param("", id="empty"),
])
def test_what_is_no_kmsg_record_is_passed_over(record):
    assert [e["xid"] for e in _xid.parse_kmsg([record, kmsg(FORGED_79)], BOOT)] == [79]


def test_a_failing_dmesg_s_own_error_reaches_the_message(tmp_path):
    """A real dmesg run (a stand-in script) that exits 1: its exit status and its stderr are in the
    problem, not Python's account of a failed command."""
    dmesg = tmp_path / "dmesg"
    dmesg.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n")
    os.chmod(dmesg, stat.S_IRWXU)
    events, problem = _xid.read_xid_events(dmesg=str(dmesg), kmsg=str(tmp_path / "kmsg"))
    assert events == [] and problem.endswith("; dmesg (rc=1): dmesg: read kernel buffer failed: Operation not permitted")


def test_the_node_read_asks_nvidia_smi_once_for_its_health_and_its_kernel_logs_xid(tmp_path, monkeypatch):
    """node_readiness with the node read: the GPU health read for its containers is the one the
    kernel log's Xid events are folded with; nvidia-smi is not asked again for them."""
    state = tmp_path / "gpu"
    (state / "claims").mkdir(parents=True)
    gpus = [{"name": "NVIDIA H200", "memory_total_mib": 143771, "minor": g, "uuid": "GPU-5d3c1f7e-0001-4c6e-9f0e-%012d" % g,
             "bus_id": "00000000:%02X:00.0" % (0x18 + g)} for g in range(2)]
    (state / "config.json").write_text(json.dumps({"gpus": gpus, "release_delay": 0.5}))
    calls = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho x >> %s\nGPU_STANDIN_STATE=%s exec %s -I -S %s \"$@\"\n"
                   % (calls, state, sys.executable, os.path.join(STANDINS, "nvidia_smi.py")))
    smi.chmod(0o755)
    raw = _node.node_health(str(smi), 15)
    asked = len(calls.read_text().split())  # the health read's own queries
    assert asked >= 1 and [g["uuid"] for g in raw[1]] == [g["uuid"] for g in gpus]
    now = datetime.datetime.now(datetime.timezone.utc)
    boot = (now - datetime.timedelta(days=1)).timestamp()
    line = "4,1,%d,-;NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=a, GPU has fallen off the bus.\n" % int((now.timestamp() - 60 - boot) * 1e6)
    monkeypatch.setattr(_xid, "read_xid_events", lambda since=None, **_kw: (_xid.parse_kmsg([line], boot, since), None))
    check = {"name": "gpu_healthy", "ok": True, "error": None, "findings": [], "summary": "1 GPU(s) healthy",
             "gpus": [{"index": 0, "uuid": gpus[1]["uuid"], "healthy": True, "findings": [], "xid_events": {}}]}
    results = {"train-101": {"ready": True, "checks": [check]}}
    assert _node.fold_node_health(_Module(), results, [{"host": "train-101", "args": {"gpu_health": True}}], str(smi), 15,
                                  reading=raw) == 1
    assert len(calls.read_text().split()) == asked  # not asked again
    assert check["ok"] is False and check["gpus"][0]["xid_events"] == {"79": 1} and results["train-101"]["ready"] is False
    assert raw[1][1].get("xid") is None  # the reading given is left as it was


# --------------------------------------------------------------------------- the kernel log's Xid lines

DMESG = """2026-12-01T14:00:00,000000+00:00 NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
2026-12-01T14:01:00,100000+00:00 NVRM: Xid (PCI:0000:00:06): 13, pid=1731, name=python3, Graphics Exception: ESR 0x404490=0x80000002
2026-12-01T15:02:03,000000+00:00 NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
2026-12-01T15:05:00,000000+00:00 NVRM: Xid (PCI:0000:41:00): 48, pid=99, name=train, An uncorrectable double bit error
"""


def test_xid_lines_of_dmesg_since_a_time():
    events = _xid.parse_dmesg(DMESG)
    assert [(e["pci"], e["xid"], e["pid"], e["process"]) for e in events] == [
        ("0000:00:06", 13, 1731, "python3"), ("0000:00:06", 79, None, "<unknown>"), ("0000:41:00", 48, 99, "train")]
    assert events[1]["severity"] == "fail" and "fallen off the bus" in events[1]["meaning"]
    since = _xid.parse_since("2026-12-01T15:00:00Z")
    assert [e["xid"] for e in _xid.parse_dmesg(DMESG, since)] == [79, 48]


def test_kmsg_records_and_since():
    boot = datetime.datetime(2026, 12, 1, 14, 0, tzinfo=datetime.timezone.utc).timestamp()
    records = ["6,100,1000000,-;NVRM: loading", ("4,101,3600000000,-;NVRM: Xid (PCI:0000:00:06): 94, pid=5, name=x, Contained\n"
               " SUBSYSTEM=pci\n"), "4,102,7200000000,-;NVRM: Xid (PCI:0000:00:06): 119, pid=5, name=x, Timeout"]
    events = _xid.parse_kmsg(records, boot)
    assert [(e["xid"], e["time"]) for e in events] == [(94, "2026-12-01T15:00:00+00:00"), (119, "2026-12-01T16:00:00+00:00")]
    later = _xid.parse_kmsg(records, boot, since=_xid.parse_since("2026-12-01T15:30:00+00:00"))
    assert [e["xid"] for e in later] == [119]


def test_every_common_code_is_explained():
    for code in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119):
        e = _xid.explain(code)
        assert e["severity"] in ("fail", "warn") and e["meaning"] and e["action"]
    assert _xid.explain(999)["meaning"].startswith("Xid not in")


def test_a_readable_kmsg_file_is_read_to_its_end(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("4,1,1000000,-;NVRM: Xid (PCI:0000:00:06): 31, pid=7, name=a, MMU Fault\n")
    (tmp_path / "uptime").write_text("100.0 50.0\n")
    events, problem = _xid.read_xid_events(kmsg=str(path), proc=str(tmp_path), kmsg_device=None)
    assert problem is None and [e["xid"] for e in events] == [31]
    # Without the test's leave, a regular file in the place of /dev/kmsg is not the kernel's log.
    events, problem = _xid.read_xid_events(kmsg=str(path), proc=str(tmp_path))
    assert events == [] and "not the kernel's log device" in problem
