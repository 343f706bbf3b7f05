# kdtr -- builds the C++/CUDA binaries of the conformance harness (docs/binaries.md).
#
#   make / make build   build/bin/kdtr_check (g++) and build/bin/kdtr_<op> for each op in
#                       OPS: with nvcc when it is found (CPU and CUDA backends), else with
#                       g++ (CPU backend only)
#   make NO_CUDA=1      force the CPU-only g++ build even where nvcc exists
#   make clean          remove build/
#
# Variables: CUDA_ARCH (default 90; a list such as "90 100" builds for each), NVCC
# (default nvcc; a name on PATH or a path), NO_CUDA, CXX, CXXFLAGS, NVCCFLAGS, LDFLAGS,
# BUILD (default build).  Changing any of them (or switching between the CUDA and the
# CPU-only build) rebuilds everything; editing a header rebuilds what includes it.
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
LDLIBS    := -lz

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

GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a))
KDTR_CXXFLAGS := -std=c++17 $(CXXFLAGS) -Wall -Wextra $(INCLUDES)
KDTR_NVCCFLAGS := -std=c++17 $(NVCCFLAGS) $(GENCODE) -Xcompiler=-Wall,-Wextra $(INCLUDES)

# The build configuration, recorded so that a change of variant or flags rebuilds.
CONFIG_STAMP := $(BUILD)/config.stamp
CONFIG := $(VARIANT) | $(CXX) $(KDTR_CXXFLAGS) | $(NVCC_PATH) $(KDTR_NVCCFLAGS) | $(LDFLAGS) $(LDLIBS)
ifneq ($(MAKECMDGOALS),clean)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(CONFIG_STAMP) 2>/dev/null)" = '$(CONFIG)' ] || printf '%s\n' '$(CONFIG)' > $(CONFIG_STAMP))
endif

TOOLS := $(BIN)/kdtr_check
OP_BINS := $(OPS:%=$(BIN)/kdtr_%)

.PHONY: all build clean
all: build
build: $(TOOLS) $(OP_BINS)
	@echo "built ($(VARIANT)): $(TOOLS) $(OP_BINS)"

$(BIN) $(OBJ):
	@mkdir -p $@

$(CONFIG_STAMP): ;

$(BIN)/kdtr_check: cuda_tests/tools/kdtr_check.cpp $(CONFIG_STAMP) | $(BIN) $(OBJ)
	$(CXX) $(KDTR_CXXFLAGS) -MMD -MP -MT $@ -MF $(OBJ)/kdtr_check.d $< -o $@ $(LDFLAGS) $(LDLIBS)

ifeq ($(VARIANT),cuda)
# test_<op>.cu is host code (CUDA runtime API calls, no kernels): nvcc hands it to the
# host compiler as C++ (-x c++), which skips a device pass that would only cost time.
$(OBJ)/test_%.o: cuda_tests/tests/test_%.cu $(CONFIG_STAMP) | $(OBJ)
	$(NVCC_PATH) -x c++ -std=c++17 $(NVCCFLAGS) -Xcompiler=-Wall,-Wextra $(INCLUDES) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

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
test: build venv
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
