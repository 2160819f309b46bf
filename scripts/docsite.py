# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Build the collection's documentation site (antsibull-docs, then Sphinx) and check it.

    python scripts/docsite.py DEST     the site in DEST/html; fails on any Sphinx warning and
                                       when a module, plugin, role, extra doc or guide has no page

Run from the repository root with .venv's tools (ansible.cfg resolves the collection from the
checkout). Nothing is fetched: references to Ansible's own documentation resolve through a
small local inventory of the labels antsibull-docs' pages use.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zlib

import yaml

COLLECTION = "gpufleet.hygiene"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
# antsibull-docs runs ansible-doc and ansible from PATH; the checkout's ansible.cfg, wherever a tool
# runs, resolves the collection.
ENV = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
ANSIBLE_DOCS = "https://docs.ansible.com/projects/ansible/devel/"
# The labels of Ansible's documentation that the generated pages refer to: (name, role, page).
# A page that refers to another one fails the build, naming it; add it here. Environment variables
# are all of ansible-core's (its configuration page has each one).
ANSIBLE_LABELS = [
    ("common_return_values", "std:label", "reference_appendices/common_return_values.html"),
    ("ansible_configuration_settings", "std:label", "reference_appendices/config.html"),
] + [
    ("%s_plugins" % kind, "std:label", "plugins/%s.html" % kind)
    for kind in ("action", "callback", "connection", "inventory", "filter")
] + [
    ("ansible_collections.ansible.builtin.%s" % page, "std:label", "collections/ansible/builtin/%s.html" % page)
    for page in ("inventory_hostnames_lookup", "stat_module", "wait_for_module")
]


DOCS = os.path.join(ROOT, "docs")
# The Markdown guides in docs/ render (MyST) as pages under docsite/guides/, beside guides.rst whose
# toctree names them; the images and data they link to go with them.
GUIDES_DIR = ("docsite", "guides")
GUIDE_ASSETS = ("img", "data")
# A Markdown link's target: ](target) or ](target "title"), possibly after a line break.
LINK = re.compile(r"(\]\(\s*)([^)\s#]+)")


def guides():
    """Every guide, relative to docs/, without its .md."""
    return sorted(os.path.relpath(p, DOCS)[:-3] for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


def repository():
    with open(os.path.join(ROOT, "galaxy.yml")) as f:
        return yaml.safe_load(f)["repository"].rstrip("/")


def copy_guides(rst):
    """Copy the guides into the Sphinx source tree; a link to a file of the repository outside docs/
    (../README.md, a source file) points at that file in the repository instead."""
    dest = os.path.join(rst, *GUIDES_DIR)
    for asset in GUIDE_ASSETS:
        shutil.copytree(os.path.join(DOCS, asset), os.path.join(dest, asset))
    base = repository() + "/blob/main/"

    def outside(name):
        def rewrite(m):
            target = m.group(2)
            if "://" in target or target.startswith("mailto:"):
                return m.group(0)
            path = os.path.normpath(os.path.join(os.path.dirname(os.path.join(DOCS, name)), target))
            if os.path.commonpath([path, DOCS]) == DOCS:
                return m.group(0)
            return m.group(1) + base + os.path.relpath(path, ROOT)
        return rewrite

    # guides.rst names each guide as ``docs/NAME.md`` (it reads so wherever the extra docs are shown);
    # on the site each name links to the guide's page, and a toctree holds them all.
    page = os.path.join(rst, *GUIDES_DIR) + ".rst"
    with open(page) as f:
        text = re.sub(r"^``docs/(\S+)\.md``$", r":doc:`%s/\1`" % GUIDES_DIR[1], f.read(), flags=re.MULTILINE)
    with open(page, "w") as f:
        f.write(text + "\n.. toctree::\n   :hidden:\n\n" + "".join("   %s/%s\n" % (GUIDES_DIR[1], g) for g in guides()))
    for guide in guides():
        with open(os.path.join(DOCS, guide + ".md")) as f:
            text = LINK.sub(outside(guide + ".md"), f.read())
        os.makedirs(os.path.dirname(os.path.join(dest, guide)), exist_ok=True)
        with open(os.path.join(dest, guide + ".md"), "w") as f:
            f.write(text)


def ansible_envvars():
    import ansible.config
    with open(os.path.join(os.path.dirname(ansible.config.__file__), "base.yml")) as f:
        base = yaml.safe_load(f)
    names = {e["name"] for setting in base.values() if isinstance(setting, dict) for e in setting.get("env") or []}
    return [(n, "std:envvar", "reference_appendices/config.html#envvar-" + n) for n in sorted(names)]


def write_inventory(path):
    """An objects.inv (Sphinx inventory version 2) for ANSIBLE_LABELS."""
    lines = "".join("%s %s -1 %s %s\n" % (name, role, page, "-") for name, role, page in ANSIBLE_LABELS + ansible_envvars())
    header = "# Sphinx inventory version 2\n# Project: Ansible\n# Version: devel\n# The remainder of this file is compressed using zlib.\n"
    with open(path, "wb") as f:
        f.write(header.encode() + zlib.compress(lines.encode()))


def run(*argv, cwd=ROOT):
    subprocess.run(argv, cwd=cwd, check=True, env=ENV)


def expected_pages():
    """A page per plugin and role, as antsibull-docs names them (what ansible-doc lists and, so that a
    plugin whose documentation ansible-doc cannot read is not left out, every plugin file and every
    role with an argument spec), and the extra docs."""
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "--metadata-dump", "--no-fail-on-errors", COLLECTION],
                          cwd=ROOT, capture_output=True, text=True, check=True, env=ENV)
    found = {(kind, fqcn.rsplit(".", 1)[1]) for kind, names in json.loads(proc.stdout)["all"].items() if kind != "keyword"
             for fqcn in names}
    for folder, kind in (("modules", "module"), ("connection", "connection"), ("inventory", "inventory"),
                         ("callback", "callback"), ("lookup", "lookup"), ("test", "test")):
        path = os.path.join(ROOT, "plugins", folder)
        found |= {(kind, n[:-3]) for n in (os.listdir(path) if os.path.isdir(path) else [])
                  if n.endswith(".py") and not n.startswith("_")}
    found |= {("role", r) for r in os.listdir(os.path.join(ROOT, "roles"))
              if os.path.exists(os.path.join(ROOT, "roles", r, "meta", "argument_specs.yml"))}
    pages = {"%s_%s.html" % (name, kind) for kind, name in found}
    with open(os.path.join(ROOT, "docs", "docsite", "extra-docs.yml")) as f:
        for section in yaml.safe_load(f)["sections"]:
            for entry in section["toctree"]:
                pages.add("docsite/%s.html" % (entry["ref"] if isinstance(entry, dict) else entry))
    pages |= {"/".join(GUIDES_DIR + (g + ".html",)) for g in guides()}
    return pages


INSTALL = ('collection_install = {\n  * = "ansible-galaxy collection build in a clone of the collection, then ansible-galaxy '
           'collection install -p ~/.ansible/collections {namespace}-{name}-*.tar.gz (not yet on Galaxy)"\n}')


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def main(dest):
    dest = os.path.abspath(dest)
    shutil.rmtree(dest, ignore_errors=True)
    src = os.path.join(dest, "src")
    os.makedirs(src)
    run(os.path.join(BIN, "antsibull-docs"), "sphinx-init", "--use-current", "--squash-hierarchy", "--fail-on-error",
        "--dest-dir", src, "--project", COLLECTION, "--copyright", "gpufleet.hygiene contributors",
        "--title", "gpufleet.hygiene", COLLECTION)
    # Sphinx reads conf.py as Python: offline, the only inventory is the local one.
    inventory = os.path.join(src, "ansible_devel.inv")
    write_inventory(inventory)
    with open(os.path.join(src, "conf.py"), "a") as f:
        f.write("\nintersphinx_mapping = {'ansible_devel': (%r, %r)}\n" % (ANSIBLE_DOCS, inventory))
        # The guides are Markdown; links between them name a heading by its GitHub-style slug.
        f.write("extensions.append('myst_parser')\nmyst_heading_anchors = 6\n")
    # The collection is not on Galaxy: every page's "To install it" says how to install it today, from the
    # tarball a clone builds (README, "Install from the artifact").
    cfg = os.path.join(src, "antsibull-docs.cfg")
    with open(cfg) as f:
        text = f.read()
    start = text.index("collection_install = {")
    end = text.index("\n}", start) + 2
    with open(cfg, "w") as f:
        f.write(text[:start] + INSTALL + text[end:])
    rst = os.path.join(src, "rst")
    os.chmod(rst, 0o755)  # antsibull-docs wants its output folder writable by itself alone
    run(os.path.join(BIN, "antsibull-docs"), "--config-file", "antsibull-docs.cfg", "collection", "--cleanup", "everything",
        "--fail-on-error", "--use-current", "--squash-hierarchy", "--dest-dir", "rst", COLLECTION, cwd=src)
    copy_guides(rst)
    html = os.path.join(dest, "html")
    run(os.path.join(BIN, "sphinx-build"), "-b", "html", "-c", src, "-W", "--keep-going", "-q", rst, html)
    built = {os.path.relpath(os.path.join(d, n), html) for d, _dirs, names in os.walk(html) for n in names if n.endswith(".html")}
    missing = sorted(expected_pages() - built)
    if missing:
        sys.exit("the site has no page for: %s" % ", ".join(missing))
    published = [n for n in sorted(built) if "collection install %s" % COLLECTION in _read(os.path.join(html, n))]
    if published:
        sys.exit("these pages tell users to install %s from Galaxy, where it is not published: %s" % (COLLECTION, ", ".join(published)))
    print("docs site: %d pages in %s" % (len(built), html))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
