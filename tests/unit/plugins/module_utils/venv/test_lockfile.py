# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_lockfile: baselines in the formats users have, written by the real tools (uv, pip), and
malformed ones; the strict baseline check (readiness/_readiness's check_packages, pip_inventory)
against a real venv."""

from __future__ import annotations

import os
import subprocess

import pytest
import tomllib
from cuda_fixtures import UV, install, make_venv

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._checks import check_packages
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import DistError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._inventory import parse_requirements
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._lockfile import MAX_BYTES, BaselineError, parse_lock
from ansible_collections.gpufleet.hygiene.plugins.modules import pip_inventory

PINNED = {"numpy": "2.2.6", "safetensors": "0.6.2", "triton": "3.4.0"}
REQUIREMENTS_IN = 'numpy==2.2.6\nsafetensors==0.6.2 ; python_version >= "3.9"\ntriton\n'


def uv(*argv, cwd=None):
    subprocess.run([UV, "--quiet", *argv], check=True, cwd=cwd, env=dict(os.environ, UV_NO_CACHE="1"))


def versions(wanted):
    return {key: entry["version"] for key, entry in wanted.items()}


def read(path):
    with open(path, "rb") as f:
        return parse_lock(f.read(), path)


@pytest.fixture(scope="module")
def locks(seed_wheels, tmp_path_factory):
    """Locks of one set of pins, in each format, written by the tool that writes it."""
    root = tmp_path_factory.mktemp("locks")
    (root / "requirements.in").write_text(REQUIREMENTS_IN)
    offline = ["--no-index", "--find-links", seed_wheels]
    uv("pip", "compile", *offline, "--generate-hashes", "requirements.in", "-o", "hashed.txt", cwd=root)
    uv("pip", "compile", *offline, "requirements.in", "-o", "pylock.toml", cwd=root)
    project = root / "trainer"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n'
        'dependencies = ["numpy==2.2.6", "safetensors>=0.6", "triton ; sys_platform == \'linux\'"]\n'
        '[tool.uv]\nno-index = true\nfind-links = ["%s"]\n' % seed_wheels)
    uv("lock", cwd=project)
    uv("export", "--format", "requirements-txt", "-o", str(root / "export.txt"), cwd=project)
    os.makedirs(root / "export")
    uv("export", "--format", "pylock.toml", "-o", str(root / "export" / "pylock.trainer.toml"), cwd=project)
    venv = make_venv(str(root / "venv"), UV, seed_pip=True)
    install(UV, venv, seed_wheels, ["numpy==2.2.6", "triton==3.4.0"])
    # A wheel installed from its path: freeze writes it as `name @ file:///...whl`.
    uv("pip", "install", "--python", os.path.join(venv, "bin", "python"), "--no-deps",
       os.path.join(seed_wheels, "safetensors-0.6.2-py3-none-any.whl"))
    for name, argv in (("pip-freeze.txt", [os.path.join(venv, "bin", "python"), "-m", "pip", "freeze"]),
                       ("uv-freeze.txt", [UV, "pip", "freeze", "--python", os.path.join(venv, "bin", "python")])):
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        (root / name).write_text(out)
    return {"root": str(root), "project": str(project)}


@pytest.mark.parametrize("name", ["hashed.txt", "export.txt", "pylock.toml", "export/pylock.trainer.toml",
                                  "pip-freeze.txt", "uv-freeze.txt"])
def test_each_format_gives_the_pins(locks, name):
    path = os.path.join(locks["root"], name)
    wanted = read(path)
    if name == "uv-freeze.txt":
        # uv's freeze writes a wheel installed from a path as `name @ file://…whl`: its version is
        # the wheel's file name's.
        with open(path) as f:
            assert "safetensors @ file://" in f.read()
    if name.endswith("freeze.txt"):
        # uv's freeze lists the venv's pip and setuptools too (pip's own leaves them out).
        wanted = {k: v for k, v in wanted.items() if k not in ("pip", "setuptools")}
    assert versions(wanted) == PINNED, (name, wanted)
    assert {e["name"] for e in wanted.values()} == set(PINNED)


@pytest.mark.parametrize("name", ["pylock.toml", "export/pylock.trainer.toml"])
def test_pylock_agrees_with_tomllib(locks, name):
    path = os.path.join(locks["root"], name)
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    assert versions(read(path)) == {p["name"]: p.get("version") for p in doc["packages"]}


def test_a_lock_named_otherwise_is_known_by_its_first_statement(locks, tmp_path):
    with open(os.path.join(locks["root"], "pylock.toml"), "rb") as f:
        data = f.read()
    assert versions(parse_lock(data, str(tmp_path / "baseline.lock"))) == PINNED


REQUIREMENTS = """\
# pip freeze --all, by hand afterwards
-i https://pypi.org/simple
--extra-index-url https://download.pytorch.org/whl/cu128
-r other-requirements.txt
Torch[opt]==2.8.0+cu128 ; sys_platform == "linux" and python_version >= "3.9"  # the reference
nvidia_nccl_cu12==2.27.3 \\
    --hash=sha256:aaaa \\
    --hash=sha256:bbbb
    # via torch
triton===3.4.0
numpy>=2,<3
sglang @ https://example.org/wheels/sglang-0.5.12-py3-none-any.whl#sha256=cccc
flashinfer-python @ git+https://github.com/flashinfer-ai/flashinfer@v0.6.11
-e git+https://github.com/example/trainer@0123abc#egg=trainer
-e ./localpkg
# Editable install with no version control (helper==0.1)
"""


def test_requirements_with_every_kind_of_line(tmp_path):
    wanted = parse_lock(REQUIREMENTS.encode(), "requirements.txt")
    assert versions(wanted) == {"torch": "2.8.0+cu128", "nvidia-nccl-cu12": "2.27.3", "triton": "3.4.0",
                                "numpy": None, "sglang": "0.5.12", "flashinfer-python": None, "trainer": None}
    assert wanted["numpy"]["spec"] == ">=2,<3"
    assert wanted["torch"]["name"] == "Torch"
    # CRLF line ends and a byte-order mark, as an editor on another system writes them.
    crlf = ("\ufeff" + REQUIREMENTS).replace("\n", "\r\n").encode()
    assert versions(parse_lock(crlf, "requirements.txt")) == versions(wanted)


@pytest.mark.parametrize("text, line, words", [
    ("numpy==2.2.6\nnumpy=2.2.6\n", 2, "is not a requirement: 'numpy=2.2.6'"),
    ("numpy==\n", 1, "has a malformed version"),
    ("# a comment\n\nthis is prose\n", 3, "is not a requirement"),
    ("numpy==2.2.6 \\\n    --hash=sha256:aa\n<html>\n", 3, "is not a requirement: '<html>'"),
    ("numpy[extra==2.2.6\n", 1, "has an unclosed [extras]"),
    ("sglang @\n", 1, "has no URL after '@'"),
    ("ok==1\n\xff\xfe==2\n", 2, "is not valid UTF-8"),
])
def test_a_malformed_requirements_file_names_the_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "requirements.lock"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(BaselineError) as exc:
        read(str(path))
    assert exc.value.msg.startswith("%s line %d " % (path, line)), exc.value.msg
    assert words in exc.value.msg


@pytest.mark.parametrize("text, line, words", [
    ('lock-version = "1.0"\n[[packages]]\nname = "numpy\nversion = "2.2.6"\n', 3, "a string is not closed on its line"),
    ('lock-version = "1.0"\n[[packages]\nname = "numpy"\n', 2, "a table header is not closed with ']]'"),
    ('lock-version = "1.0"\n[[packages]]\nname = 3\n', 3, "name must be a string"),
    ('lock-version = "1.0"\n\n[[packages]]\nversion = "1"\n', 3, "the [[packages]] table has no name"),
    ('[[packages]]\nname = "a"\nname = "b"\n', 3, "name given twice"),
    ('[[packages]]\nname = "a"\nwheels = [\n  { url = "x", hashes = { sha256 = "y" } },\n', 3, "an array or inline table is not closed"),
    ('[[packages]]\nname = "a" version = "1"\n', 2, "unexpected 'version = \"1\"' after a value"),
    ('[[packages]]\nname "a"\n', 2, "expected '=' after the key name"),
    ('[[packages]]\nname = "a\\q"\n', 2, "an unknown escape \\q"),
    ('[[packages]]\nname = "--index-url"\n', 1, "a name that is no package name"),
])
def test_a_malformed_pylock_names_the_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "pylock.toml"
    path.write_text(text)
    with pytest.raises(BaselineError) as exc:
        read(str(path))
    assert exc.value.msg.startswith("%s line %d: " % (path, line)), exc.value.msg
    assert words in exc.value.msg


def test_pylock_subset_read_as_toml_reads_it(tmp_path):
    """Strings with escapes and brackets, multi-line strings and arrays, comments, dotted keys and
    sub-tables: only [[packages]]' own name and version count."""
    text = (
        '# a lock\nlock-version = "1.0"\nenvironments = [\n  "sys_platform == \'linux\'", # one\n]\n'
        'extras = []\ncreated-by = """several\nlines ] ["""\n[tool.mine]\nname = "not-a-package"\n'
        '[[packages]]\nname = "nu\\u006dpy"  # numpy\nversion = \'2.2.6\'\n'
        'sdist = { url = "https://x/y]{", upload-time = 2025-01-01 10:00:00Z, size = 1 }\n'
        '[packages.vcs]\nname = "inner"\nversion = "9"\n[[packages.wheels]]\nname = "numpy-2.2.6-py3-none-any.whl"\n'
        '[[packages]]\nname = "trainer"\n[packages.directory]\npath = "."\neditable = true\n'
    )
    path = tmp_path / "pylock.toml"
    path.write_text(text)
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    assert versions(read(str(path))) == {"numpy": "2.2.6", "trainer": None}
    assert [p["name"] for p in doc["packages"]] == ["numpy", "trainer"]


def test_uv_lock_is_refused_with_how_to_export_it(locks):
    with pytest.raises(BaselineError) as exc:
        read(os.path.join(locks["project"], "uv.lock"))
    assert "uv export --format pylock.toml" in exc.value.msg


def test_a_file_too_large_for_a_lock_is_not_read():
    with pytest.raises(BaselineError, match="more than a lock holds"):
        parse_lock(b"#" * (MAX_BYTES + 1), "requirements.txt")


def test_dist_parse_requirements_is_the_lock_parser():
    with pytest.raises(DistError, match="line 1 is not a requirement"):
        parse_requirements(b"not a requirement\n", "r.txt")
    assert versions(parse_requirements(b"[[packages]]\nname = 'a'\nversion = '1'\n", "r.toml")) == {"a": "1"}


# ---------------------------------------------------------------------------- strict baseline

@pytest.fixture
def leftover_venv(tmp_path, seed_wheels):
    """numpy and triton as the lock says, plus the seed's leftover sglang, and pip itself."""
    venv = make_venv(str(tmp_path / "venv"), UV, seed_pip=True)
    install(UV, venv, seed_wheels, ["numpy==2.2.6", "triton==3.4.0"])
    uv("pip", "install", "--python", os.path.join(venv, "bin", "python"), "--no-deps", "--no-index",
       "--find-links", seed_wheels, "sglang==0.5.12")
    lock = tmp_path / "pylock.toml"
    lock.write_text('lock-version = "1.0"\n[[packages]]\nname = "numpy"\nversion = "2.2.6"\n'
                    '[[packages]]\nname = "triton"\nversion = "3.4.0"\n')
    return venv, str(lock)


def test_strict_baseline_fails_a_leftover_and_lax_passes_it(run_module, leftover_venv):
    venv, lock = leftover_venv
    result = run_module(pip_inventory.main, dict(venv=venv, baseline=lock))
    extra = {e["name"] for e in result["drift"]["extra"]}
    assert "sglang" in extra and "pip" in extra
    assert result["drift"]["missing"] == [] and result["drift"]["changed"] == []
    lax = check_packages(result)
    assert lax["ok"] is True
    strict = check_packages(result, strict=True)
    assert strict["ok"] is False
    assert "strict, so these fail: sglang" in strict["summary"]
    assert "pip" not in strict["summary"].split("fail: ", 1)[1]


def test_strict_baseline_passes_a_venv_that_matches(run_module, leftover_venv, tmp_path):
    venv, lock = leftover_venv
    with open(lock, "a") as f:
        f.write('[[packages]]\nname = "sglang"\nversion = "0.5.12"\n')
    result = run_module(pip_inventory.main, dict(venv=venv, baseline=lock))
    check = check_packages(result, strict=True)
    assert check["ok"] is True, check
    # pip, which pip freeze leaves out, is extra but never fails the strict check.
    assert {e["name"] for e in result["drift"]["extra"]} <= {"pip", "setuptools"}


def test_a_malformed_baseline_fails_pip_inventory_with_the_line(run_module, leftover_venv, tmp_path):
    venv, _lock = leftover_venv
    bad = tmp_path / "requirements.txt"
    bad.write_text("numpy==2.2.6\ntriton 3.4.0\n")
    result = run_module(pip_inventory.main, dict(venv=venv, baseline=str(bad)))
    assert result["failed"]
    assert result["msg"] == "%s line 2 is not a requirement: 'triton 3.4.0'" % bad
