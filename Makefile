# kvq entry points. `make demo` and `make test` set the machine up first when
# needed (scripts/setup.sh is idempotent and fast when nothing is missing).
BUILD     ?= build
JOBS      ?= $(shell nproc)
FUZZ_SECONDS ?= 60
LLAMA_BIN  = $(shell scripts/build_llama_cpp.sh llama llama-perplexity | tail -n 1)
CMAKE_FLAGS ?=
# Tests share two cores with whatever else runs: OpenMP threads that sleep at
# barriers instead of spinning keep an oversubscribed machine from crawling.
# (Benchmarks keep the default spinning policy, as llama.cpp does.)
TEST_ENV = OMP_WAIT_POLICY=PASSIVE

.PHONY: all setup build llama-cpp test test-unit test-sanitize fuzz check demo format clean \
        conformance-real peers

all: build

setup:
	@scripts/setup.sh --check || scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# llama.cpp, built once into a cache outside the checkout (slow the first time):
# the library for kvq's harness, and llama-perplexity for the real-weight
# conformance tests.
llama-cpp: setup
	@scripts/build_llama_cpp.sh llama llama-perplexity >/dev/null

# Every test: unit tests, tokenizer vectors, and conformance with llama.cpp.
test: setup llama-cpp
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DKVQ_LLAMACPP_BIN=$(LLAMA_BIN) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	$(TEST_ENV) ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Conformance with llama.cpp on every real model set-up fetched (docs/models.md):
# greedy continuations, then KL / top-1 / perplexity over 16K held-out tokens.
REAL_MODELS = SmolLM2-135M-Instruct.Q4_1 qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct
conformance-real: test
	$(TEST_ENV) $(BUILD)/bin/conformance_tests --gtest_filter='Real/*'
	@set -e; for m in $(REAL_MODELS); do \
	  tests/conformance/real_model_conformance.sh $(BUILD)/bin/kvq $(LLAMA_BIN) .deps/models/$$m.gguf \
	    .deps/corpus/test.txt $(BUILD)/conformance_real; done

# The peers' KV caches (llama.cpp types with/without rotation, transformers'
# QuantizedCache) beside kvq's schemes on the default real model, into
# docs/peers/ (bench/quality_peers.sh; 30-60 min on 2 shared cores). Not part of test.
PEERS_MODEL ?= SmolLM2-135M-Instruct.Q4_1
PEERS_CHUNKS ?= 8
peers: build llama-cpp
	scripts/setup_peers.sh
	bench/quality_peers.sh .deps/models/$(PEERS_MODEL).gguf .deps/corpus/test.txt \
	  $(BUILD)/peers/$(PEERS_MODEL) $(PEERS_CHUNKS)
	mkdir -p docs/peers/$(PEERS_MODEL)
	cp -r $(BUILD)/peers/$(PEERS_MODEL)/peers.json $(BUILD)/peers/$(PEERS_MODEL)/peers.md \
	  $(BUILD)/peers/$(PEERS_MODEL)/logs docs/peers/$(PEERS_MODEL)/
	python3 bench/peers_table.py embed docs/benchmarks.md $(PEERS_MODEL) docs/peers/$(PEERS_MODEL)/peers.md

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer, built for
# this CPU's own Highway target only (CMakeLists.txt: every target is checked
# against the scalar twins by make test).
# ASAN_SKIP: sweeps that repeat, end to end, code the unit tests already run
# under the sanitizers (every codec through the fused kernels:
# PagedKvCache.FusedAttentionMatchesReferenceForEveryCodec; the CLI:
# hardening_cli_test, study_cli_test). Under ASan they took 15 of the 24
# test-minutes (KvBitIdentity 378 s, kv_types_cli_test 304 s,
# chromium_study_quick_test 219 s); make test runs them unsanitized.
# RunState.DecodeStepsAllocateNothing counts heap allocations per decode step,
# a property of the release build (146 s under ASan); the forward pass it
# drives runs under the sanitizers in the engine and generate tests.
# NeedleExtensionOnSmolLM2 is the real model's answers (20 s released); the
# same extension code runs sanitized on the tiny model
# (StudyTasksTest.NeedleExtensionSkipsTasksF16Fails).
ASAN_SKIP = ^(KvBitIdentity\..*|kv_types_cli_test|chromium_study_quick_test|RunState\.DecodeStepsAllocateNothing|NeedleExtensionOnSmolLM2\..*)$$
test-sanitize: setup
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=SanitizeBuild -DKVQ_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)
	$(TEST_ENV) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -LE 'llamacpp|soak' -E '$(ASAN_SKIP)'

# Each libFuzzer target for FUZZ_SECONDS, starting from its seed corpus, one
# target per core at a time (scripts/fuzz_one.sh; xargs fails if any fails).
# FuzzBuild is -O1 with line tables (CMakeLists.txt), libFuzzer's usual
# flags: at -O2 -g the instrumented Highway kernels (ops/, kv/) the parsers
# link in took clang more than 10 minutes a file on the shared 2 cores.
FUZZ_BUILD_TYPE ?= FuzzBuild
fuzz: setup
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=$(FUZZ_BUILD_TYPE) -DKVQ_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target $$(cd fuzz && ls *_fuzz.cc | sed 's/\.cc$$//')
	@ls build-fuzz/bin/*_fuzz | xargs -P $(JOBS) -I{} scripts/fuzz_one.sh {} $(FUZZ_SECONDS)

# What CI runs: the README's test command, then sanitizers and fuzzing.
check: test test-sanitize fuzz

demo: build
	scripts/demo.sh $(BUILD)/bin/kvq

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-fuzz
