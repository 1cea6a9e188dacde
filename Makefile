# Makefile: builds build/mtrain (CPU), the test programs, and runs the demo
# and the test suite; with nvcc, also the CUDA kernels' GPU programs.
#   make            build/mtrain only
#   make all        everything the tests need: build/mtrain, the test programs,
#                   the sim (build/sim/) and, with nvcc, the GPU programs
#   make test       make all + every CPU test; prints "N passed, N failed"
#   make test SANITIZE=1   the same build with ASan + UBSan + leak checks in
#                   build/san/, its test programs and the shell tests that run
#                   $$MTRAIN (tests/run.sh says which)
#   make fuzz       the readers of input files under libFuzzer (tests/fuzz/)
#   make demo       build/mtrain only, then train a tiny model and show that
#                   it learned
#   make test-gpu   CUDA kernels against the CPU backend (needs a GPU)
#   make build-test-gpu   the GPU test and benchmark programs, not run
#   make test-sim   the CUDA sources on the CPU execution model of CUDA
#                   (tests/sim/cudasim/, docs/SIM.md): build/sim/, its tests run
# With nvcc, `make all` also compiles the GPU programs (build/tests/gpu_*) but
# never runs them. CUDA_ARCHS picks the targets (default sm_80 and sm_90).

CC ?= gcc
ARCH ?= -march=native
CFLAGS ?= -O3 $(ARCH)
CFLAGS += -std=gnu11 -fopenmp -Wall -Wextra -MMD -MP
BLAS_DIR = /usr/lib/x86_64-linux-gnu/openblas-openmp
CFLAGS += -I/usr/include/x86_64-linux-gnu/openblas-openmp
LDLIBS = -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lyaml -lzstd -lcjson -lm -fopenmp
# Open MPI (Debian): compile and link flags from its wrapper.
CFLAGS += $(shell mpicc --showme:compile)
LDLIBS += $(shell mpicc --showme:link)
PYTHON = /usr/bin/python3

# Tokenizer: PCRE2 (the split regex) and utf8proc (NFC).
LDLIBS += -lpcre2-8 -lutf8proc

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(realpath $(NVCC))),/usr/local/cuda)
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NVCCFLAGS = -O3 -std=c++17 $(CUDA_ARCHS) -Xcompiler -Wall,-Wextra -MMD -MP

LIB_SRC = $(wildcard dist/*.c data/*.c attention/*.c attention/*/*.c model/*.c trainer/*.c)
LIB_SRC := $(filter-out trainer/main.c, $(LIB_SRC))
CU_SRC = $(wildcard attention/*/*.cu model/*.cu dist/*.cu)
TEST_SRC = $(wildcard tests/unit/test_*.c)

LIB_OBJ = $(LIB_SRC:%.c=build/obj/%.o)
ifneq ($(NVCC),)
CU_OBJ = $(CU_SRC:%.cu=build/obj/%.cu.o)
CFLAGS += -I$(CUDA_HOME)/include
endif
# Test programs keep flat names whatever their folder: build/tests/NAME from tests/KIND/NAME.c.
TEST_BIN = $(TEST_SRC:tests/unit/%.c=build/tests/%)
# Helper programs of the Python tests (not run on their own by tests/run.sh).
TOOL_BIN = $(patsubst tests/reference/%.c,build/tests/%,$(wildcard tests/reference/tool_*.c))
# MPI test programs (tests/mpi/mpi_*.c): run under mpirun by the shell tests, not by the runner.
MPI_CPU_BIN = $(patsubst tests/mpi/%.c,build/tests/%,$(wildcard tests/mpi/mpi_*.c))
MPI_TEST_BIN = $(MPI_CPU_BIN)

# GPU programs (tests/sim/gpu_*.c): only libc, OpenMP, the CUDA runtime, cuBLASLt
# (model/matmul_cuda.cu) and the objects below, so that they build on a GPU machine that lacks the trainer's
# libraries (test-gpu skips the dependency check: DEPS_OK=).
ifneq ($(NVCC),)
GPU_BIN = $(patsubst tests/sim/%.c,build/tests/%,$(filter-out tests/sim/gpu_test_backend.c tests/sim/gpu_test_attention_op.c,$(wildcard tests/sim/gpu_*.c)))
# The trainer with the CUDA backend (train.backend: cuda | auto) and the test
# of that backend: every C object again with -DMTRAIN_CUDA (build/cuda/obj),
# linked with the CUDA objects, the CUDA runtime and cuBLASLt. build/mtrain
# stays the CPU build (docs/DECISIONS.md).
CUDA_LIB_OBJ = $(LIB_SRC:%.c=build/cuda/obj/%.o)
CUDA_BIN = build/cuda/mtrain build/tests/gpu_test_backend build/tests/gpu_test_attention_op
# MPI programs on GPUs (tests/sim/mpi_gpu_*.c: NCCL), built like the MPI tests
# with the CUDA runtime and NCCL added.
MPI_TEST_BIN += $(patsubst tests/sim/%.c,build/tests/%,$(wildcard tests/sim/mpi_gpu_*.c))
build/tests/mpi_gpu_%: LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lnccl -lstdc++
# Not the CUDA op (attention/op/): it calls its ring, whose objects need MPI.
GPU_OBJ = build/obj/dist/util.o build/obj/attention/kernels/flash_cpu.o build/obj/attention/layout.o \
          build/obj/attention/kernels/sparse_flash_cpu.o build/obj/attention/sparse/sparse_index.o \
          build/obj/attention/kernels/kernel_counts.o build/obj/attention/kernels/kernel_cost.o \
          $(filter-out build/obj/attention/op/%,$(CU_OBJ))
GPU_LDLIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++ -lm -fopenmp
endif
DEPS_OK = build/.deps-ok
# Nothing built is an intermediate: make would delete the objects of the
# test programs and of the sim and rebuild them on the next make.
.SECONDARY:

.PHONY: all test demo test-gpu build-test-gpu build-sim test-sim deps clean
.DEFAULT_GOAL := build/mtrain
all: build/mtrain $(TEST_BIN) $(GPU_BIN) $(CUDA_BIN)
all: $(MPI_TEST_BIN) $(TOOL_BIN) build-sim

# Every dependency present, or install it (as root) / say how.
build/.deps-ok: scripts/install_deps.sh
	@bash scripts/install_deps.sh --check-or-install
	@mkdir -p build && touch $@

build/obj/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/obj/%.cu.o: %.cu $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# wgmma and setmaxnreg need the arch-specific target: the sm_90 kernels' code is sm_90a.
comma := ,
build/obj/attention/kernels/flash_sm90.cu.o build/obj/attention/kernels/flash_sm90_backward.cu.o \
    build/obj/attention/kernels/flash_sm90_sparse.cu.o: CUDA_ARCHS := \
    $(subst compute_90$(comma)code=sm_90,compute_90a$(comma)code=sm_90a,$(CUDA_ARCHS))

build/mtrain: build/obj/trainer/main.o $(LIB_OBJ)
	$(CC) $^ -o $@ $(LDLIBS)

# The programs that link the library: each one's object from its folder, one link rule.
$(TEST_BIN): build/tests/%: build/obj/tests/unit/%.o
$(TOOL_BIN): build/tests/%: build/obj/tests/reference/%.o
$(MPI_CPU_BIN): build/tests/%: build/obj/tests/mpi/%.o
build/tests/mpi_gpu_nccl: build/obj/tests/sim/mpi_gpu_nccl.o
$(TEST_BIN) $(TOOL_BIN) $(MPI_CPU_BIN) build/tests/mpi_gpu_nccl: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDLIBS)

# The GPU programs link the objects they call (GPU_OBJ), not the library.
$(GPU_BIN): build/tests/gpu_%: build/obj/tests/sim/gpu_%.o $(GPU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(GPU_LDLIBS)

build/cuda/obj/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DMTRAIN_CUDA -c $< -o $@

build/cuda/mtrain: build/cuda/obj/trainer/main.o $(CUDA_LIB_OBJ) $(CU_OBJ)
	$(CC) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

# The CUDA backend's device communicators (dist/comm_device.c) use NCCL.
build/cuda/mtrain build/tests/gpu_test_backend build/tests/gpu_test_attention_op: GPU_LDLIBS += -lnccl

# The backend's test, and the attention op's (its ring, ring_cuda.c, and the CPU backend's op to compare with).
build/tests/gpu_test_backend build/tests/gpu_test_attention_op: build/tests/%: build/cuda/obj/tests/sim/%.o \
    $(CUDA_LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS)

# The ring test on GPUs: the library's CUDA build (the attention op and its ring), NCCL.
build/tests/mpi_gpu_ring: build/cuda/obj/tests/sim/mpi_gpu_ring.o $(CUDA_LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDLIBS) $(GPU_LDLIBS) -lnccl

# Benchmarks: scripts/bench_NAME.c -> build/bench/bench_NAME (scripts/bench_*.sh run them).
build/bench/%: build/obj/scripts/%.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDLIBS)

ifeq ($(SANITIZE),1)
test: build-san $(filter-out build/tests/mpi_gpu_%,$(MPI_TEST_BIN))
	@$(SAN_ENV) MTRAIN_BUILD=build/san bash tests/run.sh
else
test: all
	@bash tests/run.sh
endif

demo: build/mtrain
	@bash scripts/demo.sh

build-test-gpu:
	@test -n "$(NVCC)" || { echo "make: build-test-gpu needs nvcc (none on PATH or in /usr/local/cuda)"; exit 1; }
	$(MAKE) DEPS_OK= $(GPU_BIN) $(CUDA_BIN)

test-gpu: build-test-gpu
	@st=0; for t in build/tests/gpu_test_*; do echo "== $$t"; $$t || st=1; done; exit $$st

# ---- the CPU execution model of CUDA (tests/sim/cudasim/, docs/SIM.md) ----
# The .cu files compiled by g++ with the sim's headers first on the include
# path; the C objects again with -DMTRAIN_CUDA against the sim's runtime
# header; the sim itself (every tests/sim/cudasim/*.cpp) as a static library.
# Binaries export their symbols (-rdynamic): the sim names kernels in its
# messages through dladdr. The sparse sources need the sim's CUB subset
# (tests/sim/cudasim/include/cub/cub.cuh) and are built when it is present.
SIM_INC = -Itests/sim/cudasim/include -Itests/sim/cudasim
SIM_CXXFLAGS = -O2 -g $(ARCH) -std=c++17 -fopenmp -fno-strict-aliasing -Wall -Wextra -Wno-unknown-pragmas -MMD -MP \
               -D__CUDASIM__ $(SIM_INC)
# -g: the sim names the call sites of host synchronisations from the debug information (cudasim_host_syncs).
SIM_CFLAGS = -Itests/sim/cudasim/include $(filter-out -DMTRAIN_CUDA -I$(CUDA_HOME)/include,$(CFLAGS)) -DMTRAIN_CUDA -g
SIM_LIB_SRC = $(wildcard tests/sim/cudasim/*.cpp)
SIM_LIB = build/sim/libcudasim.a
# The sim's NCCL over MPI (tests/sim/cudasim/mpi/), linked into the MPI programs
# (mtrain and the tests that link the library: the device communicators).
SIM_NCCL_OBJ = build/sim/obj/tests/sim/cudasim/mpi/nccl.o
SIM_HAS_CUB = $(wildcard tests/sim/cudasim/include/cub/cub.cuh)
SIM_CU_NO_CUB = attention/kernels/flash_cuda.cu attention/kernels/flash_sm90.cu attention/kernels/flash_sm90_backward.cu \
                attention/kernels/flash_sm90_sparse.cu model/matmul_cuda.cu
SIM_CU_SRC = $(SIM_CU_NO_CUB) $(if $(SIM_HAS_CUB),$(filter-out $(SIM_CU_NO_CUB),$(CU_SRC)))
SIM_CU_OBJ = $(SIM_CU_SRC:%.cu=build/sim/obj/%.cu.o)
SIM_LDLIBS = $(filter-out -lcudart -lcublasLt -lnccl,$(LDLIBS)) -lstdc++ -ldl -rdynamic
SIM_GPU_LDLIBS = -lstdc++ -lm -ldl -fopenmp -rdynamic
SIM_GPU_OBJ = build/sim/obj/dist/util.o build/sim/obj/attention/kernels/flash_cpu.o build/sim/obj/attention/layout.o \
              build/sim/obj/attention/kernels/sparse_flash_cpu.o build/sim/obj/attention/sparse/sparse_index.o \
              build/sim/obj/attention/kernels/kernel_counts.o build/sim/obj/attention/kernels/kernel_cost.o \
              $(filter-out build/sim/obj/attention/op/%,$(SIM_CU_OBJ))
SIM_GPU_TESTS = build/sim/tests/gpu_test_attention build/sim/tests/gpu_test_matmul build/sim/tests/gpu_test_sm90 \
                $(if $(SIM_HAS_CUB),build/sim/tests/gpu_test_sparse build/sim/tests/gpu_test_counts build/sim/tests/gpu_test_attention_op build/sim/tests/gpu_test_ops \
                build/sim/tests/gpu_test_backend)
SIM_BIN = $(SIM_GPU_TESTS) $(SIM_GPU_TESTS:%=%_asan) build/sim/tests/sim_selftest build/sim/tests/sim_selftest_asan \
          $(if $(SIM_HAS_CUB),build/sim/mtrain)

build-sim: $(SIM_BIN) build/sim/launch_bounds.tsv

# The kernels' __launch_bounds__ for the sim (mangled name, max threads per
# block): the .maxntid lines of nvcc's PTX for sm_80. Without nvcc the table
# is empty and the sim checks the device's 1024 threads only.
build/sim/launch_bounds.tsv: $(CU_SRC)
	@mkdir -p build/sim/ptx
	printf 'kernel\tmax_threads\n' > $@.tmp
	set -e; if [ -n "$(NVCC)" ]; then for f in $(CU_SRC); do \
	  ptx=build/sim/ptx/$$(basename $$f .cu).ptx; \
	  $(NVCC) -O3 -std=c++17 -arch=compute_80 -ptx $$f -o $$ptx; \
	  awk '/\.entry/ { for (i = 1; i < NF; i++) if ($$i == ".entry") name = $$(i + 1); sub(/\(.*/, "", name) } \
	       /\.maxntid/ { gsub(",", " "); print name "\t" $$2 * $$3 * $$4 }' $$ptx >> $@.tmp; \
	done; fi
	mv $@.tmp $@

build/sim/obj/%.cu.o: %.cu $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(SIM_CXXFLAGS) -x c++ -c $< -o $@

build/sim/obj/tests/sim/cudasim/%.o: tests/sim/cudasim/%.cpp $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(SIM_CXXFLAGS) -DCUDASIM_LAUNCH_BOUNDS_FILE='"$(abspath build/sim/launch_bounds.tsv)"' -c $< -o $@

build/sim/obj/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(SIM_CFLAGS) -c $< -o $@

$(SIM_LIB): $(SIM_LIB_SRC:%.cpp=build/sim/obj/%.o)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

build/sim/tests/gpu_%: build/sim/obj/tests/sim/gpu_%.o $(SIM_GPU_OBJ) $(SIM_LIB)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(SIM_GPU_LDLIBS)

# The attention op's test compares with the CPU backend's op: it links the library and its libraries, and
# the CUDA op (over its ring: MPI), which the other GPU programs do not link.
SIM_OP_OBJ = $(filter build/sim/obj/attention/op/%,$(SIM_CU_OBJ))
build/sim/tests/gpu_test_attention_op build/sim/tests/gpu_test_backend: $(LIB_SRC:%.c=build/sim/obj/%.o) \
    $(SIM_OP_OBJ) $(SIM_NCCL_OBJ)
build/sim/tests/gpu_test_attention_op build/sim/tests/gpu_test_backend: SIM_GPU_LDLIBS = $(SIM_LDLIBS)

build/sim/tests/sim_%: build/sim/obj/tests/sim/sim_%.cu.o build/sim/obj/dist/util.o $(SIM_LIB)
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(SIM_GPU_LDLIBS)

# The self-test and the sim once more with AddressSanitizer (out-of-bounds device accesses).
SIM_ASAN = -fsanitize=address -fno-omit-frame-pointer
build/sim/asan/%.cu.o: %.cu $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(SIM_CXXFLAGS) $(SIM_ASAN) -x c++ -c $< -o $@

build/sim/asan/%.o: %.cpp $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CXX) $(SIM_CXXFLAGS) $(SIM_ASAN) -c $< -o $@

build/sim/asan/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(SIM_CFLAGS) $(SIM_ASAN) -c $< -o $@

build/sim/tests/sim_selftest_asan: build/sim/asan/tests/sim/sim_selftest.cu.o build/sim/asan/dist/util.o \
                                   $(SIM_LIB_SRC:%.cpp=build/sim/asan/%.o)
	@mkdir -p $(dir $@)
	$(CXX) $(SIM_ASAN) $^ -o $@ $(SIM_GPU_LDLIBS)

build/sim/tests/gpu_%_asan: build/sim/asan/tests/sim/gpu_%.o $(SIM_GPU_OBJ:build/sim/obj/%=build/sim/asan/%) \
                            $(SIM_LIB_SRC:%.cpp=build/sim/asan/%.o)
	@mkdir -p $(dir $@)
	$(CC) $(SIM_ASAN) $^ -o $@ $(SIM_GPU_LDLIBS)

build/sim/tests/gpu_test_attention_op_asan build/sim/tests/gpu_test_backend_asan: $(LIB_SRC:%.c=build/sim/asan/%.o) \
    $(SIM_OP_OBJ:build/sim/obj/%=build/sim/asan/%) $(SIM_NCCL_OBJ:build/sim/obj/%=build/sim/asan/%)
build/sim/tests/gpu_test_attention_op_asan build/sim/tests/gpu_test_backend_asan: SIM_GPU_LDLIBS = $(SIM_LDLIBS)

build/sim/mtrain: build/sim/obj/trainer/main.o $(LIB_SRC:%.c=build/sim/obj/%.o) $(SIM_CU_OBJ) $(SIM_NCCL_OBJ) $(SIM_LIB)
	$(CC) $^ -o $@ $(SIM_LDLIBS)

# The CUDA attention op over a cp ring against one GPU (tests/sim/test_cuda_ring.sh runs it under mpirun).
ifneq ($(SIM_HAS_CUB),)
build-sim: build/sim/tests/mpi_gpu_ring
endif
build/sim/tests/mpi_gpu_ring: build/sim/obj/tests/sim/mpi_gpu_ring.o $(LIB_SRC:%.c=build/sim/obj/%.o) $(SIM_CU_OBJ) \
                              $(SIM_NCCL_OBJ) $(SIM_LIB)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(SIM_LDLIBS)

# ---- the sim's library subsets: cuBLASLt, CUB, NCCL (tests/sim/cudasim/, docs/SIM.md) ----
# Their test programs, natively (with nvcc) against the real libraries and
# in build/sim/ against the subsets; tests/sim/test_sim_libs.sh runs the sim ones.
SIM_LIBS_BIN = build/sim/tests/gpu_test_cublaslt build/sim/tests/gpu_test_cub build/sim/tests/mpi_gpu_nccl
build-sim: $(SIM_LIBS_BIN)

OPENBLAS_LDLIBS = -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
build/tests/gpu_test_cublaslt: GPU_LDLIBS += $(OPENBLAS_LDLIBS)
build/tests/gpu_test_cub: build/obj/tests/sim/gpu_cub.cu.o
# NCCL over MPI: outside the sim library (its programs need no MPI), linked into the MPI programs.
build/sim/obj/tests/sim/cudasim/mpi/nccl.o build/sim/asan/tests/sim/cudasim/mpi/nccl.o: SIM_CXXFLAGS += $(shell mpicc --showme:compile)

# In the sim, each links only what it calls (not the attention kernels).
build/sim/tests/gpu_test_cublaslt: build/sim/obj/tests/sim/gpu_test_cublaslt.o build/sim/obj/dist/util.o $(SIM_LIB)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(SIM_GPU_LDLIBS) $(OPENBLAS_LDLIBS)

build/sim/tests/gpu_test_cub: build/sim/obj/tests/sim/gpu_test_cub.o build/sim/obj/tests/sim/gpu_cub.cu.o \
                              build/sim/obj/dist/util.o $(SIM_LIB)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(SIM_GPU_LDLIBS)

build/sim/tests/mpi_gpu_nccl: build/sim/obj/tests/sim/mpi_gpu_nccl.o $(SIM_NCCL_OBJ) \
                              build/sim/obj/dist/comm.o build/sim/obj/dist/util.o $(SIM_LIB)
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(SIM_LDLIBS)

test-sim: build-sim
	@bash tests/sim/test_sim.sh

# ---- make test SANITIZE=1: AddressSanitizer, UndefinedBehaviorSanitizer and
# LeakSanitizer over the library, build/san/mtrain and the test programs, all
# in build/san/ (never mixed with build/obj/). Any report ends the program
# with a non-zero status and goes to its stderr, which the runner logs (UBSan
# does not recover; gcc's UBSan has no log file of its own). Open MPI's own
# leaks are suppressed (tests/lib/sanitize.supp): allocation stacks are unwound
# in full (fast_unwind_on_malloc=0), so that they reach the Open MPI library
# that called a plugin (PMIx, hwloc) unloaded before the leak check.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SAN_CFLAGS = $(filter-out -O3,$(CFLAGS)) -O2 -g $(SAN_FLAGS)
SAN_LIB_OBJ = $(LIB_SRC:%.c=build/san/obj/%.o)
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
          LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lib/sanitize.supp:print_suppressions=0 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
.PHONY: build-san
build-san: build/san/mtrain $(TEST_BIN:build/%=build/san/%)

build/san/obj/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(SAN_CFLAGS) -c $< -o $@

build/san/mtrain: build/san/obj/trainer/main.o $(SAN_LIB_OBJ)
	$(CC) $(SAN_FLAGS) $^ -o $@ $(LDLIBS)

build/san/tests/%: build/san/obj/tests/unit/%.o $(SAN_LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(SAN_FLAGS) $^ -o $@ $(LDLIBS)

# ---- libFuzzer targets (tests/fuzz/, docs/PERFORMANCE.md "Fuzzing") ----
# Each reader of untrusted files under clang's libFuzzer with ASan and UBSan:
# build/fuzz/fuzz_NAME from tests/fuzz/fuzz_NAME.c, the harness tests/fuzz/fuzz.c
# and the library compiled again into build/fuzz/obj/. `make fuzz` seeds each
# corpus (build/fuzz/corpus/NAME) and runs every target FUZZ_RUNS times, one
# after another, from libFuzzer seed FUZZ_SEED: fixed by default, so that a
# run (CI's) is repeatable from the same corpus; FUZZ_SEED=0 draws a new one. At -O1 under the sanitizers clang does not vectorize the
# kernels' `omp simd` loops, which it reports as a failed pass: not a defect
# of the fuzzed readers, so that warning is off here.
FUZZ_RUNS ?= 1000000
FUZZ_SEED ?= 1
FUZZ_CFLAGS = $(filter-out -O3 $(ARCH),$(CFLAGS)) -O1 -g -fno-omit-frame-pointer \
              -fsanitize=address,undefined -fno-sanitize-recover=undefined -Wno-pass-failed
FUZZ_WRAP = -Wl,--wrap=exit,--wrap=fopen,--wrap=fclose,--wrap=mmap,--wrap=munmap
FUZZ_NAMES = $(filter-out seeds,$(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_BIN = $(FUZZ_NAMES:%=build/fuzz/fuzz_%)
FUZZ_LIB_OBJ = $(LIB_SRC:%.c=build/fuzz/obj/%.o)

.PHONY: build-fuzz fuzz
build-fuzz: $(FUZZ_BIN) build/fuzz/fuzz_seeds

build/fuzz/obj/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

build/fuzz/fuzz_%: build/fuzz/obj/tests/fuzz/fuzz_%.o build/fuzz/obj/tests/fuzz/fuzz.o $(FUZZ_LIB_OBJ)
	clang -fsanitize=fuzzer,address,undefined $(FUZZ_WRAP) $^ -o $@ $(LDLIBS)

build/fuzz/fuzz_seeds: build/fuzz/obj/tests/fuzz/fuzz_seeds.o $(FUZZ_LIB_OBJ)
	clang -fsanitize=fuzzer-no-link,address,undefined $^ -o $@ $(LDLIBS)

fuzz: build-fuzz
	@failed=; for name in $(FUZZ_NAMES); do bash tests/fuzz/run.sh $$name $(FUZZ_RUNS) $(FUZZ_SEED) || failed="$$failed $$name"; done; \
	if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed (inputs in build/fuzz/crashes/)"; exit 1; fi

# ---- make gpu-bundle: the GPU programs for a GPU machine that lacks the project's libraries ----
# build/bundle/bin/: mtrain with the CUDA backend, the GPU test programs and
# the GPU benchmarks, for sm_80 and sm_90 (the CUDA objects of build/obj/,
# CUDA_ARCHS), their C objects compiled again into build/bundle/obj/ for any
# x86-64-v3 CPU against the single-rank MPI (dist/mpi_single/: one process,
# no mpirun; docs/DECISIONS.md), from one archive so that each program links
# only what it calls. Linked statically: the CUDA runtime, OpenMP,
# OpenBLAS (and its Fortran runtime), libyaml, zstd, PCRE2 and utf8proc;
# cJSON (Debian ships no .a) beside them in lib/ (rpath $ORIGIN/../lib);
# cuBLASLt and NCCL at run time from PyTorch's wheels (the bundle's launcher
# sets LD_LIBRARY_PATH). scripts/gpu_bundle.sh packs gpu-bundle/ from them.
BUNDLE_CFLAGS = -O3 -march=x86-64-v3 -std=gnu11 -fopenmp -Wall -Wextra -MMD -MP -DMTRAIN_CUDA -Idist/mpi_single \
                -I/usr/include/x86_64-linux-gnu/openblas-openmp -I$(CUDA_HOME)/include
BUNDLE_BIN = build/bundle/bin/mtrain \
             $(patsubst tests/sim/%.c,build/bundle/bin/%,$(wildcard tests/sim/gpu_test_*.c tests/sim/gpu_bench_*.c \
                                                                     tests/sim/gpu_sweep_*.c))
BUNDLE_ARCHIVE = build/bundle/libmtrain.a
BUNDLE_LDLIBS = -Wl,--as-needed -L$(CUDA_HOME)/lib64 -lcublasLt -lnccl -lcudart_static $(BLAS_DIR)/libopenblas.a \
                -Wl,-Bstatic -lyaml -lzstd -lpcre2-8 -lutf8proc -lgfortran -lquadmath -lgomp -Wl,-Bdynamic \
                -Lbuild/bundle/lib -lcjson -Wl,-rpath,'$$ORIGIN/../lib' -lstdc++ -lm -ldl -lrt -lpthread

.PHONY: gpu-bundle
gpu-bundle: gpu-bundle/mtrain-gpu.tar.gz
	@bash scripts/gpu_bundle.sh --size

gpu-bundle/mtrain-gpu.tar.gz: $(BUNDLE_BIN) scripts/gpu_bundle.sh scripts/gpu_bundle_launch.sh scripts/gpu_bundle_unpack.sh \
                              scripts/gpu_check.sh scripts/bench_attention.sh scripts/bench_attention.py \
                              scripts/bench_train.sh scripts/bench_train_hf.py $(wildcard configs/*.yaml) README.md \
                              $(wildcard docs/*.md)
	@bash scripts/gpu_bundle.sh

build/bundle/obj/%.o: %.c $(DEPS_OK)
	@mkdir -p $(dir $@)
	$(CC) $(BUNDLE_CFLAGS) -c $< -o $@

$(BUNDLE_ARCHIVE): $(LIB_SRC:%.c=build/bundle/obj/%.o) build/bundle/obj/dist/mpi_single/mpi_single.o \
                   $(CU_SRC:%.cu=build/obj/%.cu.o) build/obj/tests/sim/gpu_cub.cu.o \
                   build/obj/tests/sim/gpu_sweep_micro.cu.o
	rm -f $@ && $(AR) rcs $@ $^

build/bundle/lib/libcjson.so: /usr/lib/x86_64-linux-gnu/libcjson.so
	@mkdir -p $(dir $@)
	cp -L $< $@.1 && ln -sf libcjson.so.1 $@

build/bundle/bin/mtrain: build/bundle/obj/trainer/main.o $(BUNDLE_ARCHIVE) build/bundle/lib/libcjson.so
	@mkdir -p $(dir $@)
	$(CC) $< $(BUNDLE_ARCHIVE) -o $@ $(BUNDLE_LDLIBS)

build/bundle/bin/gpu_%: build/bundle/obj/tests/sim/gpu_%.o $(BUNDLE_ARCHIVE) build/bundle/lib/libcjson.so
	@mkdir -p $(dir $@)
	$(CC) $< $(BUNDLE_ARCHIVE) -o $@ $(BUNDLE_LDLIBS)

# The single-rank MPI against MPI's semantics (tests/repo/test_gpu_bundle.sh runs it).
build/bundle/tests/single_rank_mpi: build/bundle/obj/tests/repo/single_rank_mpi.o $(BUNDLE_ARCHIVE)
	@mkdir -p $(dir $@)
	$(CC) $< $(BUNDLE_ARCHIVE) -o $@ $(BUNDLE_LDLIBS)

# scripts/gpu_check.sh --sim (tests/sim/test_gpu_check.sh) runs the attention benchmark under the sim too.
build-sim: build/sim/tests/gpu_bench_attention

# The sweep of the attention kernel variants (its micro-benchmark kernels beside it), on a GPU and in the sim
# (the sparse variants need the sim's CUB subset).
build/tests/gpu_sweep_attention: build/obj/tests/sim/gpu_sweep_micro.cu.o
build/sim/tests/gpu_sweep_attention: build/sim/obj/tests/sim/gpu_sweep_micro.cu.o
build-sim: $(if $(SIM_HAS_CUB),build/sim/tests/gpu_sweep_attention)

clean:
	rm -rf build

-include $(shell find build/obj build/cuda build/sim build/fuzz build/san build/bundle -name '*.d' 2>/dev/null)
