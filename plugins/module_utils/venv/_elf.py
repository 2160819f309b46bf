# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""DT_NEEDED of an ELF shared object, read with the standard library.

Targets have no pyelftools and may have no binutils; a few struct reads through the
program headers are all it takes, and a large library costs a handful of small reads.
Private to gpufleet.hygiene (leading underscore): not a public API.
"""

from __future__ import annotations

import os
import struct

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import CAPS, Skipped, open_regular

PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_STRSZ = 10

_MAX_HEAD = CAPS["elf_header"]
_MAX_DYNAMIC = CAPS["elf_dynamic"]
_MAX_STRTAB = CAPS["elf_strtab"]


def dt_needed(path, problems=None, what=None, opened=None):
    """Return the list of DT_NEEDED sonames of ``path``; None if it is not a readable ELF.

    Opened through the file layer: a FIFO, a device or a symbolic link is not read, and why
    is added to ``problems``. ``opened(stat_result)``: called with the fstat of the file read."""
    try:
        fd = open_regular(path, what=what)
    except Skipped as exc:
        if problems is not None and not exc.problem.endswith(" does not exist"):
            problems.append(exc.problem)
        return None
    try:
        if opened is not None:
            opened(os.fstat(fd))
        with os.fdopen(fd, "rb") as f:
            return _read_needed(f)
    except (IOError, OSError, struct.error, ValueError, OverflowError, MemoryError):
        return None


def _read_needed(f):
    # The ELF header and, in practice, the program headers sit in the first page: one read.
    head = f.read(_MAX_HEAD)
    ident = head[:16]
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        return None
    cls, data = ident[4], ident[5]
    if cls not in (1, 2) or data not in (1, 2):
        return None
    end = "<" if data == 1 else ">"
    is64 = cls == 2
    if is64:
        hdr = struct.unpack_from(end + "HHIQQQIHHHHHH", head, 16)
        ph_fmt = end + "IIQQQQQQ"  # type, flags, offset, vaddr, paddr, filesz, memsz, align
        dyn_fmt = end + "qQ"
    else:
        hdr = struct.unpack_from(end + "HHIIIIIHHHHHH", head, 16)
        ph_fmt = end + "IIIIIIII"  # type, offset, vaddr, paddr, filesz, memsz, flags, align
        dyn_fmt = end + "iI"
    phoff, phentsize, phnum = hdr[4], hdr[8], hdr[9]
    size = struct.calcsize(ph_fmt)
    if not phoff or not phnum or phentsize < size or phentsize > 256 or phnum > 4096:
        return None
    if phoff + phentsize * phnum <= len(head):
        table = head[phoff:phoff + phentsize * phnum]
    else:
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    if len(table) < phentsize * (phnum - 1) + size:
        return None
    loads = []
    dynamic = None
    for i in range(phnum):
        fields = struct.unpack_from(ph_fmt, table, i * phentsize)
        if is64:
            p_type, p_offset, p_vaddr, p_filesz = fields[0], fields[2], fields[3], fields[5]
        else:
            p_type, p_offset, p_vaddr, p_filesz = fields[0], fields[1], fields[2], fields[4]
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    f.seek(dynamic[0])
    blob = f.read(min(dynamic[1], _MAX_DYNAMIC))
    dsize = struct.calcsize(dyn_fmt)
    needed_offsets = []
    strtab = strsz = None
    for tag, val in struct.iter_unpack(dyn_fmt, blob[:len(blob) - len(blob) % dsize]):
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed_offsets.append(val)
        elif tag == DT_STRTAB:
            strtab = val
        elif tag == DT_STRSZ:
            strsz = val
    if not needed_offsets:
        return []
    if strtab is None:
        return None
    file_off = None
    for vaddr, offset, filesz in loads:
        if vaddr <= strtab < vaddr + filesz:
            file_off = strtab - vaddr + offset
            break
    if file_off is None:
        file_off = strtab  # unrelocated or prelinked at 0: vaddr == offset
    # Read only the span of the string table that holds the needed names (a large library's
    # table runs to megabytes of symbol names); a name running past the span reads on.
    limit = min(strsz or _MAX_STRTAB, _MAX_STRTAB)
    low = min(needed_offsets)
    if low >= limit:
        return []
    f.seek(file_off + low)
    table = f.read(min(max(needed_offsets) - low + 512, limit - low))
    names = []
    for off in needed_offsets:
        rel = off - low
        if off >= limit:
            continue
        stop = table.find(b"\0", rel)
        while stop < 0 and low + len(table) < limit:
            more = f.read(min(65536, limit - low - len(table)))
            if not more:
                break
            table += more
            stop = table.find(b"\0", rel)
        names.append(table[rel:stop if stop >= 0 else len(table)].decode("utf-8", "replace"))
    return names
