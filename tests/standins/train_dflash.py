# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""STAND-IN for a training process holding a GPU, for tests without a GPU. Trains nothing.

It opens the file standing for /dev/nvidia<N> (under the nvidia-smi stand-in's state
directory, or a real bind-mount of /dev/nvidia<N> given with --device) and keeps it open,
as a CUDA process keeps its device handle, then writes a claim (its PID, start time, GPU,
MiB) into <state>/claims/ so that the nvidia-smi stand-in (nvidia_smi.py) reports that
memory as used while this process lives and holds the handle.

    python3 train_dflash.py --state DIR --gpu 0 --mib 40960 [--ignore-sigterm] [--term-delay S]
    python3 train_dflash.py --state DIR --gpu 0,1,2,3 --device /dev/nvidia4,... --mib 40960
    python3 train_dflash.py --state DIR --gpu 1 --mig 2:0 --mib 4096

Several GPUs (a comma list, with as many --device paths when given) are held by this one
process, each with its own claim of --mib (claims/<pid>-<n>.json beyond the first), as a
single-process job spread over a box's GPUs holds memory on every one of them. --mig GI:CI
marks the claim as made on that MIG instance (GPU instance, compute instance) of its GPU.

It prints "ready <pid>" once the claim is written. With --log-throughput RATE it then prints
"step N loss X RATE tokens/s" every --log-every seconds, as a training loop logs its speed:
RATE is the number given, not a measurement (a STAND-IN; it computes nothing). With
--compile-seconds S it first prints "compile start", sleeps S seconds (as torch.compile
takes a while before the first step) and prints "compiled in S s"; its first --warmup-steps
readings are a quarter of RATE (a run still warming up). On SIGTERM it exits after --term-delay
seconds (a checkpoint being written), or ignores SIGTERM with --ignore-sigterm (only SIGKILL
stops it). Extra arguments (--tag ...) only mark its command line for scope tests.

With --dlopen PATHS (a comma list) it first loads each shared object with ctypes.CDLL, in order
and RTLD_GLOBAL (a later one's DT_NEEDED met by an earlier one's soname), as a training process
loads its CUDA libraries: they are in its /proc/<pid>/maps. A path with a glob pattern
(``/opt/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2``) is the first file it
matches, as torch finds the libraries of its venv's nvidia wheels whatever the Python version.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import signal
import sys
import time


def start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    return int(text[text.rindex(")") + 2:].split()[19])


def library_path(pattern):
    """The first file a --dlopen pattern matches (itself when it has no glob character)."""
    if not glob.has_magic(pattern):
        return pattern
    found = sorted(glob.glob(pattern))
    if not found:
        raise SystemExit("--dlopen %s: no file matches" % pattern)
    return found[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default=os.environ.get("GPU_STANDIN_STATE"))
    ap.add_argument("--gpu", default="0", help="a GPU index, or a comma list of them")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--util", type=int, default=90)
    ap.add_argument("--device", help="the device file(s) to hold, a comma list (default <state>/dev/nvidia<gpu>)")
    ap.add_argument("--mig", metavar="GI:CI", help="the MIG instance the claim is made on")
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--term-delay", type=float, default=0.0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--log-throughput", type=float, default=0.0, metavar="RATE",
                    help="print 'step N loss X RATE tokens/s' lines (a stand-in figure, nothing is measured)")
    ap.add_argument("--log-every", type=float, default=1.0, metavar="S", help="seconds between those lines")
    ap.add_argument("--compile-seconds", type=float, default=0.0, metavar="S",
                    help="a compile phase before the first reading (nothing is compiled)")
    ap.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="the first N readings are RATE/4")
    ap.add_argument("--dlopen", default="", metavar="PATHS",
                    help="shared objects to load first, a comma list (a glob pattern: the first file it matches)")
    args = ap.parse_args()
    if not args.state:
        ap.error("--state or GPU_STANDIN_STATE is required")

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def on_term(_signum, _frame):
            time.sleep(args.term_delay)  # "writing a checkpoint"
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)

    for path in filter(None, args.dlopen.split(",")):
        ctypes.CDLL(library_path(path), mode=ctypes.RTLD_GLOBAL)  # mapped until this process dies
    gpus = [int(g) for g in str(args.gpu).split(",")]
    devices = args.device.split(",") if args.device else [os.path.join(args.state, "dev", "nvidia%d" % g) for g in gpus]
    if len(devices) != len(gpus):
        ap.error("--device names %d files for %d GPUs" % (len(devices), len(gpus)))
    handles = [os.open(d, os.O_RDWR) for d in devices]  # held until this process dies
    pid = os.getpid()
    cdir = os.path.join(args.state, "claims")
    os.makedirs(cdir, exist_ok=True)
    for n, (gpu, device) in enumerate(zip(gpus, devices)):
        claim = {"pid": pid, "start_time": start_time(pid), "gpu": gpu, "mib": args.mib,
                 "util": args.util, "device": os.path.realpath(device), "tag": args.tag}
        if args.mig:
            gi, _sep, ci = args.mig.partition(":")
            claim.update(gpu_instance_id=int(gi), compute_instance_id=int(ci or 0))
        tmp = os.path.join(cdir, ".%d-%d.tmp" % (pid, n))
        with open(tmp, "w") as f:
            json.dump(claim, f)
        os.replace(tmp, os.path.join(cdir, "%d.json" % pid if n == 0 else "%d-%d.json" % (pid, n)))
    sys.stdout.write("ready %d\n" % pid)
    sys.stdout.flush()
    if args.compile_seconds > 0:
        sys.stdout.write("compile start\n")
        sys.stdout.flush()
        time.sleep(args.compile_seconds)
        sys.stdout.write("compiled in %g s\n" % args.compile_seconds)
        sys.stdout.flush()
    step = 0
    while True:
        if args.log_throughput > 0:
            time.sleep(args.log_every)
            step += 1
            rate = args.log_throughput / 4 if step <= args.warmup_steps else args.log_throughput
            sys.stdout.write("step %d loss %.4f %g tokens/s\n" % (step, 2.0 / (1 + 0.01 * step), rate))
            sys.stdout.flush()
        else:
            time.sleep(3600)
    for handle in handles:  # not reached
        os.close(handle)


if __name__ == "__main__":
    main()
