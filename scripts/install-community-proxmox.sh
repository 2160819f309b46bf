#!/usr/bin/env bash
# community.proxmox, pinned, into a collections path (default .ansible/collections, which
# ansible.cfg reads): the tests run its `proxmox` inventory plugin against the Proxmox VE API
# stand-in, as the users of that inventory run it against their cluster.
#
# Galaxy is not needed: the `ansible` package on PyPI bundles community.proxmox. ansible 12.3.0
# requires ansible-core ~=2.19.5 (this collection's) and bundles community.proxmox 1.4.0. Only
# that wheel is downloaded (no dependencies, its SHA-256 checked by pip) and only
# ansible_collections/community/proxmox/ is taken from it; nothing else of it is installed.
set -euo pipefail
ANSIBLE_VERSION=12.3.0
ANSIBLE_SHA256=cd156f82fa87f7a899212b0efa9f7ca3a24d609212de9f78428a572eb01e5414
COLLECTION_VERSION=1.4.0
dest=${1:-.ansible/collections}
py=${PY:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'ansible==%s --hash=sha256:%s\n' "$ANSIBLE_VERSION" "$ANSIBLE_SHA256" > "$tmp/req.txt"
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
  -r "$tmp/req.txt" -d "$tmp/wheel"
"$py" - "$tmp/wheel/ansible-$ANSIBLE_VERSION-py3-none-any.whl" "$dest" "$COLLECTION_VERSION" <<'PY'
import json, os, shutil, sys, zipfile
wheel, dest, want = sys.argv[1:]
prefix = "ansible_collections/community/proxmox/"
target = os.path.join(dest, prefix)
staging = target.rstrip("/") + ".new"
shutil.rmtree(staging, ignore_errors=True)
with zipfile.ZipFile(wheel) as zf:
    members = [m for m in zf.infolist() if m.filename.startswith(prefix) and not m.is_dir()]
    for m in members:
        rel = m.filename[len(prefix):]
        if rel.startswith("/") or ".." in rel.split("/"):
            raise SystemExit("unexpected path in the wheel: %s" % m.filename)
        out = os.path.join(staging, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with zf.open(m) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
with open(os.path.join(staging, "MANIFEST.json")) as f:
    got = json.load(f)["collection_info"]["version"]
if got != want:
    raise SystemExit("community.proxmox %s in the wheel, %s expected" % (got, want))
shutil.rmtree(target, ignore_errors=True)
os.replace(staging, target.rstrip("/"))
print("community.proxmox %s installed in %s (%d files)" % (got, dest, len(members)))
PY
