# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet benchmark's runner: one simulated fleet brought up, every configuration run against
each size in interleaved rounds, the work floor's read CPU, the profile and clean-fleet runs, the
fleet taken down whatever happens. benchmarks/bench_fleet.py is the command; the tables come
from _fleettables.py, the plot from _fleetplot.py.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import time

from _fleetbench import BIN, PEER_COLLECTIONS, ROOT, Fleet, ansible_env, ensure_peer, ensure_tools, log
from _fleettables import NAMES, label, parse_sizes

WORK = os.path.join(ROOT, "build", "bench-fleet")
TOOLS = os.path.join(ROOT, "build", "bench-tools")
TOOL_PACKAGES = ["mitogen==0.3.54", "matplotlib", "py-spy", "pyinfra==3.10.0"]
# sshd's defaults (OpenSSH): sessions per connection, and unauthenticated connections before it
# starts refusing some. A2 keeps within the first; A retries what the second refuses.
MAX_SESSIONS = 10
SSH_RETRIES = 8
HERE = os.path.dirname(os.path.abspath(__file__))
PLAYBOOK = os.path.join(ROOT, "playbooks", "preflight.yml")
REMEDIATE = os.path.join(ROOT, "playbooks", "remediate.yml")

SHELL_PLAYBOOK = """\
- name: The seeds' one-liners as shell tasks
  hosts: bench
  gather_facts: false
  tasks:
    - name: GPU memory
      ansible.builtin.shell: "{{ gpufleet_nvidia_smi }} --query-gpu=index,memory.used --format=csv,noheader"
      changed_when: false
    - name: CUDA 13 packages in the venv
      ansible.builtin.shell: "{{ gpufleet_venv }}/bin/uv pip list --python {{ gpufleet_venv }}/bin/python | grep -iE cu13"
      register: cu13
      changed_when: false
      failed_when: cu13.rc > 1
"""

# Ansible's own floor (configuration F): what any playbook over these nodes costs before it does anything.
FLOOR_PLAYBOOK = """\
- name: Ansible's own floor - one trivial task on each node
  hosts: pve_nodes
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""

PYINFRA_INVENTORY = """\
# pyinfra inventory of the benchmark's fleet (written by benchmarks/bench_fleet.py)
import json

pve_nodes = [tuple(h) for h in json.loads(%r)]
"""

PYINFRA_DEPLOY = """\
# The seeds' one-liners as pyinfra operations, one per container, on its node (bench_fleet.py P)
from pyinfra import host
from pyinfra.operations import server

for vmid, command in host.data.gpufleet_one_liners:
    server.shell(name="one-liner %s" % vmid, commands=[command])
"""


# ssh's words when sshd refuses a connection (MaxStartups) or a session (MaxSessions) before the command ran.
REFUSED = re.compile(r"kex_exchange_identification|Connection (closed|reset) by|session open refused|open failed|"
                     r"mux_client_request_session")
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


def run_bounded(argv, timeout, **kw):
    """subprocess.run with stdout and stderr together, its whole process group killed after
    `timeout` seconds (a run that hangs is a failed run, not a stalled benchmark)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)
    try:
        out, _err = proc.communicate(timeout=timeout)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)  # in its own session: the interrupt never reached it
        raise
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _err = proc.communicate()
        raise RuntimeError("%s: no answer within %d s (--run-timeout)\n%s" % (shlex.join(argv[-2:]), timeout, out[-3000:])) from exc
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)


def mem_available_mib():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemAvailable:"))


class Bench(object):
    def __init__(self, args, fleet):
        self.args = args
        self.fleet = fleet
        self.nodes = fleet.nodes()
        self.node_vars = fleet.inventory()["all"]["children"]["pve_nodes"]["hosts"]
        self.home = os.path.join(WORK, "home")
        self.logfile = os.path.join(WORK, "runs.log")
        os.makedirs(os.path.join(self.home, ".ssh"), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(self.home, "tmp"), exist_ok=True)
        shutil.copy(self.nodes[0][0]["ansible_pct_known_hosts_file"], os.path.join(self.home, ".ssh", "known_hosts"))
        with open(os.path.join(WORK, "shell.yml"), "w") as f:
            f.write(SHELL_PLAYBOOK)
        with open(os.path.join(WORK, "floor.yml"), "w") as f:
            f.write(FLOOR_PLAYBOOK)
        self.env = ansible_env(self.home, [PEER_COLLECTIONS])
        self.mitogen_env = None
        self.pyinfra_env = dict(os.environ, HOME=self.home)
        self.inventories = {}
        self.retries = collections.Counter()
        self.cm_dir = os.path.join(WORK, "cm")
        os.makedirs(self.cm_dir, mode=0o700, exist_ok=True)
        with open(os.path.join(WORK, "pyinfra_deploy.py"), "w") as f:
            f.write(PYINFRA_DEPLOY)

    # ------------------------------------------------------------------ inventories

    def hosts(self, size):
        n, m = size
        return [h for hosts in self.nodes[:n] for h in hosts[:m]]

    def write_inventories(self, size):
        hosts = self.hosts(size)
        n = size[0]
        own = {}
        peer = {}
        mito = {}
        for h in hosts:
            v = {k: val for k, val in h.items() if k != "name"}
            own[h["name"]] = dict(v, ansible_pct_method=self.args.method)
            peer[h["name"]] = {
                "ansible_connection": "community.proxmox.proxmox_pct_remote",
                "ansible_host": h["ansible_pct_node_host"], "ansible_port": h["ansible_pct_node_port"],
                "ansible_user": h["ansible_pct_node_user"], "ansible_private_key_file": h["ansible_pct_private_key_file"],
                "proxmox_vmid": h["ansible_pct_vmid"], "ansible_python_interpreter": h["ansible_python_interpreter"],
                "gpufleet_venv": h["gpufleet_venv"], "gpufleet_nvidia_smi": h["gpufleet_nvidia_smi"],
            }
            wrapper = os.path.join(WORK, "lxc-attach-%s" % h["pve_node"])
            with open(wrapper, "w") as f:
                # Mitogen runs `lxc-attach -n <name>` on the node; the simulated nodes keep their
                # containers in an lxcpath of their own (-P), as pct's wrapper knows.
                f.write("#!/bin/sh\nexec lxc-attach -P %s \"$@\"\n" % shlex.quote(h["ansible_pct_lxc_path"]))
            os.chmod(wrapper, 0o755)
            keep = {k: val for k, val in v.items() if not k.startswith("ansible_pct_") and k != "ansible_connection"}
            mito[h["name"]] = dict(keep, ansible_connection="lxc", ansible_host=str(h["ansible_pct_vmid"]),
                                   ansible_pct_vmid=h["ansible_pct_vmid"], mitogen_via=h["pve_node"],
                                   mitogen_lxc_attach_path=wrapper)
        node_names = sorted({h["pve_node"] for h in hosts})
        paths = {}
        docs = {
            # The nodes too, as users' inventories have them: preflight reads by node when it may.
            "B": {"all": {"children": {"pve_nodes": {"hosts": {k: self.node_vars[k] for k in node_names}},
                                       "pve_containers": {"hosts": own}}}},
            "C": {"all": {"children": {"bench": {"hosts": peer}}}},
            "D": {"all": {"children": {"pve_nodes": {"hosts": {k: self.node_vars[k] for k in node_names}},
                                       "pve_containers": {"hosts": mito}}}},
        }
        paths["P"] = os.path.join(WORK, "pyinfra-inventory-%s.py" % label(size))
        with open(paths["P"], "w") as f:
            f.write(PYINFRA_INVENTORY % json.dumps(self.pyinfra_hosts(size), indent=1))
        for key, doc in docs.items():
            paths[key] = os.path.join(WORK, "inventory-%s-%s.yml" % (key, label(size)))
            with open(paths[key], "w") as f:
                json.dump(doc, f, indent=1)
        self.inventories[size] = paths
        assert len(hosts) == n * size[1], "the fleet is smaller than %s" % label(size)

    def pyinfra_hosts(self, size):
        """pyinfra's hosts are the nodes (it has no connector into a Proxmox container): each
        carries the seeds' one-liners of its containers, A's commands as they are."""
        out = []
        for hosts in self.by_node(size):
            h = hosts[0]
            lines = [[c["ansible_pct_vmid"], "pct exec %d -- bash -c %s; test $? -le 1" % (
                c["ansible_pct_vmid"], shlex.quote(self.one_liner(c)))] for c in hosts]
            out.append([h["pve_node"], {
                "ssh_hostname": h["ansible_pct_node_host"], "ssh_port": h["ansible_pct_node_port"], "ssh_user": "root",
                "ssh_key": h["ansible_pct_private_key_file"], "ssh_known_hosts_file": h["ansible_pct_known_hosts_file"],
                "ssh_strict_host_key_checking": "yes", "gpufleet_one_liners": lines}])
        return out

    # ------------------------------------------------------------------ floors

    def read_cpu(self, samples=8, rounds=5):
        """The work floor's measure: one container read's CPU in-process (benchmarks/_readcpu.py run
        in the container with the collection's module_utils copied in), in the first two
        containers of up to `samples` / 2 nodes (a sick one and a healthy one each)."""
        picked = [h for hosts in self.nodes[:max(1, samples // 2)] for h in hosts[:2]][:samples]
        out = []
        for h in picked:
            rootfs = os.path.join(h["ansible_pct_lxc_path"], str(h["ansible_pct_vmid"]), "rootfs")
            dest = os.path.join(rootfs, "tmp", "gpufleet-bench")
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(os.path.join(ROOT, "plugins", "module_utils"),
                            os.path.join(dest, "ansible_collections", "gpufleet", "hygiene", "plugins", "module_utils"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(os.path.join(HERE, "_readcpu.py"), dest)
            job = h.get("gpufleet_job") or {}
            opts = {"venv": h.get("gpufleet_venv") or None, "nvidia_smi": h.get("gpufleet_nvidia_smi") or None,
                    "job_patterns": job.get("patterns", []), "job_users": job.get("users", []),
                    "job_log": job.get("log") or None, "require_gpu": h.get("gpufleet_require_gpu", True)}
            argv = ["lxc-attach", "-n", str(h["ansible_pct_vmid"]), "-P", h["ansible_pct_lxc_path"], "--",
                    "/usr/bin/python3", "/tmp/gpufleet-bench/_readcpu.py", "/tmp/gpufleet-bench", json.dumps(opts), str(rounds)]
            res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
            shutil.rmtree(dest, ignore_errors=True)
            if res.returncode != 0:
                raise RuntimeError("read CPU in %s: rc %d: %s" % (h["name"], res.returncode, res.stderr[-2000:]))
            one = json.loads(res.stdout)
            one["host"] = h["name"]
            out.append(one)
            log("read CPU %s: %.0f ms own + %.0f ms nvidia-smi, %.0f ms wall" % (
                h["name"], 1000 * one["self_s"], 1000 * one["children_s"], 1000 * one["wall_s"]))
        return out

    # ------------------------------------------------------------------ runs

    def record(self, argv, out, wall, cwd=ROOT):
        with open(self.logfile, "a") as f:
            f.write("$ (cd %s; %s)  # %.2f s\n%s\n" % (cwd, shlex.join(argv), wall, out))

    def playbook(self, argv, env, hosts, expect_rc=(0, 2), cwd=ROOT, changed_ok=True, nodes=None):
        """Run a playbook; (wall, {container: failed}). With ``nodes`` (preflight that may read by
        node), a container absent from the recap was read by its node and passed, so long as
        every node of the size ran without a failure or an unreachable."""
        t0 = time.perf_counter()
        out = run_bounded(argv, self.args.run_timeout, cwd=cwd, env=env)
        wall = time.perf_counter() - t0
        self.record(argv, out.stdout, wall, cwd)
        recap = {m.group(1): [int(x) for x in m.groups()[1:]] for m in RECAP.finditer(out.stdout)}
        names = [h["name"] for h in hosts]
        if nodes and all(n in recap and recap[n][2] == 0 and recap[n][3] == 0 for n in nodes):
            for h in names:
                recap.setdefault(h, [0, 0, 0, 0])
        bad = [h for h in names if h not in recap or recap[h][2] != 0]
        if out.returncode not in expect_rc or bad:
            raise RuntimeError("%s: rc %d, hosts missing or unreachable: %s; log %s\n%s" % (
                shlex.join(argv[-3:]), out.returncode, bad, self.logfile, out.stdout[-3000:]))
        if not changed_ok:
            changed = [h for h in names if recap[h][1] != 0]
            if changed:
                raise RuntimeError("%s changed %s on a clean fleet; log %s" % (argv[-1], changed, self.logfile))
        return wall, {h: recap[h][3] > 0 for h in names}

    def by_node(self, size):
        n, m = size
        return [hosts[:m] for hosts in self.nodes[:n]]

    def ssh_argv(self, h, remote, opts=("-o", "ControlMaster=no", "-o", "ControlPath=none")):
        return ["ssh", "-T", "-o", "BatchMode=yes"] + list(opts) + [
            "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + h["ansible_pct_known_hosts_file"],
            "-o", "IdentitiesOnly=yes", "-i", h["ansible_pct_private_key_file"],
            "-p", str(h["ansible_pct_node_port"]), "root@" + h["ansible_pct_node_host"]] + ([remote] if remote else [])

    def ssh(self, config, argv):
        """Run an ssh command; what sshd refuses before the command starts (MaxStartups drops a
        connection, MaxSessions refuses a session) is tried again after a short wait, and counted."""
        for attempt in range(SSH_RETRIES + 1):
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
            if out.returncode != 255 or attempt == SSH_RETRIES or not REFUSED.search(out.stderr):
                return out
            self.retries[config] += 1
            time.sleep(0.05 * (attempt + 1) + random.random() * 0.05)
        return out

    @staticmethod
    def one_liner(h):
        venv = h["gpufleet_venv"]
        return "%s --query-gpu=index,memory.used --format=csv,noheader; %s/bin/uv pip list --python %s/bin/python | grep -iE cu13" % (
            h["gpufleet_nvidia_smi"], venv, venv)

    @staticmethod
    def answer(config, h, out):
        # grep's 1 is "no CUDA 13 package": the clean answer. ssh's 255 or no GPU line is a failure.
        if out.returncode > 1 or "MiB" not in out.stdout:
            raise RuntimeError("%s %s: rc %d: %s %s" % (config, h["name"], out.returncode, out.stdout, out.stderr))
        return h["name"], "cu13" in out.stdout.lower()

    def timed_pool(self, config, size, fn, items):
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(items)) as pool:
            found = dict(kv for part in pool.map(fn, items) for kv in part)
        wall = time.perf_counter() - t0
        self.record([config, label(size)], json.dumps(found), wall)
        return wall, found

    def run_a(self, size):
        def one(h):
            remote = "pct exec %d -- bash -c %s" % (h["ansible_pct_vmid"], shlex.quote(self.one_liner(h)))
            return [self.answer("A", h, self.ssh("A", self.ssh_argv(h, remote)))]

        return self.timed_pool("A", size, one, self.hosts(size))

    def run_a2(self, size):
        """One ssh master per node (its handshake timed), the one-liners through it with
        lxc-attach, at most MAX_SESSIONS at a time per node (sshd's default MaxSessions)."""
        def node(hosts):
            sock = os.path.join(self.cm_dir, hosts[0]["pve_node"])
            mux = ("-o", "ControlPath=" + sock)
            master = self.ssh("A2", self.ssh_argv(hosts[0], None, mux + ("-o", "ControlMaster=yes", "-o", "ControlPersist=120",
                                                                         "-f", "-N")))
            if master.returncode != 0:
                raise RuntimeError("A2 %s: master: rc %d: %s" % (hosts[0]["pve_node"], master.returncode, master.stderr))
            try:
                def one(h):
                    remote = "lxc-attach -n %d -P %s -- bash -c %s" % (
                        h["ansible_pct_vmid"], shlex.quote(h["ansible_pct_lxc_path"]), shlex.quote(self.one_liner(h)))
                    return self.answer("A2", h, self.ssh("A2", self.ssh_argv(h, remote, mux + ("-o", "ControlMaster=no"))))

                with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(hosts), MAX_SESSIONS)) as pool:
                    return list(pool.map(one, hosts))
            finally:
                subprocess.run(self.ssh_argv(hosts[0], None, mux + ("-O", "exit")), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)

        return self.timed_pool("A2", size, node, self.by_node(size))

    def run_t(self, size):
        """The transport floor: one fresh ssh handshake per node, one process start (`true`) in
        each of its containers through lxc-attach, all in parallel, nothing read."""
        def node(hosts):
            ids = " ".join(str(h["ansible_pct_vmid"]) for h in hosts)
            remote = ("set --; for id in %s; do lxc-attach -n $id -P %s -- true & set -- \"$@\" $!; done; "
                      "rc=0; for p; do wait $p || rc=1; done; exit $rc") % (ids, shlex.quote(hosts[0]["ansible_pct_lxc_path"]))
            out = self.ssh("T", self.ssh_argv(hosts[0], remote))
            if out.returncode != 0:
                raise RuntimeError("T %s: rc %d: %s" % (hosts[0]["pve_node"], out.returncode, out.stderr))
            return [(h["name"], False) for h in hosts]

        return self.timed_pool("T", size, node, self.by_node(size))

    def run_p(self, size):
        hosts = self.hosts(size)
        argv = [os.path.join(TOOLS, "bin", "pyinfra"), "-y", "--parallel", str(size[0]), self.inventories[size]["P"],
                os.path.join(WORK, "pyinfra_deploy.py")]
        t0 = time.perf_counter()
        out = run_bounded(argv, self.args.run_timeout, cwd=WORK, env=self.pyinfra_env)
        wall = time.perf_counter() - t0
        self.record(argv, out.stdout, wall)
        if out.returncode != 0:
            raise RuntimeError("P: rc %d; log %s\n%s" % (out.returncode, self.logfile, out.stdout[-3000:]))
        return wall, {h["name"]: None for h in hosts}

    def run_b(self, size, extra_env=None, pre=(), extra_vars=()):
        hosts = self.hosts(size)
        self.fleet.close_masters()
        env = dict(self.env, **(extra_env or {}))
        argv = list(pre) + [os.path.join(BIN, "ansible-playbook"), "-i", self.inventories[size]["B"], "-f", str(len(hosts)),
                            PLAYBOOK]
        for var in extra_vars:
            argv += ["-e", var]
        nodes = sorted({h["pve_node"] for h in hosts})
        return self.playbook(argv, env, hosts, nodes=nodes)

    def run_bc(self, size):
        return self.run_b(size, extra_vars=("gpufleet_read_by=container",))

    def run_bi(self, size):
        return self.run_b(size, extra_vars=("gpufleet_node_read=container",))

    def run_bl(self, size):
        return self.run_b(size, extra_vars=("gpufleet_job_libraries=false",))

    def run_bh(self, size):
        return self.run_b(size, extra_vars=("gpufleet_gpu_health=true",))

    def run_c(self, size):
        hosts = self.hosts(size)
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", self.inventories[size]["C"], "-f", str(len(hosts)),
                os.path.join(WORK, "shell.yml")]
        return self.playbook(argv, self.env, hosts, expect_rc=(0,))

    def run_f(self, size):
        """Ansible's floor: the same ansible-playbook and inventory as B, as many forks, one ping task on each node of
        the size; run from the benchmark's own directory, so with Ansible's defaults (no ansible.cfg of this
        repository: none of its callbacks)."""
        hosts = self.hosts(size)
        self.fleet.close_masters()
        nodes = sorted({h["pve_node"] for h in hosts})
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", self.inventories[size]["B"], "-f", str(len(hosts)),
                os.path.join(WORK, "floor.yml")]
        wall, _found = self.playbook(argv, self.env, [{"name": n} for n in nodes], expect_rc=(0,), cwd=WORK)
        return wall, {h["name"]: None for h in hosts}

    def run_d(self, size):
        hosts = self.hosts(size)
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", self.inventories[size]["D"], "-f", str(len(hosts)), PLAYBOOK]
        return self.playbook(argv, self.mitogen_env, hosts)

    def run_b0(self, size, extra_env=None, pre=()):
        hosts = self.hosts(size)
        self.fleet.close_masters()
        env = ansible_env(self.home, [PEER_COLLECTIONS], extra_env)
        env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join([os.path.join(self.before, "collections"), PEER_COLLECTIONS])
        src = os.path.join(self.before, "src")
        # As B: as many forks as hosts, and a container absent from the recap passed when its node read it.
        argv = list(pre) + [os.path.join(BIN, "ansible-playbook"), "-i", self.inventories[size]["B"], "-f", str(len(hosts)),
                            os.path.join(src, "playbooks", "preflight.yml")]
        return self.playbook(argv, env, hosts, cwd=src, nodes=sorted({h["pve_node"] for h in hosts}))

    def run(self, config, size):
        return {"A": self.run_a, "A2": self.run_a2, "B": self.run_b, "BC": self.run_bc, "BH": self.run_bh,
                "BI": self.run_bi, "BL": self.run_bl, "C": self.run_c, "D": self.run_d, "F": self.run_f, "P": self.run_p,
                "T": self.run_t, "B0": self.run_b0}[config](size)

    # ------------------------------------------------------------------ setup of B0 and D

    def prepare_before(self, ref):
        """The repository at `ref`, extracted (git archive) with a collections path of its own."""
        self.before = os.path.join(WORK, "before")
        shutil.rmtree(self.before, ignore_errors=True)
        src = os.path.join(self.before, "src")
        os.makedirs(src)
        archive = os.path.join(self.before, "src.tar")
        subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", "-o", archive, ref], check=True)
        with tarfile.open(archive) as t:
            t.extractall(src)
        coll = os.path.join(self.before, "collections", "ansible_collections", "gpufleet")
        os.makedirs(coll)
        os.symlink(src, os.path.join(coll, "hygiene"))
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", ref], stdout=subprocess.PIPE, text=True,
                              check=True).stdout.strip()

    def prepare_mitogen(self, site):
        """Only mitogen and ansible_mitogen on ansible's PYTHONPATH (not the tools venv's other packages)."""
        path = os.path.join(WORK, "mitogen-path")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        for name in ("mitogen", "ansible_mitogen"):
            os.symlink(os.path.join(site, name), os.path.join(path, name))
        self.mitogen_env = dict(self.env, PYTHONPATH=path, ANSIBLE_STRATEGY="mitogen_linear",
                                ANSIBLE_STRATEGY_PLUGINS=os.path.join(site, "ansible_mitogen", "plugins", "strategy"))


def profile_tasks(text):
    """The profile_tasks callback's summary: [(task, seconds)]."""
    out = []
    part = text.split("=" * 20, 1)[-1]
    for m in re.finditer(r"^(.+?) -+ (\d+\.\d+)s\s*$", part, re.MULTILINE):
        out.append((m.group(1).strip(), float(m.group(2))))
    return out


_STAMP = re.compile(r"^\w+ \d+ \w+ \d+\s+[\d:]+ [+-]\d{4} \(([\d:.]+)\)\s+([\d:.]+) \*+\s*$")


def _seconds(text):
    h, m, sec = text.split(":")
    return 3600 * int(h) + 60 * int(m) + float(sec)


def play_times(text, wall):
    """Where a profiled run's wall time went, by play: [(part, seconds)], from the PLAY banners and
    profile_tasks' timestamp line after each task banner (elapsed since its start). A task's time runs
    until the next task starts, so a play's includes the start of the next; what comes before the first
    task (Python, ansible-core, the inventory, the plugins) and after the last is its own part."""
    parts, play, banner, first, last = [], None, "", None, None
    for line in text.splitlines():
        if line.startswith(("PLAY [", "TASK [", "TASKS RECAP")):
            banner = line
            if line.startswith("PLAY ["):
                play = line[len("PLAY ["):line.rindex("]")]
            continue
        m = _STAMP.match(line)
        if not m:
            continue
        elapsed = _seconds(m.group(2))
        if last is None:
            first = elapsed
        else:
            parts[-1][1] += elapsed - last
        last = elapsed
        if banner.startswith("TASKS RECAP"):
            break
        if not parts or parts[-1][0] != play:
            parts.append([play, 0.0])
    if last is None:
        return [("the whole run (no task ran)", round(wall, 2))]
    return [("before the first task and after the last (Python, ansible-core, inventory, plugins)", round(wall - last + first, 2))] + \
        [(name, round(sec, 2)) for name, sec in parts]


def pyspy_top(raw_file, top=15):
    """py-spy's raw (collapsed) stacks: the share of samples per leaf function, and per ansible area."""
    leaves = collections.Counter()
    total = 0
    with open(raw_file) as f:
        for line in f:
            stack, _sep, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            total += n
            leaf = stack.split(";")[-1]
            if leaf.startswith("process "):
                continue  # a process's own root frame (py-spy --subprocesses): no Python function
            leaf = re.sub(r" \((?:[^()]*/)?(site-packages/|lib/python3\.\d+/)?([^()]*)\)", r" (\2)", leaf)
            leaves[leaf] += n
    return total, [(name, n / total) for name, n in leaves.most_common(top)] if total else []


def measure(args, sizes, configs, command):
    """Bring up the fleet, run the rounds (and the profile and clean-fleet runs asked for), take
    the fleet down. Returns (results, meta, verdicts) for _fleettables.summarize."""
    largest = max(sizes, key=lambda s: (s[0] * s[1], s))
    max_nodes = max(n for n, _m in sizes)
    max_cts = max(m for _n, m in sizes)

    versions = ensure_peer(args.peer_wheel)
    site = ensure_tools(TOOLS, TOOL_PACKAGES) if {"D", "P"} & set(configs) or args.plot or args.profile else None
    os.makedirs(WORK, exist_ok=True)
    open(os.path.join(WORK, "runs.log"), "w").close()
    fleet = Fleet(args.state, os.path.join(WORK, "inventory"), args.port)
    results = {"runs": collections.defaultdict(list), "load": [], "errors": []}
    meta = {
        "command": command,
        "machine": "%s, %d CPUs, Python %s" % (platform.machine(), os.cpu_count(), platform.python_version()),
        "ansible_core": subprocess.run([os.path.join(BIN, "ansible"), "--version"], stdout=subprocess.PIPE, text=True,
                                       check=True).stdout.splitlines()[0],
        "peers": versions, "method": args.method, "cores": os.cpu_count(), "max_sessions": MAX_SESSIONS,
        "sizes": [label(s) for s in sizes], "rounds": args.rounds,
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE, text=True,
                                 check=False).stdout.strip(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    avail = mem_available_mib()
    t_up = time.perf_counter()
    try:
        # A GPU of its own for each container of a node, as a training fleet gives them: a GPU
        # shared by containers shows one's memory in the others' readings (the node's nvidia-smi).
        fleet.up(max_nodes, max_cts, ["--scenario", "incident", "--gpus", str(max_cts), "--jobs", str(args.up_jobs)])
        meta["fleet_up_s"] = round(time.perf_counter() - t_up, 1)
        meta["fleet_mem_mib"] = avail - mem_available_mib()
        st = os.statvfs(args.state)
        meta["fleet_disk"] = subprocess.run(["du", "-sx", "--block-size=1M", args.state], stdout=subprocess.PIPE, text=True,
                                            check=False).stdout.split("\t")[0] + " MiB"
        meta["fleet_inodes_free"] = st.f_ffree
        log("fleet up (%dx%d) in %.1f s, %d MiB of memory, %s on disk" % (
            max_nodes, max_cts, meta["fleet_up_s"], meta["fleet_mem_mib"], meta["fleet_disk"]))
        bench = Bench(args, fleet)
        for size in sizes:
            bench.write_inventories(size)
        if site and "D" in configs:
            bench.prepare_mitogen(site)
        try:
            results["read_cpu"] = bench.read_cpu(args.read_samples)
        except RuntimeError as exc:
            results["errors"].append("read CPU: %s" % str(exc)[:2000])
            log("read CPU FAILED: %s" % str(exc)[:300])
        plan = [(c, s) for s in sizes for c in configs + ["T"]]
        if args.before:
            meta["before"] = bench.prepare_before(args.before)
            plan.append(("B0", largest))
        verdicts = {}
        warmup = {}
        for r in range(args.rounds + 1):
            k = r % len(plan)
            for c, s in plan[k:] + plan[:k]:
                load = os.getloadavg()[0]
                try:
                    wall, found = bench.run(c, s)
                except RuntimeError as exc:  # recorded and reported; the other runs go on
                    results["errors"].append("round %d %s %s: %s" % (r, c, label(s), str(exc)[:2000]))
                    log("round %d %s %s FAILED: %s" % (r, c, label(s), str(exc)[:300]))
                    continue
                if r:
                    results["runs"]["%s@%s" % (c, label(s))].append(round(wall, 3))
                    results["load"].append(round(load, 2))
                verdicts.setdefault(label(s), {})[c] = found
                log("round %d %-2s %-5s %6.2f s (load %.1f)" % (r, c, label(s), wall, load))
                results["retries"] = dict(bench.retries)
                # Every run as it comes (runs.json beside the results): a long run stopped
                # half-way keeps what it measured, and the warm-up's walls are kept apart.
                with open(os.path.join(WORK, "runs.json"), "w") as f:
                    json.dump({"meta": meta, "round": r, "warmup": warmup, "runs": results["runs"]}, f, indent=1)
                if not r:
                    warmup["%s@%s" % (c, label(s))] = round(wall, 3)

        profiled = parse_sizes(args.profile_sizes) if args.profile_sizes else [largest]
        for name, todo, fn in (("profile", args.profile, lambda: profile_sizes(bench, profiled, site, args.before)),
                               ("remediate", args.remediate_rounds, lambda: remediate(bench, largest, args.remediate_rounds))):
            if todo:
                try:
                    results[name] = fn()
                except RuntimeError as exc:
                    results["errors"].append("%s: %s" % (name, str(exc)[:2000]))
                    log("%s FAILED: %s" % (name, str(exc)[:300]))
    finally:
        t_down = time.perf_counter()
        fleet.down()
        log("fleet down in %.1f s" % (time.perf_counter() - t_down))
    return results, meta, verdicts


def profile_sizes(bench, sizes, site, before):
    """profile() at each size: {"B@1x1": ..., "B@8x4": ...} (one size: the plain names, as before)."""
    if len(sizes) == 1:
        return profile(bench, sizes[0], site, before)
    return {"%s@%s" % (name, label(size)): pr for size in sizes for name, pr in profile(bench, size, site, before).items()}


def profile(bench, size, site, before):
    out = {}
    # The repository's ansible.cfg enables gpufleet.hygiene.preload; this list replaces it.
    env = {"ANSIBLE_CALLBACKS_ENABLED": "gpufleet.hygiene.preload,ansible.posix.profile_tasks", "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all"}
    runs = [("B", bench.run_b)] + ([("B0", bench.run_b0)] if before else [])
    for name, fn in runs:
        start = os.path.getsize(bench.logfile)
        wall = fn(size, extra_env=env)[0]
        with open(bench.logfile) as f:
            f.seek(start)
            text = f.read()
            out[name] = {"wall_s": round(wall, 2), "tasks": profile_tasks(text), "plays": play_times(text, wall)}
        log("profile %s: %.2f s" % (name, wall))
        if site:
            raw = os.path.join(WORK, "py-spy-%s.txt" % name)
            pyspy = os.path.join(TOOLS, "bin", "py-spy")
            record = [pyspy, "record", "--subprocesses", "--nonblocking", "--rate", "50", "--format", "raw", "--output", raw, "--"]
            wall = fn(size, pre=record)[0]
            total, top = pyspy_top(raw)
            out[name]["py_spy"] = {"wall_s": round(wall, 2), "samples": total, "top": top}
            log("py-spy %s: %.2f s, %d samples" % (name, wall, total))
    return out


def remediate(bench, size, rounds):
    hosts = bench.hosts(size)
    env = bench.env
    inv = bench.inventories[size]["B"]
    common = ["-i", inv, "-f", str(len(hosts)), "-e", "gpufleet_allow_running_job=true"]
    bench.fleet.close_masters()
    wall = bench.playbook([os.path.join(BIN, "ansible-playbook")] + common + [REMEDIATE], env, hosts, expect_rc=(0,))[0]
    log("remediate repaired the fleet in %.2f s" % wall)
    out = {"repair_s": round(wall, 2), "preflight": [], "remediate": []}
    for r in range(rounds + 1):
        order = [("preflight", PLAYBOOK), ("remediate", REMEDIATE)]
        for name, book in order if r % 2 == 0 else order[::-1]:
            bench.fleet.close_masters()
            wall = bench.playbook([os.path.join(BIN, "ansible-playbook")] + common + [book], env, hosts,
                                  expect_rc=(0,), changed_ok=(name == "preflight"),
                                  nodes=sorted({h["pve_node"] for h in hosts}))[0]
            if r:
                out[name].append(round(wall, 3))
            log("clean fleet round %d %s %.2f s" % (r, name, wall))
    return out


def plot(doc, path, configs):
    """Draw the plot (_fleetplot.py) with the tools venv's Python, where matplotlib is."""
    python = os.path.join(TOOLS, "bin", "python")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    names = {c: NAMES[c] for c in configs if c != "B0"}
    title = "%s; %s; medians of %d rounds, interleaved" % (doc["meta"]["machine"], doc["meta"]["ansible_core"], doc["meta"]["rounds"])
    data = os.path.join(os.path.dirname(os.path.abspath(path)), ".plot-%d.json" % os.getpid())
    with open(data, "w") as f:
        json.dump(doc, f)
    try:
        subprocess.run([python, os.path.join(HERE, "_fleetplot.py"), data, path, json.dumps(names), title], check=True)
    finally:
        os.unlink(data)
    print("plot: %s" % os.path.relpath(path, ROOT))
