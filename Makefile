# dsv4 — plain make. `make` builds build/libdsv4.a and build/dsv4; `make test` runs every test.
# PORTABLE=1 drops -march=x86-64-v3 (the scalar kernels take over); CUDA=1 adds the CUDA backend,
# with NCCL (several GPUs) where nccl.h is found (NCCL=0: without).

CC      ?= cc
BUILD   ?= build
HAVE_AVX2 := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo 2>/dev/null && echo 1)
ifeq ($(PORTABLE),1)
ARCH :=
else ifeq ($(HAVE_AVX2),1)
ARCH := -march=x86-64-v3
else
ARCH :=
endif

CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp $(ARCH) -Iinclude -Isrc -MMD -MP
LDLIBS  += -fopenmp -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lpthread -lm

LIB_SRC := $(wildcard src/core/*.c src/io/*.c src/kernels/*.c src/kernels/cpu/*.c src/model/*.c src/text/*.c src/serve/*.c)
CLI_SRC := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/unit/test_*.c)

ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCC     ?= nvcc
NVFLAGS  ?= -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc \
            -Xcompiler -Wall,-Wextra -MMD -MP
CU_SRC   := $(wildcard src/kernels/cuda/*.cu)
CU_C_SRC := $(wildcard src/kernels/cuda/*.c)
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o) $(CU_C_SRC:%.c=$(BUILD)/%.o)
CFLAGS   += -DDSV4_CUDA
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lstdc++
# NCCL (several GPUs, docs/multigpu.md): on where its header is found; NCCL=0 leaves it out
NCCL ?= $(shell test -f $(CUDA_HOME)/include/nccl.h && echo 1)
ifeq ($(NCCL),1)
NVFLAGS  += -DDSV4_NCCL
LDLIBS   += -L$(CUDA_HOME)/lib -lnccl
endif
CUDA_TEST_BIN := $(BUILD)/tests/cuda/test_cuda_ops $(BUILD)/tests/cuda/test_cuda_ranks $(BUILD)/tests/cuda/test_cuda_exl3 $(BUILD)/tests/cuda/bench_cuda
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_OBJ)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

all: $(BUILD)/libdsv4.a $(BUILD)/dsv4 $(TEST_BIN) $(CUDA_TEST_BIN)

$(BUILD)/libdsv4.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/dsv4: $(CLI_OBJ) $(BUILD)/libdsv4.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libdsv4.a $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libdsv4.a tests/unit/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(BUILD)/libdsv4.a $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/cuda/%: tests/cuda/%.c $(BUILD)/libdsv4.a tests/unit/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -Itests/unit -o $@ $< $(BUILD)/libdsv4.a $(LDLIBS)

$(BUILD)/tests/cuda/%.o: tests/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/cuda/bench_cuda: $(BUILD)/tests/cuda/bench_cuda.o $(BUILD)/libdsv4.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libdsv4.a $(LDLIBS)

test: all
	tests/run.sh

# The main job: the default model (models/mini) answers a fixed question, streamed.
run: $(BUILD)/dsv4
	$(BUILD)/dsv4 chat --once "What does ephemeral mean?" --temperature 0

# A random-weight checkpoint in the release layout (real vocabulary, every layer kind), then
# greedy generation.
demo: all
	$(BUILD)/dsv4 synth --preset tiny -o $(BUILD)/tiny
	$(BUILD)/dsv4 info -m $(BUILD)/tiny
	$(BUILD)/dsv4 generate -m $(BUILD)/tiny --ids 0,19923,14,2058,223 -n 24

# On a machine with a GPU: the op-by-op comparisons (test_cuda_ops; test_backend_ops, every op of
# the table against the CPU), then every fixture through the CUDA backend
# with device outputs poisoned. bench-cuda: the linear kernels against the copy bandwidth.
ifeq ($(CUDA),1)
# The spill runs give each fixture a device budget of its hot path plus a few experts (sizes
# from tests/unit/test_place.c), so most routed experts are read from pinned host memory;
# a budget under the hot path must be refused.
FIX = tests/fixtures
test-cuda: all
	$(BUILD)/tests/cuda/test_cuda_ops
	DSV4_TEST_DEVICE=cuda $(BUILD)/tests/test_backend_ops
	$(BUILD)/tests/cuda/test_cuda_exl3
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_POISON=1 $(BUILD)/tests/test_v4_fixtures
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_POISON=1 $(BUILD)/tests/test_v41_fixtures
	DSV4_TEST_DEVICE=cuda $(BUILD)/tests/test_batch
	DSV4_TEST_DEVICE=cuda $(BUILD)/tests/test_lanes
	DSV4_TEST_DEVICE=cuda $(BUILD)/tests/test_mini
	DSV4_TEST_DEVICE=cuda $(BUILD)/tests/test_draft
	DSV4_TEST_DEVICE=cuda $(BUILD)/tests/test_kv
	DSV4_TEST_DEVICE=cuda DSV4_TEST_KV=production $(BUILD)/tests/test_lanes
	bash tests/cuda/draft_cuda.sh $(BUILD)
	bash tests/cuda/serve_cuda.sh $(BUILD)
	$(BUILD)/tests/cuda/test_cuda_ranks
	bash tests/cuda/ranks_cuda.sh $(BUILD)
	DSV4_CUDA_TC=1 $(BUILD)/tests/cuda/test_cuda_ops
	DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 $(BUILD)/tests/cuda/test_cuda_ops
	for v in 5 6; do DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 DSV4_CUDA_WG_V=$$v $(BUILD)/tests/cuda/test_cuda_ops || exit 1; done
	DSV4_CUDA_TC=1 DSV4_CUDA_WG=1 DSV4_CUDA_WG_P=3 $(BUILD)/tests/cuda/test_cuda_ops
	DSV4_CUDA_TC=1 DSV4_CUDA_WG=0 $(BUILD)/tests/cuda/test_cuda_ops
	DSV4_CUDA_TC=1 $(BUILD)/tests/cuda/test_cuda_ranks
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 DSV4_CUDA_POISON=1 $(BUILD)/tests/test_v4_fixtures
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 DSV4_CUDA_POISON=1 $(BUILD)/tests/test_v41_fixtures
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 $(BUILD)/tests/test_batch
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 $(BUILD)/tests/test_lanes
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 $(BUILD)/tests/test_mini
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 $(BUILD)/tests/test_draft
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=1 $(BUILD)/tests/test_kv
	DSV4_CUDA_TC=0 $(BUILD)/tests/cuda/test_cuda_ops
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=0 $(BUILD)/tests/test_backend_ops
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=0 DSV4_CUDA_POISON=1 $(BUILD)/tests/test_v4_fixtures
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_TC=0 $(BUILD)/tests/test_kv
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_BUDGET=2.45M $(BUILD)/tests/test_v4_fixtures $(FIX)/v4/v4-tiny-a
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_BUDGET=1.85M $(BUILD)/tests/test_v4_fixtures $(FIX)/v4/v4-tiny-b
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_BUDGET=9.004M $(BUILD)/tests/test_v4_fixtures $(FIX)/v4/v4-tiny-v
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_BUDGET=2.2M $(BUILD)/tests/test_v41_fixtures $(FIX)/v41/v41-tiny-a
	DSV4_TEST_DEVICE=cuda DSV4_CUDA_BUDGET=1M $(BUILD)/tests/test_v4_fixtures $(FIX)/v4/v4-tiny-a 2>&1 | grep "the hot path does not fit"

bench-cuda: all
	$(BUILD)/tests/cuda/bench_cuda
else
test-cuda bench-cuda:
	@echo "$@ needs the CUDA build: make CUDA=1 $@" >&2; exit 2
endif

.PHONY: all test run demo test-cuda bench-cuda clean
clean:
	rm -rf $(BUILD) $(FUZZ_REQ_BUILD)

# fuzz: request — libFuzzer on the server's request parser (tests/fuzz/fuzz_request.c over
# dsv4_serve_parse), the library rebuilt by clang with AddressSanitizer and UBSan in a folder of
# its own. `make fuzz-request` runs FUZZ_SECONDS (20) from the committed corpus
# tests/fuzz/corpus/request (new finds go to $(FUZZ_REQ_BUILD)/corpus, not the repository; a
# crashing input to $(FUZZ_REQ_BUILD)/crash-*); longer: make fuzz-request FUZZ_SECONDS=3600.
FUZZ_REQ_BUILD ?= build-fuzz-request
FUZZ_CC        ?= clang
FUZZ_SECONDS   ?= 20
FUZZ_REQ_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
                   -std=c11 -D_GNU_SOURCE -fopenmp $(ARCH) -Iinclude -Isrc -MMD -MP
FUZZ_REQ_OBJ := $(LIB_SRC:%.c=$(FUZZ_REQ_BUILD)/%.o)

$(FUZZ_REQ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_REQ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

# the model's arithmetic (checked by the fixture tests) stays optimized and uninstrumented, so
# the sanitized server runs its checks at a useful speed
FUZZ_REQ_PLAIN_CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -fopenmp $(ARCH) -Iinclude -Isrc -MMD -MP
$(FUZZ_REQ_BUILD)/src/kernels/%.o: src/kernels/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_REQ_PLAIN_CFLAGS) -c -o $@ $<
$(FUZZ_REQ_BUILD)/src/model/%.o: src/model/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_REQ_PLAIN_CFLAGS) -c -o $@ $<

$(FUZZ_REQ_BUILD)/fuzz_request: tests/fuzz/fuzz_request.c $(FUZZ_REQ_OBJ)
	$(FUZZ_CC) $(FUZZ_REQ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_REQ_OBJ) $(LDLIBS)

# the same objects as a whole server, for tests/suite_serve_asan.sh
FUZZ_REQ_CLI_OBJ := $(CLI_SRC:%.c=$(FUZZ_REQ_BUILD)/%.o)
$(FUZZ_REQ_BUILD)/dsv4: $(FUZZ_REQ_CLI_OBJ) $(FUZZ_REQ_OBJ)
	$(FUZZ_CC) $(FUZZ_REQ_CFLAGS) -fsanitize=fuzzer-no-link -o $@ $(FUZZ_REQ_CLI_OBJ) $(FUZZ_REQ_OBJ) $(LDLIBS)

fuzz-request: $(FUZZ_REQ_BUILD)/fuzz_request
	@mkdir -p $(FUZZ_REQ_BUILD)/corpus
	ASAN_OPTIONS=detect_leaks=1 $(FUZZ_REQ_BUILD)/fuzz_request -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 \
	    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=$(FUZZ_REQ_BUILD)/ \
	    -dict=tests/fuzz/request.dict $(FUZZ_REQ_BUILD)/corpus tests/fuzz/corpus/request

.PHONY: fuzz-request
-include $(FUZZ_REQ_OBJ:.o=.d) $(FUZZ_REQ_CLI_OBJ:.o=.d)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

# fuzz — libFuzzer targets tests/fuzz/fuzz_<name>.c, each linked against the library built with
# ASan and UBSan in $(FUZZ_BUILD) (clang: Debian packages clang, libclang-rt-dev, libomp-dev).
# `make fuzz` builds them and runs each for FUZZ_SECONDS over its corpus tests/fuzz/corpus/<name>;
# tests/suite_fuzz.sh (run by `make test`) does the same for a shorter time. docs/fuzz.md.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 20
FUZZ_CFLAGS  := -O1 -g -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Iinclude -Isrc -MMD -MP \
                -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LIB_OBJ := $(filter %.c,$(LIB_SRC))
FUZZ_LIB_OBJ := $(FUZZ_LIB_OBJ:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_BIN     := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(wildcard tests/fuzz/fuzz_*.c))

fuzz-build: $(FUZZ_BIN)

fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_NO_BUILD=1 tests/suite_fuzz.sh

$(FUZZ_BUILD)/libdsv4.a: $(FUZZ_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BUILD)/src/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_BUILD)/libdsv4.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libdsv4.a $(LDLIBS)

.PHONY: fuzz fuzz-build
-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_BIN:=.d)
