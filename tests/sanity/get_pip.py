# Stand-in for ansible-test's pip bootstrap script (get-pip.py).
#
# ansible-test creates an empty venv per sanity test and downloads get-pip.py from a host
# outside PyPI to put pip into it. Where only the package registries are reachable, this
# file does the same job with pip's own wheel from PyPI: `make sanity` downloads that wheel
# next to this file under ~/.ansible/test/cache/ and installs this script under the name
# ansible-test looks for. Like get-pip.py it runs `pip install <its arguments>` from the
# wheel, so the venv gets exactly the pip version ansible-test pins.
import glob
import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
wheels = sorted(glob.glob(os.path.join(here, "pip-*-py3-none-any.whl")))
if not wheels:
    sys.exit("no pip wheel beside %s: run `make sanity` (it downloads one)" % __file__)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.path.insert(0, wheels[-1])
sys.argv = ["pip", "install"] + args
runpy.run_module("pip", run_name="__main__", alter_sys=True)
