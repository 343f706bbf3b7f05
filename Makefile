# kdtr -- builds the C++/CUDA binaries of the conformance harness (docs/binaries.md).
#
#   make / make build   build/bin/kdtr_check (g++) and build/bin/kdtr_<op> for each op in
#                       OPS: with nvcc when it is found (CPU and CUDA backends), else with
#                       g++ (CPU backend only)
#   make NO_CUDA=1      force the CPU-only g++ build even where nvcc exists
#   make lib            build/lib/libkdtr_kernels.so: the C ABI of the kernels (CUDA and
#                       CPU entries; CPU only without nvcc or with NO_CUDA=1), see below
#   make clean          remove build/
#   make deps           (run by `make build`) install ISA-L (libisal-dev) for the CRC-32
#                       where it is missing and apt-get can: see "CRC-32" below
#
# Variables: CUDA_ARCH (default 90; a list such as "90 100" builds for each), NVCC
# (default nvcc; a name on PATH or a path), NO_CUDA, CXX, CXXFLAGS, NVCCFLAGS, LDFLAGS,
# BUILD (default build), KDTR_CRC (auto or zlib).  Changing any of them (or switching
# between the CUDA and the CPU-only build, or ISA-L appearing or going) rebuilds
# everything; editing a header rebuilds what includes it.
#
# Adding an op: append its name to OPS and provide cuda_tests/tests/test_<op>.cu (the
# binary's main: host code only, compiled as C++ in both builds, with -DKDTR_NO_CUDA in
# the CPU-only one) and cuda_tests/kernels/<op>.cu (the __global__ kernel and its host
# launcher, compiled by nvcc only).

OPS := tree_accept tree_build verify_attn greedy_step

BUILD     ?= build
CUDA_ARCH ?= 90
NVCC      ?= nvcc
CXXFLAGS  ?= -O2
NVCCFLAGS ?= -O2
LDLIBS    := -lz -lpthread

BIN := $(BUILD)/bin
OBJ := $(BUILD)/obj
INCLUDES := -Icuda_tests/include -Icuda_tests/kernels

ifeq ($(strip $(NO_CUDA)),)
NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null)
endif
ifneq ($(NVCC_PATH),)
VARIANT := cuda
else
VARIANT := cpu
endif

# CRC-32 (docs/kdtr-format.md section 3.3): kdtr.hpp computes zlib's CRC-32 with ISA-L's
# crc32_gzip_refl (same values, several times faster) when a compile-and-link probe finds
# <isa-l/crc.h> and -lisal, else with zlib's crc32.  KDTR_CRC=zlib forces zlib (and skips
# the install attempt of `make deps`).
KDTR_CRC ?= auto
ifeq ($(strip $(KDTR_CRC)),zlib)
CRC_IMPL := zlib
else
CRC_IMPL := $(shell printf '\043include <isa-l/crc.h>\nint main(void) { return (int)crc32_gzip_refl(0, 0, 0); }\n' | \
  $(CXX) -x c++ - -o /dev/null $(LDFLAGS) -lisal >/dev/null 2>&1 && echo isal || echo zlib)
endif
ifeq ($(CRC_IMPL),isal)
CRC_FLAGS := -DKDTR_HAVE_ISAL=1
LDLIBS := -lisal $(LDLIBS)
endif

GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a))
KDTR_CXXFLAGS := -std=c++17 $(CXXFLAGS) -Wall -Wextra $(CRC_FLAGS) $(INCLUDES)
KDTR_NVCCFLAGS := -std=c++17 $(NVCCFLAGS) $(GENCODE) -Xcompiler=-Wall,-Wextra $(CRC_FLAGS) $(INCLUDES)

# The build configuration, recorded so that a change of variant, flags or CRC-32
# implementation rebuilds.
CONFIG_STAMP := $(BUILD)/config.stamp
CONFIG := $(VARIANT) | crc32=$(CRC_IMPL) | $(CXX) $(KDTR_CXXFLAGS) | $(NVCC_PATH) $(KDTR_NVCCFLAGS) | $(LDFLAGS) $(LDLIBS)
ifneq ($(MAKECMDGOALS),clean)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(CONFIG_STAMP) 2>/dev/null)" = '$(CONFIG)' ] || printf '%s\n' '$(CONFIG)' > $(CONFIG_STAMP))
endif

TOOLS := $(BIN)/kdtr_check
OP_BINS := $(OPS:%=$(BIN)/kdtr_%)

.PHONY: all build binaries deps clean
all: build
# deps first, then a fresh make (re-probing for ISA-L) builds the binaries.
build: deps
	@$(MAKE) --no-print-directory binaries
binaries: $(TOOLS) $(OP_BINS)
	@echo "built ($(VARIANT), CRC-32 by $(CRC_IMPL)): $(TOOLS) $(OP_BINS)"

# ISA-L for the CRC-32, where it is missing: as root with apt-get, install libisal-dev
# (quietly, each apt-get call bounded by a timeout, `apt-get update` first only when the
# package lists do not know it).  Tried once per build directory (the stamp; `make clean`
# or removing it tries again); a failure (no network, not root, no apt-get) only means
# zlib's crc32, said in one line.
DEPS_STAMP := $(BUILD)/deps.stamp
deps: $(DEPS_STAMP)
$(DEPS_STAMP):
	@mkdir -p $(@D)
	@if [ "$(CRC_IMPL)" != isal ] && [ "$(strip $(KDTR_CRC))" != zlib ]; then \
	  apt="apt-get -y -qq -o Acquire::Retries=0 -o Acquire::http::Timeout=15 -o Acquire::https::Timeout=15"; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    { apt-cache show libisal-dev >/dev/null 2>&1 || timeout 120 $$apt update; \
	      timeout 180 $$apt install libisal-dev; } \
	      >/dev/null 2>&1 || echo "deps: could not install libisal-dev with apt-get: the CRC-32 will be zlib's"; \
	  else \
	    echo "deps: ISA-L (libisal-dev) not found and not installable here (needs root and apt-get): the CRC-32 will be zlib's"; \
	  fi; \
	fi
	@touch $@

$(BIN) $(OBJ):
	@mkdir -p $@

$(CONFIG_STAMP): ;

$(BIN)/kdtr_check: cuda_tests/tools/kdtr_check.cpp $(CONFIG_STAMP) | $(BIN) $(OBJ)
	$(CXX) $(KDTR_CXXFLAGS) -MMD -MP -MT $@ -MF $(OBJ)/kdtr_check.d $< -o $@ $(LDFLAGS) $(LDLIBS)

ifeq ($(VARIANT),cuda)
# test_<op>.cu is host code (CUDA runtime API calls, no kernels): nvcc hands it to the
# host compiler as C++ (-x c++), which skips a device pass that would only cost time.
$(OBJ)/test_%.o: cuda_tests/tests/test_%.cu $(CONFIG_STAMP) | $(OBJ)
	$(NVCC_PATH) -x c++ -std=c++17 $(NVCCFLAGS) -Xcompiler=-Wall,-Wextra $(CRC_FLAGS) $(INCLUDES) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(OBJ)/kernel_%.o: cuda_tests/kernels/%.cu $(CONFIG_STAMP) | $(OBJ)
	$(NVCC_PATH) $(KDTR_NVCCFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(OP_BINS): $(BIN)/kdtr_%: $(OBJ)/test_%.o $(OBJ)/kernel_%.o | $(BIN)
	$(NVCC_PATH) $(GENCODE) $(filter %.o,$^) -o $@ $(LDFLAGS) $(LDLIBS)

# greedy_step chains the three ops on the device: its binary links their kernels too
# (kernels/greedy_step.cu holds only the glue).  The CPU-only build needs nothing extra:
# the ops' CPU cores are headers.
$(BIN)/kdtr_greedy_step: $(OBJ)/kernel_tree_build.o $(OBJ)/kernel_verify_attn.o $(OBJ)/kernel_tree_accept.o
else
$(OP_BINS): $(BIN)/kdtr_%: cuda_tests/tests/test_%.cu $(CONFIG_STAMP) | $(BIN) $(OBJ)
	$(CXX) $(KDTR_CXXFLAGS) -DKDTR_NO_CUDA -MMD -MP -MT $@ -MF $(OBJ)/kdtr_$*.d -x c++ $< -x none -o $@ $(LDFLAGS) $(LDLIBS)
endif

clean:
	rm -rf $(BUILD)

-include $(wildcard $(OBJ)/*.d)

# --- the C ABI: build/lib/libkdtr_kernels.so (make lib) ---
#
# One extern "C" entry per op and backend (cuda_tests/include/kdtr_kernels.h,
# cuda_tests/lib/kdtr_kernels.cu), called from Python by kdtr/kernels.py.  CUDA build:
# the kernels compiled again as position-independent objects into $(OBJ)/pic/ and linked
# with the entries by nvcc -shared (static cudart); CPU-only build (no nvcc, NO_CUDA=1):
# the entries alone by $(CXX) -shared, every *_cuda entry returning "not built with CUDA".
# Not part of `make build`; `make test` builds it.
LIBDIR := $(BUILD)/lib
PIC := $(OBJ)/pic
KERNELS_LIB := $(LIBDIR)/libkdtr_kernels.so
KERNELS_LIB_SRC := cuda_tests/lib/kdtr_kernels.cu

.PHONY: lib
lib: $(KERNELS_LIB)
	@echo "built ($(VARIANT)): $(KERNELS_LIB)"

$(LIBDIR) $(PIC):
	@mkdir -p $@

ifeq ($(VARIANT),cuda)
$(PIC)/kernel_%.o: cuda_tests/kernels/%.cu $(CONFIG_STAMP) | $(PIC)
	$(NVCC_PATH) $(KDTR_NVCCFLAGS) -Xcompiler -fPIC -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(PIC)/kdtr_kernels.o: $(KERNELS_LIB_SRC) $(CONFIG_STAMP) | $(PIC)
	$(NVCC_PATH) -x c++ -std=c++17 $(NVCCFLAGS) -Xcompiler=-Wall,-Wextra,-fPIC,-fvisibility=hidden $(INCLUDES) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(KERNELS_LIB): $(PIC)/kdtr_kernels.o $(OPS:%=$(PIC)/kernel_%.o) | $(LIBDIR)
	$(NVCC_PATH) -shared $(GENCODE) $(filter %.o,$^) -o $@ $(LDFLAGS)
else
$(KERNELS_LIB): $(KERNELS_LIB_SRC) $(CONFIG_STAMP) | $(LIBDIR) $(PIC)
	$(CXX) $(KDTR_CXXFLAGS) -DKDTR_NO_CUDA -fPIC -fvisibility=hidden -shared -MMD -MP -MT $@ -MF $(PIC)/kdtr_kernels.d -x c++ $< -x none -o $@ $(LDFLAGS)
endif

-include $(wildcard $(PIC)/*.d)

# --- python targets below ---

# `make run` and `make test` set everything up from a fresh clone: a virtual environment
# with kdtr installed (editable) and its test extra, then the binaries above.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
KDTR   := $(VENV)/bin/kdtr
RUN_ARGS ?=

.PHONY: venv run test regen check-goldens mutate
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

run: build venv
	$(KDTR) run $(RUN_ARGS)

# A conformance run first (it leaves reports/ for CI), then the whole suite; both must pass.
# `make lib` (after build, in a fresh make that sees what `deps` installed) for the tests
# of the C ABI bindings (tests/test_kernels_abi.py).
test: build venv
	@$(MAKE) --no-print-directory lib
	$(KDTR) run $(RUN_ARGS) ; rc=$$? ; \
	$(VPY) -m pytest -q -p no:cacheprovider tests || exit 1 ; exit $$rc

regen: venv
	$(KDTR) regen

check-goldens: venv
	$(KDTR) regen --check

# Mutation testing (docs/mutation.md): every catalogue mutant (mutants/*.toml) and a fixed
# sample of the generic operator pass (universalmutator), each planted alone in a scratch
# copy of the CPU cores and run against the committed goldens; writes
# reports/mutation.md and .json, exit 1 on a surviving non-equivalent mutant.
MUTATE_ARGS ?=
$(VENV)/.installed-mutate: $(VENV)/.installed
	$(VPY) -m pip install --quiet --disable-pip-version-check -e '.[test,mutate]'
	@touch $@

mutate: $(VENV)/.installed-mutate
	$(KDTR) mutate --generic $(MUTATE_ARGS)
