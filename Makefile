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
#                       where it is missing and apt-get can: see "CRC-32" below,
#                       and fetch the pinned CUTLASS wheel for the Hopper kernel (CUDA
#                       build with 90 in CUDA_ARCH): see "The Hopper kernel" below
#
# Variables: CUDA_ARCH (default 90; a list such as "90 120" builds for each), NVCC
# (default nvcc; a name on PATH or a path), NO_CUDA, CXX, CXXFLAGS, NVCCFLAGS, LDFLAGS,
# BUILD (default build), KDTR_CRC (auto or zlib), CUTLASS_CACHE (default .cache/cutlass),
# CUTLASS_INCLUDE (a directory holding cute/ and cutlass/, instead of the wheel's).
# Changing any of them but CUTLASS_CACHE (or switching between the CUDA and the CPU-only
# build, or ISA-L or the CUTLASS headers appearing or going) rebuilds everything; editing
# a header rebuilds what includes it.
#
# Adding an op: append its name to OPS, set CPU_CORES_<op> below and provide
# cuda_tests/tests/test_<op>.cu (the binary's main: host code only, compiled as C++ in
# both builds, with -DKDTR_NO_CUDA in the CPU-only one; it includes no op's core),
# cuda_tests/cpu/<op>.cpp (the CPU core's object: the one host translation unit that
# includes kernels/<op>.cuh) and cuda_tests/kernels/<op>.cu (the __global__ kernel and its
# host launcher, compiled by nvcc only).

OPS := tree_accept tree_build verify_attn greedy_step ddtree_decode

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

# The Hopper kernel (cuda_tests/kernels/verify_attn_sm90.cu: wgmma + TMA, written with
# CUTLASS/CuTe; kdtr_verify_attn --kernel wgmma).  Built only in the CUDA build with 90
# (or 90a) in CUDA_ARCH, and only for sm_90a (wgmma exists on no other target): that one
# translation unit gets -gencode arch=compute_90a,code=sm_90a, whatever else CUDA_ARCH
# lists.  Its headers: CUTLASS_INCLUDE=DIR if given (DIR/cute, DIR/cutlass; CUTLASS 4.2
# expected), else the include tree of the pinned pure-Python wheel
# nvidia-cutlass==$(CUTLASS_VERSION) (sha256 below), extracted by tools/cutlass_headers.py
# into $(BUILD)/third_party/cutlass-<version>/include without installing the package.
# The wheel is looked for in CUTLASS_CACHE (offline machines: copy it there); `make deps`
# (run by `make build`) downloads it there with `pip download --no-deps`, bounded by a
# timeout and tried once per build directory ($(BUILD)/cutlass.stamp holds the outcome);
# no other target touches the network.  With the headers, -DKDTR_HAVE_WGMMA=1 goes to
# every kernel translation unit (verify_attn.cu's dispatcher then offers the kernel) and
# verify_attn_sm90.o is linked into kdtr_verify_attn, kdtr_greedy_step and
# libkdtr_kernels.so.  Without them (no network, a wheel with another hash, a
# CUTLASS_INCLUDE without the headers) one line says why, and everything else is built
# without the Hopper kernel: never a build failure.  The CPU-only build ignores all this.
# The headers come in by -isystem: CUTLASS's own warnings are not ours to fix.
CUTLASS_VERSION := 4.2.0.0
CUTLASS_SHA256  := f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
CUTLASS_WHEEL   := nvidia_cutlass-$(CUTLASS_VERSION)-py3-none-any.whl
CUTLASS_CACHE   ?= .cache/cutlass
CUTLASS_INCLUDE ?=
CUTLASS_HEADERS := $(BUILD)/third_party/cutlass-$(CUTLASS_VERSION)/include
CUTLASS_STAMP   := $(BUILD)/cutlass.stamp
CUTLASS_TOOL     = python3 tools/cutlass_headers.py --version $(CUTLASS_VERSION) --sha256 $(CUTLASS_SHA256) \
                   --cache $(CUTLASS_CACHE) --dest $(CUTLASS_HEADERS)
cutlass_found = $(and $(wildcard $(1)/cute/tensor.hpp),$(wildcard $(1)/cutlass/cutlass.h))

WGMMA_INC :=
WGMMA_WHY :=
WGMMA_FETCH :=
ifeq ($(VARIANT),cuda)
ifneq ($(MAKECMDGOALS),clean)
ifneq ($(filter 90 90a,$(CUDA_ARCH)),)
ifneq ($(strip $(CUTLASS_INCLUDE)),)
WGMMA_INC := $(if $(call cutlass_found,$(CUTLASS_INCLUDE)),$(CUTLASS_INCLUDE))
WGMMA_WHY := CUTLASS_INCLUDE=$(CUTLASS_INCLUDE) holds no cute/tensor.hpp and cutlass/cutlass.h
else ifneq ($(call cutlass_found,$(CUTLASS_HEADERS)),)
WGMMA_INC := $(CUTLASS_HEADERS)
else ifneq ($(wildcard $(CUTLASS_CACHE)/$(CUTLASS_WHEEL)),)
# the wheel is here (offline is fine): extract it now, so that this very make builds the kernel
WGMMA_WHY := $(shell $(CUTLASS_TOOL) 2>&1 | tail -n 1)
ifeq ($(WGMMA_WHY),ok)
WGMMA_INC := $(CUTLASS_HEADERS)
endif
else
WGMMA_FETCH := 1
CUTLASS_TRIED := $(shell grep -v '^ok$$' $(CUTLASS_STAMP) 2>/dev/null)
WGMMA_WHY := $(if $(CUTLASS_TRIED),$(CUTLASS_TRIED) (`make deps` tries once per build directory: remove $(CUTLASS_STAMP) to try again),no $(CUTLASS_CACHE)/$(CUTLASS_WHEEL) (`make build` or `make deps` downloads it; CUTLASS_INCLUDE=DIR uses installed headers))
endif
endif
endif
endif

ifneq ($(WGMMA_INC),)
WGMMA := sm_90a
KDTR_NVCCFLAGS += -DKDTR_HAVE_WGMMA=1
SM90_NVCCFLAGS := -std=c++17 $(NVCCFLAGS) -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
                  -Xcompiler=-Wall,-Wextra $(INCLUDES) -isystem $(WGMMA_INC) -DKDTR_HAVE_WGMMA=1
SM90_OBJ := $(OBJ)/kernel_verify_attn_sm90.o
SM90_PIC_OBJ := $(OBJ)/pic/kernel_verify_attn_sm90.o
else
WGMMA := none
SM90_NVCCFLAGS :=
SM90_OBJ :=
SM90_PIC_OBJ :=
# One line, from the makes that build something (not from the outer `make build`, whose
# inner make says it after `deps` had its chance).
ifneq ($(WGMMA_WHY),)
ifneq ($(filter-out all build test run clean deps venv regen check-goldens mutate,$(MAKECMDGOALS)),)
$(info cutlass: $(WGMMA_WHY): building without the Hopper verify_attn kernel (--kernel wgmma))
endif
endif
endif

# The build configuration, recorded so that a change of variant, flags or CRC-32
# implementation rebuilds.
CONFIG_STAMP := $(BUILD)/config.stamp
CONFIG := $(VARIANT) | crc32=$(CRC_IMPL) | $(CXX) $(KDTR_CXXFLAGS) | $(NVCC_PATH) $(KDTR_NVCCFLAGS) | wgmma=$(WGMMA) $(SM90_NVCCFLAGS) | $(LDFLAGS) $(LDLIBS)
ifneq ($(MAKECMDGOALS),clean)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(CONFIG_STAMP) 2>/dev/null)" = '$(CONFIG)' ] || printf '%s\n' '$(CONFIG)' > $(CONFIG_STAMP))
endif

TOOLS := $(BIN)/kdtr_check $(BIN)/kdtr_detmath_check
COMMA := ,
OP_BINS := $(OPS:%=$(BIN)/kdtr_%)

.PHONY: all build binaries deps clean
all: build
# deps first, then a fresh make (re-probing for ISA-L) builds the binaries.
build: deps
	@$(MAKE) --no-print-directory binaries
binaries: $(TOOLS) $(OP_BINS)
	@echo "built ($(VARIANT), CRC-32 by $(CRC_IMPL)$(if $(filter cuda,$(VARIANT)),$(COMMA) Hopper kernel: $(WGMMA))): $(TOOLS) $(OP_BINS)"

# ISA-L for the CRC-32, where it is missing: as root with apt-get, install libisal-dev
# (quietly, each apt-get call bounded by a timeout, `apt-get update` first only when the
# package lists do not know it).  Tried once per build directory (the stamp; `make clean`
# or removing it tries again); a failure (no network, not root, no apt-get) only means
# zlib's crc32, said in one line.
DEPS_STAMP := $(BUILD)/deps.stamp
deps: $(DEPS_STAMP) $(if $(WGMMA_FETCH),$(if $(CUTLASS_TRIED),,cutlass-fetch))
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

# The CUTLASS wheel (see "The Hopper kernel" above), only when its headers are missing,
# the wheel is not in CUTLASS_CACHE and no earlier attempt failed in this build directory:
# pip download (at most 120 s), sha256 check, extraction.  The stamp holds "ok" or why
# not (said by the inner make of `make build`).
.PHONY: cutlass-fetch
cutlass-fetch:
	@mkdir -p $(BUILD)
	@echo "deps: downloading nvidia-cutlass==$(CUTLASS_VERSION) into $(CUTLASS_CACHE) (CUTLASS headers of the Hopper kernel)"
	@$(CUTLASS_TOOL) --download --timeout 120 > $(CUTLASS_STAMP).tmp 2>&1; \
	  tail -n 1 $(CUTLASS_STAMP).tmp > $(CUTLASS_STAMP); rm -f $(CUTLASS_STAMP).tmp

$(BIN) $(OBJ):
	@mkdir -p $@

$(CONFIG_STAMP): ;

$(BIN)/kdtr_check: cuda_tests/tools/kdtr_check.cpp $(CONFIG_STAMP) | $(BIN) $(OBJ)
	$(CXX) $(KDTR_CXXFLAGS) -MMD -MP -MT $@ -MF $(OBJ)/kdtr_check.d $< -o $@ $(LDFLAGS) $(LDLIBS)

# kdtr_detmath.hpp on the host, for tests/binaries/test_detmath_check.py: g++ in both
# builds, no FMA contraction (the header's bits depend on it).
$(BIN)/kdtr_detmath_check: cuda_tests/tools/kdtr_detmath_check.cpp $(CONFIG_STAMP) | $(BIN) $(OBJ)
	$(CXX) $(KDTR_CXXFLAGS) -ffp-contract=off -MMD -MP -MT $@ -MF $(OBJ)/kdtr_detmath_check.d $< -o $@

# The objects of each binary (docs/binaries.md, "Build layout"): its main
# $(OBJ)/test_<op>.o (cuda_tests/tests/test_<op>.cu: host code, includes no op's core),
# the CPU core of each op it runs, $(OBJ)/cpu_<op>.o (cuda_tests/cpu/<op>.cpp: the only
# translation unit that includes kernels/<op>.cuh on the host), any further objects of
# the op (greedy_step: the chain's wiring) and, in the CUDA build, the kernels
# $(OBJ)/kernel_<op>.o.  An edit rebuilds only the objects that include the edited file
# (-MMD deps) and relinks the binaries made of them.
CPU_CORES_tree_accept := tree_accept
CPU_CORES_tree_build  := tree_build
CPU_CORES_verify_attn := verify_attn
CPU_CORES_greedy_step := greedy_step tree_build verify_attn tree_accept
MAIN_EXTRA_greedy_step := $(OBJ)/greedy_step_chain.o
CPU_CORES_ddtree_decode := ddtree_decode tree_build verify_attn tree_accept
bin_objs = $(OBJ)/test_$(1).o $(foreach c,$(CPU_CORES_$(1)),$(OBJ)/cpu_$(c).o) $(MAIN_EXTRA_$(1))

# Host code (mains, CPU cores): as C++ in both builds; in the CUDA build by nvcc -x c++
# (nvcc hands it to the host compiler, skipping a device pass that would only cost time).
ifeq ($(VARIANT),cuda)
HOST_CXX := $(NVCC_PATH) -x c++ -std=c++17 $(NVCCFLAGS) -Xcompiler=-Wall,-Wextra $(CRC_FLAGS) $(INCLUDES)
else
HOST_CXX := $(CXX) $(KDTR_CXXFLAGS) -DKDTR_NO_CUDA -x c++
endif

$(OBJ)/test_%.o: cuda_tests/tests/test_%.cu $(CONFIG_STAMP) | $(OBJ)
	$(HOST_CXX) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(OBJ)/cpu_%.o: cuda_tests/cpu/%.cpp $(CONFIG_STAMP) | $(OBJ)
	$(HOST_CXX) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

# ddtree_decode's core computes kdtr.detmath's float64 exp, log and sums bit for bit: no FMA
# contraction (g++ contracts a * b + c by default where the target has FMA, as arm64 does).
FP_STRICT := $(if $(filter cuda,$(VARIANT)),-Xcompiler=-ffp-contract=off,-ffp-contract=off)
$(OBJ)/cpu_ddtree_decode.o $(OBJ)/pic/cpu_ddtree_decode.o: HOST_CXX += $(FP_STRICT)

$(OBJ)/greedy_step_chain.o: cuda_tests/tests/greedy_step_chain.cpp $(CONFIG_STAMP) | $(OBJ)
	$(HOST_CXX) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

# $(OBJ)/kdtr_<op>.d: every cuda_tests/ file the binary is built from (the union of its
# objects' deps), written at link time for tools that ask which binaries a file reaches
# (kdtr mutate); as a make rule it only repeats what the objects' .d files say.
# (A recipe line, so `make -n` only prints it.)
bin_deps = @printf '%s\n' '$(BIN)/kdtr_$(1): $(sort $(filter cuda_tests/%,$(filter-out %:,\
  $(foreach d,$(patsubst %.o,%.d,$(filter %.o,$(2))),$(file <$(d))))))' > $(OBJ)/kdtr_$(1).d

.SECONDEXPANSION:
ifeq ($(VARIANT),cuda)
$(OBJ)/kernel_%.o: cuda_tests/kernels/%.cu $(CONFIG_STAMP) | $(OBJ)
	$(NVCC_PATH) $(KDTR_NVCCFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

# The Hopper kernel: sm_90a only, the CUTLASS headers (see above).  Its own rule, so the
# pattern above never compiles it with the flags of the others.
$(OBJ)/kernel_verify_attn_sm90.o: cuda_tests/kernels/verify_attn_sm90.cu $(CONFIG_STAMP) | $(OBJ)
	$(if $(SM90_OBJ),,@echo "$@: no CUTLASS headers ($(WGMMA_WHY))" >&2; exit 1)
	$(NVCC_PATH) $(SM90_NVCCFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(OP_BINS): $(BIN)/kdtr_%: $$(call bin_objs,$$*) $(OBJ)/kernel_%.o | $(BIN)
	$(call bin_deps,$*,$^)
	$(NVCC_PATH) $(GENCODE) $(filter %.o,$^) -o $@ $(LDFLAGS) $(LDLIBS)

# greedy_step and ddtree_decode chain the three ops on the device: their binaries link
# the ops' kernels too (kernels/greedy_step.cu holds only the glue, kernels/ddtree_decode.cu
# the decode loop's own kernels).
$(BIN)/kdtr_greedy_step $(BIN)/kdtr_ddtree_decode: $(OBJ)/kernel_tree_build.o $(OBJ)/kernel_verify_attn.o \
  $(OBJ)/kernel_tree_accept.o
# and the Hopper kernel goes wherever verify_attn's dispatcher does
$(BIN)/kdtr_verify_attn $(BIN)/kdtr_greedy_step $(BIN)/kdtr_ddtree_decode: $(SM90_OBJ)
# The decode loop's drafter runs kdtr_detmath.hpp on the device: no FMA contraction.
$(OBJ)/kernel_ddtree_decode.o $(OBJ)/pic/kernel_ddtree_decode.o: KDTR_NVCCFLAGS += -fmad=false
else
$(OP_BINS): $(BIN)/kdtr_%: $$(call bin_objs,$$*) | $(BIN)
	$(call bin_deps,$*,$^)
	$(CXX) $(filter %.o,$^) -o $@ $(LDFLAGS) $(LDLIBS)
endif

clean:
	rm -rf $(BUILD)

-include $(wildcard $(OBJ)/*.d)

# --- the C ABI: build/lib/libkdtr_kernels.so (make lib) ---
#
# One extern "C" entry per op and backend (cuda_tests/include/kdtr_kernels.h,
# cuda_tests/lib/kdtr_kernels.cu), called from Python by kdtr/kernels.py.  CUDA build:
# the kernels and the CPU cores compiled again as position-independent objects into
# $(OBJ)/pic/ and linked with the entries by nvcc -shared (static cudart); CPU-only build
# (no nvcc, NO_CUDA=1): the entries and the CPU cores by $(CXX) -shared, every *_cuda entry
# returning "not built with CUDA".
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

# The CPU cores, position-independent ($(PIC)/cpu_<op>.o), in both builds.
$(PIC)/cpu_%.o: cuda_tests/cpu/%.cpp $(CONFIG_STAMP) | $(PIC)
	$(HOST_CXX) $(if $(filter cuda,$(VARIANT)),-Xcompiler -fPIC$(COMMA)-fvisibility=hidden,-fPIC -fvisibility=hidden) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

KERNELS_LIB_CPU := $(OPS:%=$(PIC)/cpu_%.o)

ifeq ($(VARIANT),cuda)
$(PIC)/kernel_%.o: cuda_tests/kernels/%.cu $(CONFIG_STAMP) | $(PIC)
	$(NVCC_PATH) $(KDTR_NVCCFLAGS) -Xcompiler -fPIC -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(PIC)/kernel_verify_attn_sm90.o: cuda_tests/kernels/verify_attn_sm90.cu $(CONFIG_STAMP) | $(PIC)
	$(if $(SM90_OBJ),,@echo "$@: no CUTLASS headers ($(WGMMA_WHY))" >&2; exit 1)
	$(NVCC_PATH) $(SM90_NVCCFLAGS) -Xcompiler -fPIC -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(PIC)/kdtr_kernels.o: $(KERNELS_LIB_SRC) $(CONFIG_STAMP) | $(PIC)
	$(NVCC_PATH) -x c++ -std=c++17 $(NVCCFLAGS) -Xcompiler=-Wall,-Wextra,-fPIC,-fvisibility=hidden $(INCLUDES) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(KERNELS_LIB): $(PIC)/kdtr_kernels.o $(KERNELS_LIB_CPU) $(OPS:%=$(PIC)/kernel_%.o) $(SM90_PIC_OBJ) | $(LIBDIR)
	$(NVCC_PATH) -shared $(GENCODE) $(filter %.o,$^) -o $@ $(LDFLAGS)
else
$(PIC)/kdtr_kernels.o: $(KERNELS_LIB_SRC) $(CONFIG_STAMP) | $(PIC)
	$(CXX) $(KDTR_CXXFLAGS) -DKDTR_NO_CUDA -fPIC -fvisibility=hidden -MMD -MP -MT $@ -MF $(@:.o=.d) -x c++ -c $< -o $@

$(KERNELS_LIB): $(PIC)/kdtr_kernels.o $(KERNELS_LIB_CPU) | $(LIBDIR)
	$(CXX) -shared $(filter %.o,$^) -o $@ $(LDFLAGS)
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

# kdtr needs Python >= 3.10 (pyproject.toml's requires-python). PYTHON is checked while the
# Makefile is read, before anything is built, whenever a goal needs the venv and the venv
# is to be (re)made: an older Python used to fail only after the whole build (`make test`
# builds first), in pip, with a message about a dependency.
VENV_GOALS := venv run test regen check-goldens mutate
ifneq ($(filter $(VENV_GOALS),$(MAKECMDGOALS)),)
ifneq ($(shell [ -f $(VENV)/.installed ] && [ ! pyproject.toml -nt $(VENV)/.installed ] && echo fresh),fresh)
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; v = sys.version_info; print("%d.%d" % v[:2], int(v >= (3, 10)))' 2>/dev/null)
ifeq ($(PYTHON_VERSION),)
$(error kdtr needs Python >= 3.10; PYTHON=$(PYTHON) does not run; set PYTHON=python3.11)
endif
ifneq ($(word 2,$(PYTHON_VERSION)),1)
$(error kdtr needs Python >= 3.10; PYTHON=$(PYTHON) is $(word 1,$(PYTHON_VERSION)); set PYTHON=python3.11)
endif
endif
endif

# A venv whose interpreter is older than 3.10 (left by an earlier failed attempt) is
# removed first: `python3.11 -m venv` over it keeps its old bin/python. A venv whose
# creation or install fails is removed, so that the next `make venv` starts afresh.
.PHONY: venv run test regen check-goldens mutate
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@$(VPY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV) && $(VPY) -m pip install --quiet --disable-pip-version-check -e '.[test]' || \
	  { rm -rf $(VENV); echo "venv: the install failed; $(VENV) removed (the next make venv starts afresh)" >&2; exit 1; }
	@touch $@

run: build venv
	$(KDTR) run $(RUN_ARGS)

# A conformance run first (it leaves reports/ for CI), then the whole suite; both must pass.
# `make lib` (after build, in a fresh make that sees what `deps` installed) for the tests
# of the C ABI bindings (tests/binaries/test_kernels_abi.py).
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
