# zinf: the two commands a newcomer types.
#
#   make demo   install what is missing, build the zinf command, run the main job on its built-in default
#   make test   install what is missing, build, run the whole test suite (ctest)
#
# Everything else here serves those two; CI (.ci/run) also runs
#   make check-layers  every #include of src/ and perf/ points down the layers' arrows
#   make check-format  every C++ file is laid out as .clang-format says (`make format` rewrites)
#   make example       install into a temporary prefix, build and run examples/ against it
#   make test-asan     the suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   make test-tsan     the threaded tests under ThreadSanitizer (build-tsan/)
# Variables:
#   BUILD_DIR (build), BUILD_TYPE (RelWithDebInfo), ZINF_CUDA (AUTO|ON|OFF),
#   JOBS (number of CPUs), CTEST_ARGS (extra ctest arguments, e.g. -L gpu).
# On the GPU machine, which has no network: `make device-debs` here, carry
# .deps there, then `make gpu-test` (label gpu, build-gpu/).

BUILD_DIR  ?= build
BUILD_TYPE ?= RelWithDebInfo
ZINF_CUDA  ?= AUTO
JOBS       ?= $(shell nproc)
CTEST_ARGS ?=

# Debian packages. BUILD_DEBS: what configuring and building the zinf command
# needs, all that `make demo` installs (a package the build needs goes here).
# TEST_DEBS: what the tests and checks need on top, installed by every other
# target: GoogleTest (the build directory is configured with its tests from
# then on), OpenMPI for the multi-rank tests (the build links MPI once it is
# installed: the build directory is configured again), fio, clang and lld for
# the libFuzzer target (tests/fuzz), clang-format (check-format).
# pcre2, icu and sentencepiece are the tokenizers of `zinf data encode`.
BUILD_DEBS := cmake ninja-build g++ pkg-config liburing-dev libhwloc-dev libisal-dev nlohmann-json3-dev libspdlog-dev \
              libpcre2-dev libicu-dev libsentencepiece-dev
TEST_DEBS  := libgtest-dev libopenmpi-dev openmpi-bin fio clang lld clang-format
DEBS       := $(BUILD_DEBS) $(TEST_DEBS)
# What `deps` installs: DEBS, or BUILD_DEBS under `make demo`, which also
# configures a new build directory without the tests (ZINF_BUILD_TESTS OFF,
# BUILD_TESTS here); every other target configures them in (`make test` after
# `make demo` configures again and builds the tests; nothing else is compiled
# again). The zinf command is whole either way, its benchmarks included.
PACKAGES    = $(DEBS)
BUILD_TESTS = ON
demo: PACKAGES = $(BUILD_DEBS)
demo: BUILD_TESTS = OFF
# The flags of the RelWithDebInfo build type (the default BUILD_TYPE): line
# tables only (-g1, as the sanitizer builds) instead of full debug info (-g).
# Backtraces, perf and sanitizer reports keep their file:line; the zinf
# command builds with about a quarter less CPU time (a fresh `make demo` on 2
# cores). For a debugger session, configure a build directory of your own
# with -DCMAKE_BUILD_TYPE=Debug.
REL_FLAGS  := -O2 -g1 -DNDEBUG
CMAKE_ARGS  = -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DZINF_CUDA=$(ZINF_CUDA) -DZINF_BUILD_TESTS=$(BUILD_TESTS) \
              -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(REL_FLAGS)" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(REL_FLAGS)"

# Each phase of demo, test and the steps they share says what it is doing and
# how long it took: $(call phase_start,NAME) ... ; $(call phase_end,NAME) on
# one recipe line.
phase_start = t0=$$(date +%s%N); echo "== $(1)"
phase_end   = t=$$(( ($$(date +%s%N) - t0) / 100000000 )); echo "== $(1): $$((t / 10)).$$((t % 10)) s"
START_NS   := $(shell date +%s%N)

.PHONY: demo example test test-asan test-tsan check-layers check-format format deps zinf build configure clean \
        device-debs gpu-test

# The zinf command and nothing else (not the tests), then the demo.
demo: zinf
	@$(call phase_start,run: zinf demo); ./$(BUILD_DIR)/zinf demo || exit $$?; $(call phase_end,run: zinf demo); \
	  t=$$(( ($$(date +%s%N) - $(START_NS)) / 100000000 )); echo "== make demo: $$((t / 10)).$$((t % 10)) s in all"

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS) $(CTEST_ARGS)

zinf: configure
	@$(call phase_start,build: the zinf command ($(JOBS) jobs)); \
	  cmake --build $(BUILD_DIR) -j $(JOBS) --target zinf || exit $$?; $(call phase_end,build: the zinf command)

build: configure
	@$(call phase_start,build: everything with the tests ($(JOBS) jobs)); \
	  cmake --build $(BUILD_DIR) -j $(JOBS) || exit $$?; $(call phase_end,build: everything)

# Configures once; again after `deps` installed packages into a configured
# tree (they may be what an optional part looks for: MPI), forgetting what
# the last configure found of MPI; again with the tests and benchmarks when a
# target that wants them finds a tree that `make demo` configured without.
configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  $(call phase_start,configure $(BUILD_DIR)); \
	  cmake -S . -B $(BUILD_DIR) $(CMAKE_ARGS) || exit $$?; \
	  $(call phase_end,configure); \
	elif [ -f $(BUILD_DIR)/.packages-installed ] || \
	     { [ $(BUILD_TESTS) = ON ] && grep -Eq '^ZINF_BUILD_TESTS:BOOL=OFF' $(BUILD_DIR)/CMakeCache.txt; }; then \
	  $(call phase_start,configure $(BUILD_DIR) again: packages were installed or the tests are wanted); \
	  cmake -U 'MPI_*' $$([ $(BUILD_TESTS) = OFF ] || echo -DZINF_BUILD_TESTS=ON) -S . -B $(BUILD_DIR) \
	    || exit $$?; \
	  $(call phase_end,configure); \
	fi; rm -f $(BUILD_DIR)/.packages-installed

# zinf as an embedder sees it (.ci/check_install.sh): cmake --install into a
# temporary prefix, examples/ built there with find_package(zinf) and with
# pkg-config, and run; each installed header compiled alone.
example: zinf
	cmake --build $(BUILD_DIR) -j $(JOBS) --target zinf_header_check
	bash .ci/check_install.sh $(BUILD_DIR)

# The arrows between the layers (ARCHITECTURE.md), from the sources: an
# include that points up or sideways is printed with its file:line and the
# rule it breaks. The build enforces the same (cmake/Layers.cmake).
check-layers:
	bash .ci/check_layers.sh

# The layout of every tracked C++ file (.clang-format, clang-format 14 as
# Debian 12 ships it): check-format lists the files that differ.
FORMAT_FILES = $$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
check-format: deps
	@clang-format --dry-run --Werror $(FORMAT_FILES) 2>&1 | grep -oE '^[^ :]+\.(cc|h|cu|cuh):[0-9]+' | sort -u -t: -k1,1 | \
	  sed 's/^/  not formatted: /' | grep . && { echo "check-format: run 'make format'"; exit 1; } || \
	  echo "check-format: $$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | wc -l) files as .clang-format says"
format: deps
	clang-format -i $(FORMAT_FILES)

# Sanitizer builds: their own build directories, no CUDA (nvcc code is not
# instrumented, and CI has no GPU), no fuzz target (it carries its own ASan).
# -O1 -g1: line tables (not full debug info) are all a sanitizer report
# needs, and they halve the build time on 2 cores.
SAN_FLAGS := -O1 -g1 -DNDEBUG
SAN_CMAKE := -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="$(SAN_FLAGS)" \
             -DCMAKE_C_FLAGS_RELEASE="$(SAN_FLAGS)" -DZINF_CUDA=OFF -DZINF_BUILD_FUZZ=OFF
SAN_DIR   := $(CURDIR)/tests/sanitizers

# Every test but the demo (label slow: its 60 steps take over ten minutes
# under ASan on 2 cores; the trainer, reliability and CLI train tests run the
# same code here) and the scale test (label scale: ASan's shadow memory and
# quarantine count against its memory cgroup, and it runs the same code). UBSan is fatal (built with -fno-sanitize-recover). Leaks
# are reported except those inside OpenMPI (lsan.supp). The MPI tests run
# with leak detection off: OpenMPI dlcloses its MCA plugins before
# LeakSanitizer looks, so their leaks show only "<unknown module>" frames
# that no suppression can name (ASan's other checks and UBSan stay on).
ASAN_ENV := ASAN_OPTIONS=check_initialization_order=1:strict_init_order=1:detect_leaks=1 \
            LSAN_OPTIONS=suppressions=$(SAN_DIR)/lsan.supp:print_suppressions=0 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-asan: deps
	@[ -f build-asan/build.ninja ] || cmake -S . -B build-asan $(SAN_CMAKE) -DZINF_SANITIZE=address,undefined
	cmake --build build-asan -j $(JOBS)
	cd build-asan && $(ASAN_ENV) ctest --output-on-failure --timeout 900 -j $(JOBS) -LE 'mpi|slow|scale' $(CTEST_ARGS)
	cd build-asan && $(ASAN_ENV) ASAN_OPTIONS=detect_leaks=0 \
	  ctest --output-on-failure --timeout 900 -j $(JOBS) -L mpi $(CTEST_ARGS)

# The tests of the layers that run threads of ours (aio rings and workers,
# the Adam thread pool, the swap pipeline, the engine with the host device's
# stream threads, communicators). Left out: mpi (OpenMPI is not built with
# TSan, so its shared-memory transport and progress threads read as races
# and stall ranks); kernels, model and the CLI (OpenMP number crunching on the
# one thread that drives the engine: nothing of ours runs concurrently there
# that the zero3 tests do not run, at 10x the time under TSan), except the
# model tests labelled `threads` (the trainer's kernels on a host stream
# beside the engine; GptCompute's offloaded layer inputs copied beside them). OpenMP runs one thread: libgomp is not TSan-built, so
# its barriers are invisible to TSan. Only those tests' binaries are built,
# and the fused attention's CUDA kernels on their host emulation (label
# threads too: a barrier missing between warps is a race there).
test-tsan: deps
	@[ -f build-tsan/build.ninja ] || cmake -S . -B build-tsan $(SAN_CMAKE) -DZINF_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS) --target \
	  $$(ninja -C build-tsan -t targets all | sed -n 's/^\(\(core\|device_host\|aio\|optim\|comm\|swap\|zero3\)_[a-z0-9_]*test\): .*/\1/p' | sort -u) \
	  model_trainer_stream_test model_gpt_offload_stream_test kernels_flash_attention_emulation_test
	cd build-tsan && \
	  TSAN_OPTIONS=second_deadlock_stack=1:suppressions=$(SAN_DIR)/tsan.supp \
	  OMP_NUM_THREADS=1 \
	  ctest --output-on-failure --timeout 900 -j $(JOBS) -L 'core|device|aio|optim|comm|swap|zero3|threads' -LE 'mpi|gpu' $(CTEST_ARGS)

# Installs the missing ones of PACKAGES when run as root; otherwise says what
# to install. Package lists already there are tried first (apt-get update
# takes 5 to 10 s); when they are missing or too old to install from, they
# are updated and the install runs again.
deps:
	@$(call phase_start,packages); missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "   installing:$$missing"; \
	    install="apt-get install -y -qq --no-install-recommends $$missing"; \
	    { ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $$install 2>/dev/null; } || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$install; } || exit $$?; \
	    [ ! -f $(BUILD_DIR)/CMakeCache.txt ] || touch $(BUILD_DIR)/.packages-installed; \
	  else \
	    echo "zinf needs these Debian packages; install them with:"; \
	    echo "  sudo apt-get install$$missing"; exit 1; \
	  fi; \
	else echo "   all $(words $(PACKAGES)) present"; fi; $(call phase_end,packages)

# Debian packages for a machine without network (the GPU machine): fetched
# here into .deps/, carried there and unpacked with `dpkg -x`. For the
# head-to-head with DeepSpeed (perf/gpu/headtohead.sh) also: libaio-dev (its
# async I/O op), DeepSpeed's sdist and the wheels of what it needs beyond the
# GPU machine's Python 3.12 (.deps/py), and fio built from Debian's source
# without the storage-cluster engines, whose libraries the packaged fio
# pulls in by the hundred (.deps/bin/fio).
#
# The C library, the compiler's runtime and the tools the recursive
# download brings along are the GPU machine's own: unpacking Debian's
# beside them puts a second glibc's headers on the include path, so they
# are not kept (gpu-test skips them too, should older downloads have them).
GPU_SKIP := '^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt-dev|libcrypt1|libnsl-dev|libtirpc-dev|libgcc-s1|libstdc\+\+6|gcc-12-base|perl.*|libperl.*|dpkg|tar|debianutils|autoconf|automake|autotools-dev|m4)_'
DEVICE_PY_WHEELS := hjson pydantic
DEVICE_FIO       := https://deb.debian.org/debian/pool/main/f/fio/fio_3.33.orig.tar.gz
device-debs:
	mkdir -p .deps && cd .deps && apt-get download $$(apt-cache depends --recurse --no-recommends --no-suggests \
	  --no-conflicts --no-breaks --no-replaces --no-enhances liburing-dev libhwloc-dev libisal-dev nlohmann-json3-dev \
	  libspdlog-dev libgtest-dev libfmt-dev libpcre2-dev libicu-dev libsentencepiece-dev libaio-dev \
	  | grep '^\w' | sort -u) 2>/dev/null || true
	cd .deps && for f in *.deb; do echo "$$f" | grep -Eq $(GPU_SKIP) && rm "$$f"; done; true
	python3 -m pip download -q --no-deps --no-binary :all: -d .deps/py deepspeed==0.19.8
	python3 -m pip download -q --only-binary :all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 -d .deps/py $(DEVICE_PY_WHEELS)
	[ -x .deps/bin/fio ] || { rm -rf .deps/fio-src && mkdir -p .deps/fio-src .deps/bin && \
	  curl -sSfL $(DEVICE_FIO) | tar xz -C .deps/fio-src --strip-components 1 && cd .deps/fio-src && \
	  ./configure --disable-native --disable-numa --disable-rdma --disable-rados --disable-rbd --disable-http \
	    --disable-gfapi --disable-pmem --disable-xnvme --disable-libzbc --disable-dfs > /dev/null && \
	  $(MAKE) -s -j $(JOBS) fio > /dev/null && strip fio && mv fio ../bin/ && cd .. && rm -rf fio-src; }

# On the GPU machine (no network, CUDA under /usr/local/cuda): unpack the
# packages device-debs fetched into .deps/root, point pkg-config and CMake at
# it, build with CUDA into build-gpu and run the tests with label gpu there.
# GPU_TARGETS="zinf device_cuda_test ...": only those (perf/gpu/session.sh,
# where device minutes are few).
GPU_ROOT := $(CURDIR)/.deps/root
GPU_LIBS := $(GPU_ROOT)/usr/lib/x86_64-linux-gnu
GPU_ENV  := PATH=$(GPU_ROOT)/usr/bin:$$PATH LD_LIBRARY_PATH=$(GPU_LIBS):$$LD_LIBRARY_PATH \
            PKG_CONFIG_PATH=$(GPU_LIBS)/pkgconfig:$(GPU_ROOT)/usr/share/pkgconfig
gpu-test:
	@[ -f $(GPU_ROOT)/.unpacked ] || { rm -rf $(GPU_ROOT) && for f in .deps/*.deb; do \
	  basename $$f | grep -Eq $(GPU_SKIP) && continue; dpkg -x $$f $(GPU_ROOT) || exit 1; done && \
	  find $(GPU_ROOT)/usr -name '*.pc' -exec sed -i -E 's#^(prefix|libdir|includedir)=/usr#\1=$(GPU_ROOT)/usr#' {} + && \
	  touch $(GPU_ROOT)/.unpacked; }
	@[ -f build-gpu/build.ninja ] || $(GPU_ENV) cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DZINF_CUDA=ON -DZINF_BUILD_FUZZ=OFF -DZINF_WERROR=OFF -DCMAKE_PREFIX_PATH=$(GPU_ROOT)/usr
	$(GPU_ENV) cmake --build build-gpu -j $(JOBS) $(if $(GPU_TARGETS),--target $(GPU_TARGETS))
	cd build-gpu && $(GPU_ENV) ctest --output-on-failure --timeout 600 -j $(JOBS) -L gpu $(CTEST_ARGS)

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-gpu
