# gpufleet.hygiene — the two commands users need:
#   make run    set everything up, then run the main job (preflight over the local
#               simulated fleet, or over RUN_ARGS="-i <inventory>" of a real fleet)
#   make test   set everything up, then run every test
# Everything else here is what those two call.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
COLL_LINK := .ansible/collections/ansible_collections/gpufleet/hygiene
# community.proxmox, pinned (scripts/install-community-proxmox.sh): its `proxmox` inventory runs
# against the Proxmox VE API stand-in in the integration tests.
COMMUNITY_PROXMOX := .ansible/collections/ansible_collections/community/proxmox/MANIFEST.json
# Outside the checkout: under it, ansible-test finds this git repository, sees the copy as
# ignored and skips every target.
SANITY_BUILD ?= $(or $(TMPDIR),/tmp)/gpufleet-hygiene-sanity
SANITY_ROOT := $(SANITY_BUILD)/ansible_collections/gpufleet/hygiene
PYTEST_WORKERS ?= 2

# The Galaxy artifact `ansible-galaxy collection build` makes, as sanity installs it.
ARTIFACT_DIR := $(SANITY_BUILD)/dist
# A copy of the checkout's files, for sanity on what the artifact leaves out.
CHECKOUT_ROOT := $(SANITY_BUILD)/checkout/ansible_collections/gpufleet/hygiene

.PHONY: setup run test unit integration molecule browser monitoring packaging docs sanity lint clean mutation

setup: $(VENV)/.stamp $(COLL_LINK) $(COMMUNITY_PROXMOX)

$(VENV)/.stamp: requirements/dev.txt requirements/docs.txt scripts/setup-host.sh
	bash scripts/setup-host.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/dev.txt -r requirements/docs.txt
	touch $@

$(COLL_LINK):
	mkdir -p $(dir $(COLL_LINK))
	ln -sfn ../../../.. $(COLL_LINK)

$(COMMUNITY_PROXMOX): scripts/install-community-proxmox.sh | $(VENV)/.stamp
	PY=$(PY) bash scripts/install-community-proxmox.sh .ansible/collections

# Without RUN_ARGS: the seed incident on a local simulated fleet (preflight fails on exactly
# the three broken containers, remediate, preflight passes, hygiene writes the report).
# With RUN_ARGS="-i <inventory>": preflight over that fleet.
run: setup
	$(if $(strip $(RUN_ARGS)),$(VENV)/bin/ansible-playbook playbooks/preflight.yml $(RUN_ARGS),bash scripts/main-job.sh)

test: setup
	$(MAKE) unit
	$(MAKE) integration
	$(MAKE) molecule
	$(MAKE) browser
	$(MAKE) monitoring
	$(MAKE) packaging
	$(MAKE) docs
	$(MAKE) sanity
	$(MAKE) lint
	@echo "make test: every suite passed"

# Modules, module_utils and plugins against real venvs, processes and files, in a random
# order (pytest-randomly; pytest.ini keeps it off for the other suites): the header prints
# the seed, and `make unit SEED=<seed>` replays that order.
unit:
	$(VENV)/bin/pytest -p randomly $(if $(SEED),--randomly-seed=$(SEED)) -n $(PYTEST_WORKERS) tests/unit

# Over the simulated fleet (real sshd and LXC containers; needs root). Brings its own
# fleets up and down. Two workers, a test module each at a time (a module's tests share its
# fleet): most of a run is waiting on ssh, containers and jobs, not on the CPU. Each worker has
# a session fleet of its own (tests/integration/conftest.py). INTEGRATION_WORKERS=0: one process.
INTEGRATION_WORKERS ?= 2
integration:
	$(VENV)/bin/pytest -p no:cacheprovider $(if $(filter-out 0,$(INTEGRATION_WORKERS)),-n $(INTEGRATION_WORKERS) --dist loadfile) --durations=15 tests/integration

# Molecule scenarios of the roles, each on its own tiny simulated fleet (needs root).
molecule:
	bash tests/molecule/run.sh

# The HTML fleet report in a real headless browser.
browser:
	$(VENV)/bin/pytest -p no:cacheprovider tests/browser

# The Prometheus alerting rules under promtool (check, test on recorded series), the Grafana
# dashboard's structure, the report's metrics file through promtool's linter.
monitoring:
	$(VENV)/bin/pytest -p no:cacheprovider tests/monitoring

# Scheduling units, the execution-environment build context, what the Galaxy artifact holds.
packaging:
	$(VENV)/bin/pytest -p no:cacheprovider tests/schedule tests/ee tests/packaging

# The documentation: antsibull-docs' linter over every plugin's and role's docs and the extra
# docs, then the site (antsibull-docs and Sphinx, warnings fail it) in build/docs/html, with a
# page for every module, plugin and role.
docs: export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
docs:
	antsibull-docs lint-collection-docs --plugin-docs $(COLL_LINK)
	$(PY) scripts/docsite.py build/docs

# ansible-test runs on the collection as users install it: the artifact built from this
# checkout, installed under ansible_collections/<ns>/<name> in the build folder. Then, with the
# same tests and rules, on what the artifact leaves out (galaxy.yml's build_ignore: benchmarks/,
# scripts/, the Makefile...), in a copy of the checkout's files (those git tracks, and new ones
# it does not ignore) under ansible_collections/<ns>/<name> of its own: together, the whole checkout.
# The venv's bin/ first on PATH: ansible-test's shellcheck test runs the shellcheck installed there.
sanity: export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
sanity:
	rm -rf $(SANITY_BUILD)
	mkdir -p $(ARTIFACT_DIR) $(CHECKOUT_ROOT)
	$(VENV)/bin/ansible-galaxy collection build --output-path $(ARTIFACT_DIR)
	ANSIBLE_COLLECTIONS_PATH=$(SANITY_BUILD) $(VENV)/bin/ansible-galaxy collection install --offline \
	  -p $(SANITY_BUILD) $(ARTIFACT_DIR)/gpufleet-hygiene-*.tar.gz
	bash scripts/ansible-test-bootstrap.sh
	cd $(SANITY_ROOT) && $(CURDIR)/$(VENV)/bin/ansible-test sanity --python 3.11 --color no
	git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C $(CHECKOUT_ROOT)
	cd $(CHECKOUT_ROOT) && $(CURDIR)/$(VENV)/bin/ansible-test sanity --python 3.11 --color no \
	  $$($(CURDIR)/$(PY) $(CURDIR)/scripts/sanity_targets.py galaxy.yml)

# Mutation testing (cosmic-ray) of the safety-critical module_utils against their unit tests, in a
# copy of the checkout; not part of `make test` (hours on two cores). MUTATION="liveness xid"
# narrows it to those modules (the table is in scripts/mutation.sh; results in docs/reliability.md).
mutation: setup
	bash scripts/mutation.sh $(MUTATION)

lint:
	$(VENV)/bin/ruff check plugins tests benchmarks scripts
	$(VENV)/bin/ansible-lint --profile production
	$(VENV)/bin/antsibull-changelog lint
	$(VENV)/bin/python scripts/role_readme.py --check
	$(VENV)/bin/python scripts/readiness_options.py --check
	$(VENV)/bin/python scripts/ssh_options.py --check

clean:
	rm -rf build tests/output
