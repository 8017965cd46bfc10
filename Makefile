# Confide: the only entry points. `make demo` and `make test` set up everything
# they need on a fresh machine (venv, Python packages, GMP, Rust build).
SHELL := /bin/bash
.DEFAULT_GOAL := help
export PATH := $(HOME)/.cargo/bin:$(PATH)

VENV      := .venv
PYTHON    := $(VENV)/bin/python
STAMP     := $(VENV)/.confide-deps
GMP       := build/gmp/.confide-gmp-6.3.0
NATIVE    := python/confide/_native.abi3.so
PROTO     := python/confide/v1/runtime_pb2.py
CONSOLE   := python/confide/web/static/vendor/.built
RUST_SRC  := $(shell find crates -name '*.rs' -o -name Cargo.toml 2>/dev/null) Cargo.toml .cargo/config.toml

.PHONY: help setup bytecode demo test test-fast test-imports test-rust test-fuzz-rust test-python bench lint fmt clean fuzz wheel image bundle

help:
	@echo "make demo   three hospitals train Homo LR in paillier mode, then a CNN in lattice mode (separate processes, gRPC + mTLS)"
	@echo "make test   run the whole test suite (Rust + Python)"
	@echo "make test-fast  the unit tier without slow tests, on both cores (the edit loop)"
	@echo "make bench  run benchmarks (writes benchmarks/results/*.json)"
	@echo "make lint   clippy, rustfmt --check, ruff, the import contract"
	@echo "make fuzz   fuzz every decoder of network and disk bytes, FUZZ_SECONDS (600) per target"
	@echo "make wheel  a manylinux wheel for other x86-64 machines (portable GMP) in dist/"
	@echo "make image  the container image, built offline from Debian packages and the wheel (root, podman)"
	@echo "make bundle the offline install bundle: wheels, image, chart, checksums (dist/confide-bundle-*.tar)"

setup: $(NATIVE) $(PROTO) $(CONSOLE) bytecode

# Our own modules' .pyc (python/, and tests/ whose fixtures the party processes import), for the
# reason given at $(STAMP) below: compiled once here rather than in every process. Files already
# compiled are skipped.
bytecode: $(NATIVE) $(PROTO)
	@$(PYTHON) -m compileall -q -j 0 python tests benchmarks examples >/dev/null

# The web console's front-end libraries, installed from the npm registry (web/package-lock.json).
$(CONSOLE): web/package.json web/package-lock.json web/src/editor.js scripts/build-console.sh
	./scripts/build-console.sh

# Python modules for the wire contract, generated from proto/ (never edited by hand).
$(PROTO): proto/confide/v1/runtime.proto $(STAMP)
	$(PYTHON) -m grpc_tools.protoc -Iproto --python_out=python --grpc_python_out=python --pyi_out=python $<

# System packages: python venv support and m4 (GMP's build). Installed only when missing.
.system-deps:
	@command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }
	@if ! python3 -c 'import venv, ensurepip' 2>/dev/null || ! command -v m4 >/dev/null; then \
		echo "installing system packages (python3-venv, m4)"; \
		apt-get update -qq && apt-get install -y -qq python3-venv m4 >/dev/null; fi
	@touch $@

# uv (from the Python registry) installs the pins: the versions pip picked (compared with pip freeze),
# downloaded and unpacked in parallel: both files took pip 203 s in a fresh clone on two cores, uv 39 s.
UV := VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/uv
# `--compile-bytecode` writes every package's .pyc at install, as pip does and uv by default does not.
# Python writes them itself on first import, except where PYTHONDONTWRITEBYTECODE is set, as on
# this project's hosts and CI: there, without them, every process compiled each module it imports
# from source again (a Keras-on-PyTorch party: 11.2 s of CPU to import, 4.3 s with them).
$(STAMP): requirements-dev.txt requirements-frameworks.txt pyproject.toml .system-deps
	@test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q uv==0.13.9
	$(UV) pip install -q --compile-bytecode -r requirements-dev.txt
	$(UV) pip install -q --compile-bytecode -r requirements-frameworks.txt
	@touch $@

$(GMP): scripts/build-gmp.sh .system-deps
	./scripts/build-gmp.sh && touch $@

$(NATIVE): $(STAMP) $(GMP) $(RUST_SRC) pyproject.toml
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q
	@touch $@

demo: setup
	$(VENV)/bin/confide run examples/breast_cancer.yaml --workdir reports/demo
	@echo
	@echo "== the same kind of job through the controller: grants, session, tuning, resume =="
	$(PYTHON) examples/controller_demo.py --workdir reports/demo-controller
	@echo
	@echo "== vertical FL: the hospital holds the labels, the lab other columns; PSI, then SecureBoost =="
	$(VENV)/bin/confide run examples/breast_cancer_secureboost.yaml --workdir reports/demo-vertical
	@echo
	@echo "== vertical FL through the controller: two sites' own CSVs, grants, Hetero NN, checkpoints =="
	$(PYTHON) examples/controller_demo.py --vertical --workdir reports/demo-vertical-controller
	@echo
	@echo "== a neural network: a Keras 3 CNN on digits, three hospitals, lattice mode (one on PyTorch, two on JAX) =="
	$(VENV)/bin/confide run examples/digits_cnn.yaml --workdir reports/demo-digits-cnn
	@echo
	@echo "== a model a hospital can use: three hospitals' own CSV exports, then raw records scored by predict and by the ONNX export =="
	$(VENV)/bin/confide run examples/hospital_csv/job.yaml --workdir reports/demo-hospitals \
		$(foreach h,a b c,--catalog hospital-$(h)=examples/hospital_csv/hospital-$(h)/catalog.yaml)
	$(PYTHON) examples/score_raw_records.py reports/demo-hospitals/parties/hospital-b.model.zip \
		examples/hospital_csv/hospital-b/patients.csv
	@echo
	@echo "== the controller demo's jobs in the web console (curves, protection, log, audit): run"
	@echo "   $(VENV)/bin/confide console open --workdir reports/demo-controller"
	@echo "   it prints the URL and a sign-in; Ctrl-C stops it =="

test: test-imports test-rust test-fuzz-rust test-python

# The import contract: one direction between packages (pyproject.toml [tool.importlinter]).
test-imports: setup
	$(VENV)/bin/lint-imports

# The Rust tests run twice: on the AVX-512 IFMA engines (where the CPU has them) and forced onto
# GMP and dalek, so both stay correct whatever CI's CPU is. The second pass is the same command,
# so it reuses the first one's build: `-p confide-paillier` alone, or `--lib --tests`, selects
# other build units and compiled pyo3 or proptest again (about a minute on two cores).
test-rust: $(GMP)
	cargo test --workspace --release
	CONFIDE_DISABLE_IFMA=1 cargo test --workspace --release

# A short run of the Rust fuzz targets (fuzz/rust: libFuzzer on the stable toolchain); the
# Python targets' short run is tests/unit/test_fuzz_smoke.py. The long run is `make fuzz`.
test-fuzz-rust: $(GMP)
	rm -rf build/fuzz/short-corpus
	python3 fuzz/run.py --rust --runs 20000 --jobs 2 --seed 1 --found build/fuzz/short-corpus

# The wheel another x86-64 Linux machine installs (scripts/build-wheel.sh: portable GMP, the
# development build's compiled crates); tests/integration/test_wheel.py installs it into a clean
# venv and runs the demo.
WHEEL_STAMP := dist/.confide-wheel
$(WHEEL_STAMP): $(NATIVE) $(PROTO) $(CONSOLE) $(RUST_SRC) scripts/build-wheel.sh scripts/build-gmp.sh \
		$(shell git ls-files python 2>/dev/null)
	./scripts/build-wheel.sh && touch $@
wheel: $(WHEEL_STAMP)

# The container image (scripts/build-image.sh: mmdebstrap, buildah; one image for every role) and
# the Helm binary the chart's tests render with (scripts/ensure-helm.sh, from the Go module proxy).
# Where podman cannot run here (not root, no apt) it says so and the container tests skip.
IMAGE_STAMP := build/image/.confide-image
$(IMAGE_STAMP): $(WHEEL_STAMP) scripts/build-image.sh scripts/build-wheelhouse.sh scripts/sbom.py \
		scripts/ensure-podman.sh requirements-dev.txt
	./scripts/ensure-podman.sh
	@if [ "$$(id -u)" = 0 ] && command -v podman >/dev/null && command -v mmdebstrap >/dev/null; then \
		./scripts/build-image.sh && touch $@; \
	else \
		echo "make image: podman and mmdebstrap need root here: no image, the container tests skip"; \
	fi
image: $(IMAGE_STAMP)

# The offline bundle (scripts/build-bundle.sh); tests/integration/test_bundle.py installs it in a
# network namespace with no route out.
BUNDLE_STAMP := dist/.confide-bundle
$(BUNDLE_STAMP): $(WHEEL_STAMP) $(IMAGE_STAMP) scripts/build-bundle.sh scripts/bundle-install.sh \
		$(shell git ls-files deploy examples/breast_cancer.yaml 2>/dev/null)
	./scripts/ensure-helm.sh
	./scripts/build-bundle.sh && touch $@
bundle: $(BUNDLE_STAMP)

# The wheel installed as another machine would (the suite's pinned versions of its dependencies),
# for the crypto bench's portable-against-tuned records.
build/wheel-venv/.installed: $(WHEEL_STAMP)
	rm -rf build/wheel-venv && python3 -m venv build/wheel-venv
	sed -E 's/\[[^]]*\]//' requirements-dev.txt > build/wheel-constraints.txt
	build/wheel-venv/bin/pip install -q --constraint build/wheel-constraints.txt dist/confide-*.whl
	@touch $@

FUZZ_SECONDS ?= 600
fuzz: setup
	$(PYTHON) fuzz/run.py --seconds $(FUZZ_SECONDS) --jobs 2

# The controller's store tests also run against a real PostgreSQL server that the suite
# starts itself; its binaries are installed here when missing. Every test runs, in three phases:
# 1. all but `serial` and `exclusive` on both cores (pytest-xdist, whole files per worker so module
#    fixtures are built once, in xdist's order: the files with the most tests first. Longest files
#    first (tests/fixtures/ordering.py with --no-loadscope-reorder) measured slower. This phase keeps
#    both cores 96% busy: a third worker did not shorten it. The hang guard is doubled since a
#    neighbour shares the cores);
# 2. `serial` two at a time, longest first (tests/durations.json; --no-loadscope-reorder keeps that
#    order): they mostly wait on paced rounds (31% of the CPU one at a time). With test_console and
#    test_upload_resets among them: 132 s, 147 s in xdist's order, 243 s one at a time; those two
#    now run in 3 (99 s + 66 s here, Toxiproxy's test_wan skipped);
# 3. `exclusive` alone. tests/groups.py says why each file is in 2 or 3; phases 2 and 3 collect
#    only their files.
test-python: setup $(WHEEL_STAMP) $(IMAGE_STAMP) $(BUNDLE_STAMP)
	./scripts/ensure-postgres.sh
	./scripts/ensure-chromium.sh
	./scripts/ensure-toxiproxy.sh
	./scripts/ensure-mlflow-server.sh
	./scripts/ensure-prometheus.sh
	@status=0; \
	$(PYTHON) -m pytest -n 2 --dist loadfile --timeout 600 -m "not serial and not exclusive" tests || status=$$?; \
	echo "== the serial tests, two at a time (tests/groups.py SERIAL_FILES) =="; \
	$(PYTHON) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m serial $$($(PYTHON) tests/groups.py serial) || status=$$?; \
	echo "== the exclusive tests, alone (tests/groups.py EXCLUSIVE_FILES) =="; \
	$(PYTHON) -m pytest -m exclusive $$($(PYTHON) tests/groups.py exclusive) || status=$$?; \
	exit $$status

# The edit loop: the unit tier without the tests marked slow, on both cores (pytest-xdist).
# `make test` still runs everything.
test-fast: setup
	$(PYTHON) -m pytest -m "not integration and not slow" -n 2 --dist loadfile tests/unit

bench: setup build/wheel-venv/.installed
	@$(PYTHON) -m pip install -q "sf-heu==0.5.2b0" 2>/dev/null \
		|| echo "sf-heu==0.5.2b0 does not install here: HEU anchors will be skipped"
	$(PYTHON) benchmarks/crypto_bench.py
	$(PYTHON) benchmarks/privacy_bench.py
	$(PYTHON) benchmarks/runtime_bench.py
	$(PYTHON) benchmarks/metrics_bench.py --write
	$(PYTHON) benchmarks/controller_bench.py --stores sqlite,postgres
	$(PYTHON) benchmarks/console_bench.py --write
	$(PYTHON) benchmarks/vertical_bench.py
	$(PYTHON) benchmarks/psi_bench.py --write
	$(PYTHON) benchmarks/nn_bench.py --write
	$(PYTHON) benchmarks/dataplane_bench.py --write
	$(PYTHON) benchmarks/scaleout_bench.py --write
	./scripts/ensure-toxiproxy.sh
	$(PYTHON) benchmarks/wan_bench.py --write
	$(PYTHON) benchmarks/soak.py --write

lint: setup
	cargo clippy --workspace --all-targets --release -- -D warnings
	cargo fmt --all --check
	$(VENV)/bin/ruff check python tests benchmarks examples
	$(VENV)/bin/ruff format --check python tests benchmarks examples
	$(VENV)/bin/lint-imports

fmt: setup
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benchmarks examples

clean:
	rm -rf target build $(VENV) .system-deps python/confide/_native*.so
