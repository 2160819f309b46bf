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

It prints "ready <pid>" once the claim is written. With --log-throughput RATE it then prints
"step N loss X RATE tokens/s" every --log-every seconds, as a training loop logs its speed:
RATE is the number given, not a measurement (a STAND-IN; it computes nothing). With
--compile-seconds S it first prints "compile start", sleeps S seconds (as torch.compile
takes a while before the first step) and prints "compiled in S s"; its first --warmup-steps
readings are a quarter of RATE (a run still warming up). On SIGTERM it exits after --term-delay
seconds (a checkpoint being written), or ignores SIGTERM with --ignore-sigterm (only SIGKILL
stops it). Extra arguments (--tag ...) only mark its command line for scope tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    return int(text[text.rindex(")") + 2:].split()[19])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default=os.environ.get("GPU_STANDIN_STATE"))
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--util", type=int, default=90)
    ap.add_argument("--device", help="the device file to hold (default <state>/dev/nvidia<gpu>)")
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--term-delay", type=float, default=0.0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--log-throughput", type=float, default=0.0, metavar="RATE",
                    help="print 'step N loss X RATE tokens/s' lines (a stand-in figure, nothing is measured)")
    ap.add_argument("--log-every", type=float, default=1.0, metavar="S", help="seconds between those lines")
    ap.add_argument("--compile-seconds", type=float, default=0.0, metavar="S",
                    help="a compile phase before the first reading (nothing is compiled)")
    ap.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="the first N readings are RATE/4")
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

    device = args.device or os.path.join(args.state, "dev", "nvidia%d" % args.gpu)
    handle = os.open(device, os.O_RDWR)  # held until this process dies
    pid = os.getpid()
    claim = {"pid": pid, "start_time": start_time(pid), "gpu": args.gpu, "mib": args.mib,
             "util": args.util, "device": os.path.realpath(device), "tag": args.tag}
    cdir = os.path.join(args.state, "claims")
    os.makedirs(cdir, exist_ok=True)
    tmp = os.path.join(cdir, ".%d.tmp" % pid)
    with open(tmp, "w") as f:
        json.dump(claim, f)
    os.replace(tmp, os.path.join(cdir, "%d.json" % pid))
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
    os.close(handle)  # not reached


if __name__ == "__main__":
    main()
