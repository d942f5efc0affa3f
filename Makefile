# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv on first use; nothing has to be installed by hand.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The stock JavaScript RocketMQ client (ali-ons) the broker layer's process tests drive; npm is on the machines.
ALIONS := tools/alions/node_modules/.installed

.PHONY: demo demo-rocketmq test lint soak clean nemesis nemesis-deps systools

$(STAMP): setup.py dledger/_native.c plugins/rocketmq/setup.py plugins/rocketmq/dledger_rocketmq/common/_speedups.c spark/setup.py plugins/example/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dledger needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=70,<90' wheel
	# editable_mode=compat keeps the repo root on sys.path, so twistd finds twisted/plugins/dledger_plugin.py;
	# building without isolation uses the setuptools pinned above, which still has that mode.
	$(PY) -m pip install --quiet --no-build-isolation -e '.[test,plot]' --config-settings editable_mode=compat
	# The RocketMQ broker layer: its own distribution, a plugin in the 'dledger' entry-point group.
	$(PY) -m pip install --quiet --no-build-isolation -e plugins/rocketmq --config-settings editable_mode=compat
	# Spark ingest: its own distribution (pyspark and pyarrow are its dependencies, not dledger's), a plugin too.
	$(PY) -m pip install --quiet --no-build-isolation -e spark --config-settings editable_mode=compat
	# The example plugin (docs/plugins.md): a pyproject-only distribution, the template plugin authors copy;
	# inert unless example.enabled, its application tests run in `make test` (pytest.ini testpaths).
	$(PY) -m pip install --quiet --no-build-isolation -e plugins/example --config-settings editable_mode=compat
	touch $(STAMP)

$(ALIONS): tools/alions/package.json tools/alions/package-lock.json
	cd tools/alions && npm ci --no-audit --no-fund --loglevel=error
	touch $(ALIONS)

demo: $(STAMP)
	$(VENV)/bin/dledger demo

# A name server and two 3-member RocketMQ broker groups as twistd processes on 127.0.0.1: sends, pulls, a master
# killed, the switch shown; every process stopped at the end (dledger_rocketmq/tools/demo.py, docs/rocketmq.md).
demo-rocketmq: $(STAMP)
	$(PY) -m dledger_rocketmq.tools.demo

# Debian's chromium (the status page's headless-browser test) and prometheus (promtool checks the alert rules),
# installed where missing and apt-get can (root, a Debian system); where not, those tests skip with the reason.
systools:
	@command -v chromium >/dev/null && command -v promtool >/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q --no-install-recommends chromium prometheus >/dev/null 2>&1 || \
	     { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium prometheus \
	       >/dev/null 2>&1; }) || echo "systools: apt-get could not install chromium/prometheus; their tests skip"; \
	  else echo "systools: no apt-get as root; the chromium and promtool tests skip"; fi; }

test: $(STAMP) $(ALIONS) nemesis-deps systools
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

soak: $(STAMP)
	$(PY) -m pytest -m slow
	$(PY) -m tools.simulate election --seeds 100000
	$(PY) -m tools.simulate replication --seeds 10000
	$(PY) -m tools.simulate replication --membership --duration 3 --seeds 10000

# The nemesis (docs/testing.md "Nemesis") runs members in network namespaces and skews their clocks with Debian's
# libfaketime. Installed here when we are root with apt-get; otherwise the clock faults skip, saying why.
nemesis-deps:
	@if [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || command -v faketime >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q faketime >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
		apt-get install -y -q faketime >/dev/null 2>&1) || echo "nemesis: could not install faketime: clock faults will skip"; \
	else echo "nemesis: faketime is not installed and we are not root: clock faults will skip"; fi

# The long nemesis run: SECONDS of seeded faults per workload (log and broker), a summary table per fault type;
# histories and member logs of failing runs under NEMESIS_OUT. Needs root (network namespaces).
SECONDS ?= 1800
SEED ?= 1
WORKLOADS ?= log broker
NEMESIS_OUT ?= nemesis-runs
nemesis: $(STAMP) nemesis-deps
	$(PY) -m dledger.testing.nemesis long --seconds $(SECONDS) --seed $(SEED) --workloads "$(WORKLOADS)" \
		--out $(NEMESIS_OUT)

clean:
	rm -rf $(VENV) tools/alions/node_modules build *.egg-info plugins/rocketmq/build plugins/rocketmq/*.egg-info \
		spark/build spark/*.egg-info plugins/example/build plugins/example/*.egg-info .pytest_cache .ruff_cache \
		.hypothesis
