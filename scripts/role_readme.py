# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write each role's README.md from its meta/argument_specs.yml, so the docs cannot drift.

    python scripts/role_readme.py          rewrite roles/*/README.md
    python scripts/role_readme.py --check  fail when a README differs from what its spec gives
"""

import argparse
import difflib
import glob
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def as_list(value):
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def cell(value):
    return str(value).replace("|", "\\|").replace("\n", " ")


def fmt_default(value):
    if isinstance(value, str):
        return "`%s`" % cell(value) if value else "`''`"
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return "`%s`" % cell(text[:-4].strip() if text.endswith("\n...") else text)


def option_row(name, opt):
    kind = opt.get("type", "str")
    if kind == "list" and opt.get("elements"):
        kind = "list of %s" % opt["elements"]
    if opt.get("choices"):
        kind += " (%s)" % ", ".join(str(c) for c in opt["choices"])
    default = "*required*" if opt.get("required") else fmt_default(opt.get("default"))
    return "| `%s` | %s | %s | %s |" % (name, kind, default, cell(" ".join(as_list(opt.get("description")))))


def render(role, spec):
    main = spec["argument_specs"]["main"]
    lines = ["# gpufleet.hygiene.%s" % role, "", main["short_description"], ""]
    for para in as_list(main.get("description")):
        lines += [para, ""]
    lines += ["<!-- Generated from meta/argument_specs.yml by scripts/role_readme.py: edit the spec, not this file. -->", "",
              "## Variables", "", "| variable | type | default | description |", "| --- | --- | --- | --- |"]
    lines += [option_row(name, opt) for name, opt in main.get("options", {}).items()]
    for entry, other in spec["argument_specs"].items():
        if entry == "main":
            continue
        lines += ["", "## Entry point `%s` (`tasks_from: %s`)" % (entry, entry), "", other["short_description"], ""]
        for para in as_list(other.get("description")):
            lines += [para, ""]
        options, main_options = other.get("options", {}), main.get("options", {})
        if set(main_options) <= set(options):
            added = [(n, o) for n, o in options.items() if n not in main_options]
            lines += ["It takes every variable above, and:" if added else "It takes every variable above."]
        elif set(options) <= set(main_options):
            names = ", ".join("`%s`" % n for n in options)
            lines += ["It takes only these of the variables above: %s." % names if options else "It takes none of the variables above."]
            added = []
        else:
            added = list(options.items())
            lines += ["Its variables:"]
        if added:
            lines += ["", "| variable | type | default | description |", "| --- | --- | --- | --- |"]
            lines += [option_row(name, opt) for name, opt in added]
    lines += ["", "## Example", "", "```yaml", "- name: Use the %s role" % role, "  hosts: pve_containers",
              "  gather_facts: false", "  roles:", "    - role: gpufleet.hygiene.%s" % role, "```", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for spec_path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "meta", "argument_specs.yml"))):
        role_dir = os.path.dirname(os.path.dirname(spec_path))
        role = os.path.basename(role_dir)
        with open(spec_path) as f:
            text = render(role, yaml.safe_load(f))
        readme = os.path.join(role_dir, "README.md")
        current = ""
        if os.path.exists(readme):
            with open(readme) as f:
                current = f.read()
        if current != text:
            if args.check:
                stale.append(readme)
                sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), readme, "from spec"))
            else:
                with open(readme, "w") as f:
                    f.write(text)
    if stale:
        sys.exit("role READMEs differ from their argument_specs.yml: run scripts/role_readme.py")


if __name__ == "__main__":
    main()
