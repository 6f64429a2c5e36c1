# tandem: two commands on a fresh Debian 12 machine.
#   make demo   installs what is missing, builds Release, runs the main job on the embedded demo models
#   make test   builds and runs every test through ctest
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo asan clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	@bash scripts/fetch-test-data.sh
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-fuzz
