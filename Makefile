# zinf: the two commands a newcomer types.
#
#   make demo   install what is missing, build, run the main job on its built-in default
#   make test   install what is missing, build, run the whole test suite (ctest)
#
# Everything else here serves those two. Variables:
#   BUILD_DIR (build), BUILD_TYPE (RelWithDebInfo), ZINF_CUDA (AUTO|ON|OFF),
#   JOBS (number of CPUs), CTEST_ARGS (extra ctest arguments, e.g. -L gpu).

BUILD_DIR  ?= build
BUILD_TYPE ?= RelWithDebInfo
ZINF_CUDA  ?= AUTO
JOBS       ?= $(shell nproc)
CTEST_ARGS ?=

# Debian packages the build and the tests need.
DEBS := cmake ninja-build g++ pkg-config liburing-dev libhwloc-dev nlohmann-json3-dev \
        libspdlog-dev libgtest-dev libopenmpi-dev openmpi-bin fio

.PHONY: demo test deps build configure clean device-debs

demo: build
	./$(BUILD_DIR)/zinf demo

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS) $(CTEST_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DZINF_CUDA=$(ZINF_CUDA); \
	fi

# Installs missing Debian packages when run as root; otherwise says what to install.
deps:
	@missing=""; for p in $(DEBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "== installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "zinf needs these Debian packages; install them with:"; \
	    echo "  sudo apt-get install$$missing"; exit 1; \
	  fi; \
	fi

# Debian packages for a machine without network (the GPU machine): fetched
# here into .deps/, carried there and unpacked with `dpkg -x`.
device-debs:
	mkdir -p .deps && cd .deps && apt-get download $$(apt-cache depends --recurse --no-recommends --no-suggests \
	  --no-conflicts --no-breaks --no-replaces --no-enhances liburing-dev libhwloc-dev nlohmann-json3-dev \
	  libspdlog-dev libgtest-dev libfmt-dev | grep '^\w' | sort -u) 2>/dev/null || true

clean:
	rm -rf $(BUILD_DIR)
