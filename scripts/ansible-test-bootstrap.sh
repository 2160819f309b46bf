#!/usr/bin/env bash
# ansible-test puts pip into each sanity venv with a bootstrap script (get-pip.py) that it
# downloads from a host outside PyPI. Provide the same bootstrap from pip's own wheel on
# PyPI (tests/sanity/get_pip.py) so sanity runs where only the package registries are
# reachable. The pip version is the one this ansible-test pins.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$("$here/.venv/bin/python" -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py"))')
version=$(sed -n "s/^ *pip='\([0-9.]*\)',\$/\1/p" "$src" | head -1)
[ -n "$version" ] || { echo "cannot read the pip version ansible-test pins from $src" >&2; exit 1; }
cache="$HOME/.ansible/test/cache"
mkdir -p "$cache"
if [ ! -f "$cache/pip-$version-py3-none-any.whl" ]; then
  "$here/.venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$cache" "pip==$version"
fi
install -m 0644 "$here/tests/sanity/get_pip.py" "$cache/get_pip_${version//./_}.py"
