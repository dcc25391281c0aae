# make test: bootstrap every venv this project needs (with uv), then ruff, mypy, the docs build and every test tier,
#            two at a time; it ends with a table of each tier's time.
# make check: the inner loop: ruff, mypy and the unit tier, side by side.
# make demo: write the gridsim bundle as a Gym server, serve it, play its rows like verifiers, print rewards, stop
#            (in .venv-demo: Python 3.12, gymhost and nemo-gym 0.4.0 only, built on first use).
# make docs: the documentation site (MkDocs), built strict into site/.
# make bench: the benchmarks (benchmarks/README.md).
# make image: gymhost's OCI image (deploy/container/Containerfile) with podman, tagged gymhost:<version> and :latest.
#
# Three gymhost venvs, because the tiers cannot share one:
#   .venv        Python 3.12, gymhost without nemo-gym or omegaconf (with the dev and docs tools): proves the base
#                install works alone, and builds the docs.
#   .venv-gym04  Python 3.12, nemo-gym 0.4.0 (the version verifiers pins).
#   .venv-gym07  Python 3.13, nemo-gym 0.7.0. nemo-gym >= 0.5 declares Requires-Python >= 3.13.14 and these
#                machines have 3.13.0, so uv resolves it as for 3.13.14 (--python-version; it runs fine).
# three that are not gymhost's: .venv-openenv (Python 3.12, openenv 0.10.0) runs the OpenEnv example server the
# nemo_gym tiers write from (its dependencies conflict with nemo-gym 0.4.0's), .venv-agentenv (Python 3.12,
# agentenv-framework[openenv]) runs agent-env's own OpenEnv app for the agent-env example bundle (the same conflict),
# and .venv-verifiers (Python 3.12, verifiers, which pins mcp 2) runs the real trainer client against a gymhost server;
# and two tools' venvs: .venv-manifests (the schema checkers, with node) and .venv-wheel (gymhost's wheel installed
# as a user installs it, test-wheel).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

# The first interpreter of the wanted version that actually runs (pyenv shims exist for versions that are not
# selected, and fail when called).
find_python = $(firstword $(foreach c,$(1) $(wildcard $(HOME)/.pyenv/versions/$(2).*/bin/$(1)) /usr/local/bin/$(1) /usr/bin/$(1),$(shell $(c) -c 'import sys; print(sys.executable)' 2>/dev/null)))
PY312 ?= $(call find_python,python3.12,3.12)
PY313 ?= $(call find_python,python3.13,3.13)

GYM04 := 0.4.0
GYM07 := 0.7.0
# NEED CMD=PACKAGE...: the Debian package of each command this machine lacks, installed (one apt run at a time).
NEED := bash tests/tiers/need.sh

# The machine's pip config lists file:// indexes that do not exist; their warnings are noise.
PIP_QUIET := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }

# uv builds every venv: it resolves and downloads in parallel and links packages from its cache (~/.cache/uv, keyed by
# what is installed), so a fresh machine builds them all in about a minute, and a rebuild takes seconds. It is
# installed once, by pip, into a venv of its own.
#
# Python writes its bytecode caches, as it does by default. These machines set PYTHONDONTWRITEBYTECODE, and uv (unlike
# pip) compiles nothing at install: every process the suite starts would compile every module it imports again, a
# gymhost app's build 50% more CPU (2.7 s against 1.8 s: benchmarks/README.md, "Start-up imports").
unexport PYTHONDONTWRITEBYTECODE

UV_VERSION := 0.13.9
UV := .venv-uv/bin/uv
$(UV): | check-py312
	rm -rf .venv-uv && $(PY312) -m venv .venv-uv
	.venv-uv/bin/pip install -q uv==$(UV_VERSION) $(PIP_QUIET)
# new_venv DIR PYTHON: an empty venv at DIR (any earlier one removed).
new_venv = rm -rf $(1) && $(UV) venv --quiet --python $(2) $(1)
# uv_install DIR ARGS: uv pip install ARGS into the venv at DIR.
uv_install = $(UV) pip install --quiet --python $(1)/bin/python

.PHONY: test test-tiers check venvs system-packages test-lowest test-replay-gym04 test-replay-gym07 test-replay-image test-verifiers-gym04 test-verifiers-gym07 lint typecheck docs image image-base test-wheel test-container test-manifests test-unit test-gym04 test-gym07 test-replay test-soak test-cluster test-verifiers demo schema bench bench-quick bench-load bench-workers bench-written bench-cold-start bench-image bench-hypercorn bench-request-path bench-startup bench-request-profile bench-layers bench-process-mode bench-confinement bench-namespaces bench-confined-server clean check-pythons check-py312 check-py313

check-py312:
	@test -n "$(PY312)" || { echo "make: python3.12 not found (set PY312=/path/to/python3.12)"; exit 1; }
check-py313:
	@test -n "$(PY313)" || { echo "make: python3.13 not found (set PY313=/path/to/python3.13)"; exit 1; }
check-pythons: check-py312 check-py313

.venv/.installed: pyproject.toml | $(UV) check-py312
	$(call new_venv,.venv,$(PY312))
	$(call uv_install,.venv) -e '.[dev,docs]'
	touch $@

.venv-gym04/.installed: pyproject.toml | $(UV) check-py312
	$(call new_venv,.venv-gym04,$(PY312))
	$(call uv_install,.venv-gym04) -e '.[dev,nemo-gym]' nemo-gym==$(GYM04)
	touch $@

# --python-version: nemo-gym 0.7.0 asks for Python >= 3.13.14 (pip's --ignore-requires-python, for uv's resolver).
.venv-gym07/.installed: pyproject.toml | $(UV) check-py313
	$(call new_venv,.venv-gym07,$(PY313))
	$(call uv_install,.venv-gym07) --python-version 3.13.14 -e '.[dev,nemo-gym]' nemo-gym==$(GYM07)
	touch $@

# nemo-gym as the image installs it: without its dependencies, and beside it only the requirements serving imports
# (deploy/container/serving_requirements.py). The replay tier run here (test-replay-image) shows that what the image
# leaves out changes no folder's play: each plays its recorded rewards, or fails to build naming what it lacks.
.venv-image/.installed: pyproject.toml deploy/container/serving_requirements.py | $(UV) check-py313
	$(call new_venv,.venv-image,$(PY313))
	$(call uv_install,.venv-image) --python-version 3.13.14 --no-deps nemo-gym==$(GYM07)
	.venv-image/bin/python deploy/container/serving_requirements.py --installed > .venv-image/serving.txt
	$(call uv_install,.venv-image) --python-version 3.13.14 -e . -r .venv-image/serving.txt pytest pytest-xdist
	touch $@

lint: .venv/.installed
	$(TIMED) lint -- bash -c '.venv/bin/ruff check . && .venv/bin/ruff format --check .'

# The documentation site (MkDocs, Material theme), built offline; --strict fails on a broken link or a page left out.
docs: .venv/.installed
	NO_MKDOCS_2_WARNING=1 $(TIMED) docs -- .venv/bin/mkdocs build --strict --quiet --site-dir site

# mypy runs where nemo-gym is installed, so the modules that use it are checked against it.
typecheck: .venv-gym04/.installed
	$(TIMED) typecheck -- .venv-gym04/bin/mypy

.venv-openenv/.installed: examples/openenv_sums/requirements.txt | $(UV) check-py312
	$(call new_venv,.venv-openenv,$(PY312))
	$(call uv_install,.venv-openenv) -r examples/openenv_sums/requirements.txt
	touch $@

OPENENV := GYMHOST_OPENENV_PYTHON=$(CURDIR)/.venv-openenv/bin/python

.venv-agentenv/.installed: examples/agent_env_quiz/requirements.txt | $(UV) check-py312
	$(call new_venv,.venv-agentenv,$(PY312))
	$(call uv_install,.venv-agentenv) -r examples/agent_env_quiz/requirements.txt
	touch $@

AGENTENV := GYMHOST_AGENT_ENV_PYTHON=$(CURDIR)/.venv-agentenv/bin/python

.venv-verifiers/.installed: tests/verifiers-requirements.txt | $(UV) check-py312
	$(call new_venv,.venv-verifiers,$(PY312))
	$(call uv_install,.venv-verifiers) -r tests/verifiers-requirements.txt
	touch $@

# Every venv the tiers use, built four at a time (installing is mostly waiting on the package index).
VENVS := .venv/.installed .venv-gym04/.installed .venv-gym07/.installed .venv-openenv/.installed \
	.venv-agentenv/.installed .venv-verifiers/.installed .venv-manifests/.installed .venv-lowest/.installed \
	.venv-lowest-gym/.installed .venv-image/.installed
venvs:
	$(MAKE) -j4 --output-sync=target $(VENVS)

# The process-heavy tiers run on two pytest workers (pytest-xdist), a test file each at a time, so a module's
# fixtures are built once: most of a test is waiting on server processes, which the other worker's test fills. (The
# verifiers tier is one file whose module fixtures each serve one test: its tests are spread one by one.)
PARALLEL := -n 2 --dist loadfile
# The nemo_gym tier: every nemo_gym test the other tiers do not take.
GYM_TIER := nemo_gym and not soak and not cluster and not verifiers and not replay and not container
# TIMED NAME -- COMMAND: COMMAND run, its wall and CPU time kept for the table make test ends with.
TIMED := $(PY312) tests/tiers/timed.py

# The inner loop: lint, typecheck and the unit tier side by side, once the venvs exist (README: under three minutes).
check:
	$(MAKE) -j3 --output-sync=target lint typecheck test-unit

test-unit: .venv/.installed
	$(TIMED) unit -- .venv/bin/pytest $(PARALLEL) -m "unit and not manifests"

# deploy/'s manifests checked offline against the Kubernetes API schemas (kubernetes-validate), the Gateway API's
# HTTPRoute (@kubernetes-models/gateway-api, npm) and Envoy's config (envoy-data-plane): tools in a venv of their own.
.venv-manifests/.installed: $(wildcard tests/manifests/*) | $(UV) check-py312
	bash tests/manifests/setup.sh .venv-manifests $(PY312) $(UV)

test-manifests: .venv-manifests/.installed
	@$(NEED) promtool=prometheus
	$(TIMED) manifests -- .venv-manifests/bin/pytest tests/test_manifests.py -m manifests

test-gym04: .venv-gym04/.installed .venv-openenv/.installed .venv-agentenv/.installed
	@$(NEED) ss=iproute2
	$(OPENENV) $(AGENTENV) $(TIMED) gym04 -- .venv-gym04/bin/pytest $(PARALLEL) -m "$(GYM_TIER)"

test-gym07: .venv-gym07/.installed .venv-openenv/.installed .venv-agentenv/.installed
	@$(NEED) ss=iproute2
	$(OPENENV) $(AGENTENV) $(TIMED) gym07 -- .venv-gym07/bin/pytest $(PARALLEL) -m "$(GYM_TIER)"

# The verifiers tier: the real trainer client (vf-eval, NeMo Gym taskset) against gymhost, on each nemo-gym version:
# which one the server runs says nothing about what the client reads.
VERIFIERS := $(OPENENV) $(AGENTENV) GYMHOST_VERIFIERS_BIN=$(CURDIR)/.venv-verifiers/bin
test-verifiers: test-verifiers-gym04 test-verifiers-gym07
test-verifiers-gym04: .venv-gym04/.installed .venv-openenv/.installed .venv-agentenv/.installed .venv-verifiers/.installed
	$(VERIFIERS) $(TIMED) verifiers-gym04 -- .venv-gym04/bin/pytest -n 2 -m verifiers
test-verifiers-gym07: .venv-gym07/.installed .venv-openenv/.installed .venv-agentenv/.installed .venv-verifiers/.installed
	$(VERIFIERS) $(TIMED) verifiers-gym07 -- .venv-gym07/bin/pytest -n 2 -m verifiers

# The replay tier: Gym's own recorded rollouts of every published folder that plays offline, replayed through
# gymhost and held to the recorded rewards, on each nemo-gym version; folders whose requirements these venvs lack are
# served from venvs of their own, built with uv. Two at a time, test by test: most of a folder's time is its venv's
# build and its server's start, which overlap well.
test-replay: test-replay-gym04 test-replay-gym07 test-replay-image
test-replay-gym04: .venv-gym04/.installed
	$(TIMED) replay-gym04 -- .venv-gym04/bin/pytest -n 2 --dist load -m replay
test-replay-gym07: .venv-gym07/.installed
	$(TIMED) replay-gym07 -- .venv-gym07/bin/pytest -n 2 --dist load -m replay
test-replay-image: .venv-image/.installed
	$(TIMED) replay-image -- env GYMHOST_REPLAY_SET=image .venv-image/bin/pytest -n 2 --dist load -m replay \
		-k test_a_folder_as_installed tests/test_replay.py

# The soak tier: many episodes with injected faults, bounded in time and count; once, on the current nemo-gym.
test-soak: .venv-gym07/.installed
	$(TIMED) soak -- .venv-gym07/bin/pytest -m soak

# The cluster tier: three replicas in network namespaces (root, iproute2) behind HAProxy (Debian package,
# installed here when missing), on the current nemo-gym.
test-cluster: .venv-gym07/.installed
	@$(NEED) haproxy=haproxy ip=iproute2
	$(TIMED) cluster -- .venv-gym07/bin/pytest -m cluster

# The lowest end of the bounds: every dependency pyproject.toml names at the lowest version its bound allows (uv's
# lowest-direct, on Python 3.12; the dev tools too; what they pull in at its newest). The unit tier runs in a venv
# without nemo-gym, as that tier needs; BOUNDS_TESTS, real uvicorn and hypercorn processes (serving, uvicorn's own
# workers refused, --workers 2 drained, a graceful stop, an OpenEnv /ws episode), in one with nemo-gym 0.4.0. A bound
# that cannot hold at its lower end is raised to the version that passes.
BOUNDS_TESTS := \
	'tests/test_processes.py::test_gymhost_serve_plays_rows' \
	'tests/test_processes.py::test_another_servers_workers_refuse_to_start_naming_gymhost_serve_workers[uvicorn]' \
	'tests/test_workers.py::test_sigterm_drains_every_worker[8]' \
	'tests/test_shutdown.py::test_a_call_in_flight_finishes_and_then_the_instances_stop' \
	'tests/test_openenv.py::test_every_row_scores_what_the_environment_says'

.venv-lowest/.installed: pyproject.toml | $(UV) check-py312
	$(call new_venv,.venv-lowest,$(PY312))
	$(call uv_install,.venv-lowest) --resolution lowest-direct -e '.[dev]'
	touch $@

.venv-lowest-gym/.installed: pyproject.toml | $(UV) check-py312
	$(call new_venv,.venv-lowest-gym,$(PY312))
	$(call uv_install,.venv-lowest-gym) --resolution lowest-direct -e '.[dev,nemo-gym]'
	touch $@

test-lowest: .venv-lowest/.installed .venv-lowest-gym/.installed .venv-openenv/.installed
	@$(NEED) ss=iproute2
	$(TIMED) lowest-unit -- .venv-lowest/bin/pytest $(PARALLEL) -m "unit and not manifests"
	$(OPENENV) $(TIMED) lowest-processes -- .venv-lowest-gym/bin/pytest -n 2 --dist load -m nemo_gym $(BOUNDS_TESTS)

# The wheel, as a user installs it: built (sdist and wheel), checked by twine, installed in a fresh venv (not
# editable, not from the checkout) where the unit tier runs against it. On Python 3.13, with every dependency at the
# newest version its bound allows (uv's default): the unit tier's half of the highest end of the bounds; the
# nemo_gym tier in .venv-gym07, built as fresh, is the other half (real uvicorn and hypercorn processes). The image installs the same build and the
# container tier serves and plays through it.
test-wheel: .venv/.installed | $(UV) check-py313
	rm -rf dist .venv-wheel
	.venv/bin/python -m build --quiet --outdir dist . $(PIP_QUIET)
	.venv/bin/twine check --strict dist/*
	$(call new_venv,.venv-wheel,$(PY313))
	$(call uv_install,.venv-wheel) "$$(ls dist/gymhost-*.whl)[dev]"
	.venv-wheel/bin/python -c 'import gymhost, sys; sys.exit(0 if "/site-packages/" in gymhost.__file__ else f"gymhost imported from {gymhost.__file__}")'
	$(TIMED) wheel -- .venv-wheel/bin/pytest -m "unit and not manifests" -p no:cacheprovider -q

# The image (make image). podman runs its containers with runc: Debian's crun 1.8 refuses some kernels' cgroup
# layouts. A container may not raise its limits above the caller's hard ones, so they are passed as they are here.
# BASE is the image to build on: by default a Debian trixie root file system built from Debian's packages
# (mmdebstrap, about a minute, once), for machines that cannot pull from a registry; on one that can,
# make image BASE=docker.io/library/python:3.13-slim. The build reaches the package index as this machine does (its
# CA bundle is lent to the build).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' src/gymhost/_version.py)
IMAGE := gymhost:$(VERSION)
TRIXIE := localhost/gymhost-base:trixie-slim
# What the base leaves out, as Debian's own slim images do: manual pages, translations and documentation (49 MB of
# a minbase with Python), the copyright files kept. The rules stay in the image's dpkg configuration, so what an
# image built on it installs with apt leaves them out too.
SLIM_DPKG := $(foreach rule,path-exclude=/usr/share/man/* path-exclude=/usr/share/info/* \
	path-exclude=/usr/share/locale/* path-include=/usr/share/locale/locale.alias \
	path-exclude=/usr/share/doc/* path-include=/usr/share/doc/*/copyright,--dpkgopt='$(rule)')
BASE ?= $(TRIXIE)
PODMAN := podman --runtime runc
CONTAINER_LIMITS = --ulimit nofile=$$(ulimit -Hn):$$(ulimit -Hn) --ulimit nproc=4096:4096
CONTAINER_TOOLS := podman=podman runc=runc mmdebstrap=mmdebstrap newuidmap=uidmap

image-base:
	@$(NEED) $(CONTAINER_TOOLS)
	@if [ "$(BASE)" = "$(TRIXIE)" ] && ! $(PODMAN) image exists $(TRIXIE); then \
		echo "make image: building the base image $(TRIXIE) from Debian's packages (mmdebstrap)"; \
		mmdebstrap --quiet --variant=minbase $(SLIM_DPKG) --include=python3,python3-venv,ca-certificates trixie - \
			http://deb.debian.org/debian | $(PODMAN) import --quiet - $(TRIXIE) >/dev/null; fi

image: image-base
	$(TIMED) image -- $(PODMAN) build --quiet --network host $(CONTAINER_LIMITS) \
		$$([ -f /etc/ssl/certs/ca-certificates.crt ] && echo -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro) \
		--build-arg BASE=$(BASE) --build-arg VERSION=$(VERSION) \
		--build-arg SOURCE="$$(git remote get-url origin 2>/dev/null || true)" \
		--build-arg REVISION="$$(git rev-parse HEAD 2>/dev/null || true)" \
		-f deploy/container/Containerfile -t $(IMAGE) -t gymhost:latest . >/dev/null
	@echo "make image: built $(IMAGE) (also gymhost:latest), $$($(PODMAN) image inspect $(IMAGE) --format '{{.Size}}') bytes"

# The container tier: the image run as deploy/kubernetes runs it (non-root, read-only root file system, its limits),
# played through by the real vf-eval (the manifests tier checks the manifests themselves).
# The image is built in this tier's own recipe, not as a prerequisite: GNU make -j passes over a goal whose
# prerequisite is still to run and starts every later goal first, which left this tier, meant to run beside gym07,
# for the very end of make test (its base comes with make test's venvs: it is mostly downloads).
test-container: .venv-gym07/.installed .venv-verifiers/.installed
	@$(MAKE) --no-print-directory image
	GYMHOST_IMAGE=$(IMAGE) GYMHOST_VERIFIERS_BIN=$(CURDIR)/.venv-verifiers/bin $(TIMED) container -- \
		.venv-gym07/bin/pytest -m container

# make test, in two steps. First the venvs, the Debian packages the tiers use and the image's base, side by side (mostly
# waiting on the package index; tests/tiers/need.sh takes apt's turns one at a time). Then the tiers, TEST_JOBS at a
# time, longest first, so a tier that waits (on processes starting, on a drain, on venvs being built, the image on its
# downloads) lends its cores to another. The whole run writes its temporary files in one folder (TMPDIR), which it
# removes at the end, after killing and naming any process it started that is still running (tests/tiers/leftovers.py);
# it ends with each tier's wall and CPU time (tests/tiers/timed.py).
TEST_JOBS ?= 2
SYSTEM_PACKAGES := ss=iproute2 ip=iproute2 haproxy=haproxy node=nodejs npm=npm $(CONTAINER_TOOLS)
system-packages:
	@$(NEED) $(SYSTEM_PACKAGES)

test: | check-pythons
	@rm -rf .test-times; run_tmp=$$(mktemp -d /tmp/gymhost-test.XXXXXX); export TMPDIR=$$run_tmp; \
	started=$$(date +%s); status=0; \
	$(MAKE) -j6 --output-sync=target system-packages image-base $(VENVS) || status=$$?; \
	[ $$status -ne 0 ] || $(TIMED) all-tiers -- $(MAKE) -j$(TEST_JOBS) --output-sync=target test-tiers || status=$$?; \
	$(PY312) tests/tiers/leftovers.py "$$run_tmp"; \
	echo "make test: $$(( ($$(date +%s) - started) / 60 )) min $$(( ($$(date +%s) - started) % 60 )) s in all"; \
	$(TIMED) --table; exit $$status

# make starts them in this order as slots free: the two nemo_gym tiers, which keep both cores busy, far apart, each
# beside tiers that mostly wait (the image's downloads, the soak's idle timeouts, the replay's venv builds).
# Three at a time, the two nemo_gym tiers together, was no faster: 30:50 against 30:44, with 2 CPU-minutes more
# spent on contention, nor were other layouts (docs/architecture.md). make test's closing table says when each tier
# began and how long it took.
test-tiers: test-gym07 test-container test-soak test-replay-gym07 test-verifiers-gym07 test-gym04 test-replay-gym04 \
	test-verifiers-gym04 test-replay-image test-cluster test-lowest test-unit test-wheel typecheck test-manifests lint docs

# The task format's JSON Schema is generated from its models; a unit test keeps the committed file current.
schema: .venv/.installed
	.venv/bin/python -c 'import json, gymhost.environments as a; print(json.dumps(a.task_schema(), indent=2))' \
		> src/gymhost/environments/task.schema.json

# The demo needs gymhost and nemo-gym only: a venv of its own, on Python 3.12, without the development tools.
.venv-demo/.installed: pyproject.toml | $(UV) check-py312
	@echo "make demo: building .venv-demo (gymhost and nemo-gym $(GYM04), Python 3.12: under a minute, once)"
	$(call new_venv,.venv-demo,$(PY312))
	$(call uv_install,.venv-demo) -e '.[nemo-gym]' nemo-gym==$(GYM04)
	touch $@

demo: .venv-demo/.installed
	.venv-demo/bin/python examples/demo.py

# Benchmarks use nemo-gym 0.7.0 (the current release) and wrk (Debian package) as the load generator; py-spy
# samples the request profile's servers (benchmarks/request_profile.py), installed in the venv for the benchmarks only.
.venv-gym07/bin/py-spy: .venv-gym07/.installed
	$(call uv_install,.venv-gym07) py-spy==0.4.3
	touch $@

bench: .venv-gym07/.installed .venv-gym07/bin/py-spy .venv-openenv/.installed
	@$(NEED) wrk=wrk haproxy=haproxy
	cd benchmarks && ../.venv-gym07/bin/python run.py

bench-quick: .venv-gym07/.installed .venv-gym07/bin/py-spy .venv-openenv/.installed
	@$(NEED) wrk=wrk haproxy=haproxy
	cd benchmarks && ../.venv-gym07/bin/python run.py --quick

# The load section alone (Gym's stated concurrency: bursts of 4,096 to 65,536 connections), into its own results.
bench-load: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python run.py --only load

# Workers alone (--workers 1 against 2, connections handed off or forwarded), into its own results.
bench-workers: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python run.py --only workers

# A written server's tool call beside its bare endpoint (benchmarks/written_calls.py); BASELINE=<revision> adds it.
bench-written: .venv-gym07/.installed
	@$(NEED) wrk=wrk
	cd benchmarks && ../.venv-gym07/bin/python written_calls.py $(if $(BASELINE),--baseline $(BASELINE))

# A cold batch with instances constructed once in the template, beside each constructing its own; BASELINE=<revision>
# adds that revision's default pool.
bench-cold-start: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python run.py --only cold_start $(if $(BASELINE),--baseline $(BASELINE))

# hypercorn on each loop at 256 connections, p99 and max side by side (benchmarks/hypercorn_loops.py).
bench-hypercorn: .venv-gym07/.installed
	@$(NEED) wrk=wrk
	cd benchmarks && ../.venv-gym07/bin/python hypercorn_loops.py

# The image's size and its time to ready (benchmarks/image.py), into results/<date>-image.json.
bench-image: image .venv-gym07/.installed
	cd benchmarks && GYMHOST_IMAGE=$(IMAGE) GYMHOST_BASELINE_IMAGE=$(BASELINE_IMAGE) ../.venv-gym07/bin/python image.py

# Process mode beside in-process mode (benchmarks/process_mode.py); BASELINE=<revision> adds that revision's two.
bench-process-mode: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python process_mode.py $(if $(BASELINE),--baseline $(BASELINE))

bench-confinement: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python confinement.py

# What each namespace of a confined instance costs the machine, fork to exit (benchmarks/namespaces.py; root).
bench-namespaces: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python namespaces.py

bench-confined-server: .venv-gym07/.installed
	@$(NEED) wrk=wrk
	cd benchmarks && ../.venv-gym07/bin/python confined_server.py

# A Gym server's tool call under wrk, by piece, with py-spy sampling the servers from outside
# (benchmarks/request_profile.py; layers.py, below, asks the same in one process).
bench-request-profile: .venv-gym07/.installed .venv-gym07/bin/py-spy
	@$(NEED) wrk=wrk
	cd benchmarks && ../.venv-gym07/bin/python request_profile.py

# Where a Gym server's tool call spends gymhost's microseconds, layer by layer, in-process (benchmarks/layers.py).
bench-layers: .venv-gym07/.installed
	cd benchmarks && ../.venv-gym07/bin/python layers.py

# The request path before and after a change, side by side (benchmarks/request_path.py): BASELINE=<git revision>.
bench-request-path: .venv-gym07/.installed
	@$(NEED) wrk=wrk
	cd benchmarks && ../.venv-gym07/bin/python request_path.py --baseline $(BASELINE)

# A server's start before and after a change, on each nemo-gym version (benchmarks/startup.py): BASELINE=<revision>.
bench-startup: .venv-gym04/.installed .venv-gym07/.installed
	cd benchmarks && ../.venv-gym04/bin/python startup.py --baseline $(BASELINE)
	cd benchmarks && ../.venv-gym07/bin/python startup.py --baseline $(BASELINE)

clean:
	rm -rf .test-times .venv .venv-uv .venv-gym04 .venv-gym07 .venv-openenv .venv-agentenv .venv-verifiers .venv-demo .venv-wheel .venv-manifests .venv-lowest .venv-lowest-gym dist site .pytest_cache .mypy_cache .ruff_cache
