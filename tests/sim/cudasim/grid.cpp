// grid.cpp: execution of a kernel grid on the CPU. A grid is a set of blocks
// run in a seeded order, on several OpenMP threads; a block's threads are
// fibers (fiber.h) that run until they reach a barrier or a warp collective
// or exit. A warp collective completes when every lane of its mask waits at
// the same operation, __syncthreads when every thread of the block waits
// there; when nothing can run or complete, the state is a rule violation (one
// line, exit 1, never a hang). Each phase between barriers is scheduled from
// CUDASIM_SEED (run_block). Also here: shared memory (poisoned), cp.async,
// ldmatrix, mma.sync, the hardware's launch checks, and the work each kernel
// passes through them counted by kernel name (cudasim_kernel_counts), the
// shared-memory wavefronts of ldmatrix and cp.async included; and the Hopper
// operations: mbarrier phases, bulk and tensor copies landing when their
// phase completes, wgmma on a warpgroup with its accumulators held until the
// wait_group, setmaxnreg.
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <cxxabi.h>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "cudasim.h"
#include "fiber.h"
#include "runtime.h"

namespace cudasim {

thread_local ThreadState *current = nullptr;

// What a thread waits at.
enum Wait {
    RUNNABLE,
    AT_SYNCTHREADS,
    AT_WARP_OP,
    AT_MBARRIER,                // mbarrier.try_wait on a phase not yet complete
    EXITED
};

// Warp operations; two lanes take part in the same collective when kind (and its variant) and mask match.
// OP_WGMMA and OP_SETMAXNREG are warpgroup collectives: the 128 threads of 4 warps 4i..4i+3.
enum WarpOp { OP_SYNCWARP, OP_SHUFFLE, OP_VOTE, OP_LDMATRIX, OP_MMA, OP_WGMMA, OP_SETMAXNREG };
static const char *warp_op_name(int op) {
    static const char *names[] = {"__syncwarp", "__shfl*_sync", "__ballot/__any/__all_sync", "ldmatrix", "mma.sync",
                                  "wgmma.mma_async", "setmaxnreg"};
    return names[op];
}

struct PendingCopy {
    void *dst;
    unsigned char data[16];
    int64_t group;
};

// Work counted per block, summed per kernel name when the block ends.
enum CountKind { COUNT_MMA, COUNT_LDMATRIX_BYTES, COUNT_CP_ASYNC_BYTES, COUNT_SHUFFLES, COUNT_BARRIERS,
                 COUNT_ATOMICS, COUNT_LDMATRIX_WAVEFRONTS, COUNT_LDMATRIX_WAVEFRONTS_MIN, COUNT_CP_ASYNC_WAVEFRONTS,
                 COUNT_CP_ASYNC_WAVEFRONTS_MIN, COUNT_WGMMA, COUNT_WGMMA_FLOPS, COUNT_TMA_BYTES, COUNT_MBARRIER_WAITS,
                 COUNT_KINDS };

// A thread's accumulators of a wgmma.mma_async not yet covered by a wgmma.wait_group: the results, held
// here while the registers at d hold poison.
struct PendingAccumulator {
    float *d;
    std::vector<float> values;
    int64_t group;              // the wgmma group it belongs to (the thread's commit count at issue)
};

// The shared-memory operands a wgmma.mma_async read, as read: the last of its warpgroup's threads to wait for
// it reads them again, and they must not have changed.
struct WgmmaOperands {
    uint64_t a_desc, b_desc;    // a_desc 0: A came from registers
    int n;
    bool b_mn_major;
    std::vector<float> a, b;
    int waiting;                // threads of the warpgroup that have not waited for it yet
};
struct PendingOperands {
    std::shared_ptr<WgmmaOperands> operands;
    int64_t group;
};

// A bulk copy in flight: its bytes complete on bar when no thread of the block can run (bulk copies).
struct BulkCopy {
    uint64_t *bar;
    unsigned char *dst;
    std::vector<unsigned char> data;
};

// Bulk-copy bytes that completed in an mbarrier phase: they land when the phase completes.
struct Landing {
    unsigned char *dst;
    std::vector<unsigned char> data;
};

// An mbarrier object (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"): the
// expected arrival count, the pending arrivals and tx-count of the current phase, the phases completed.
struct MBarrier {
    uint32_t expected = 0, pending = 0;
    int64_t tx = 0;
    uint64_t phase = 0;
    std::vector<Landing> landing;
};

struct Block;

struct Thread {
    ThreadState state;
    Fiber fiber;
    Block *block;
    int linear;                 // threadIdx.x + threadIdx.y * bdx + ...
    Wait wait;
    int op, variant;            // warp operation and its variant (mode, matrix count, ...)
    unsigned mask;
    uint64_t in[8];             // this lane's operands of the collective
    uint64_t out[4];            // its results
    std::vector<PendingCopy> copies;
    int64_t committed;          // cp.async groups committed so far
    int cp_async_issued;        // cp.async calls since the block's last barrier
    uint64_t *mbarrier = nullptr;   // AT_MBARRIER: the barrier and the parity waited for
    unsigned parity = 0;
    std::vector<PendingAccumulator> accumulators;
    std::vector<PendingOperands> wgmma_operands;
    int64_t wgmma_committed = 0;    // wgmma groups committed so far
    bool wgmma_fenced = false;      // a wgmma.fence since the start or the last wgmma.wait_group
};

struct Block {
    const Launch *launch;
    std::vector<Thread> threads;
    Fiber scheduler;
    unsigned char *dynamic_smem;
    struct Static { const void *site; unsigned char *p; size_t bytes; };
    std::vector<Static> statics;
    size_t static_bytes;
    std::mt19937_64 rng;
    uint64_t counts[COUNT_KINDS];
    // Per warp, the shared destinations of its cp.async calls since the last
    // barrier: [k][lane] the k-th call of each lane (0 where the lane made none).
    std::vector<std::vector<std::array<uintptr_t, 32>>> cp_async_dst;
    std::map<uintptr_t, MBarrier> mbarriers;   // by address
    int mbarrier_waiters = 0;
    std::vector<BulkCopy> in_flight;
    std::vector<unsigned> registers;            // per warpgroup, per thread (setmaxnreg)
};

static thread_local Thread *running = nullptr;

// One line naming kernel, block, thread and the broken rule.
[[noreturn]] static void violation(const Thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(const Thread *t, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const ThreadState &s = t->state;
    fail("kernel %s block (%u,%u,%u) thread (%u,%u,%u) warp %d lane %d: %s (CUDASIM_SEED=%llu)",
         t->block->launch->name.c_str(), s.block_idx.x, s.block_idx.y, s.block_idx.z, s.thread_idx.x,
         s.thread_idx.y, s.thread_idx.z, t->linear / 32, t->linear % 32, msg, (unsigned long long)seed());
}

static Thread *self(const char *what) {
    if (!running) fail("%s called outside a kernel", what);
    return running;
}

// Back to the scheduler until released.
static void yield(Thread *t, Wait w) {
    t->wait = w;
    running = nullptr;
    current = nullptr;
    fiber_switch(&t->fiber, &t->block->scheduler, false);
    running = t;
    current = &t->state;
}

// ---- shared memory (CUDA C++ Programming Guide, "Shared Memory"; contents undefined at block start:
// the sim fills every byte with 0xFF, a NaN as fp32 and as bf16) ----

static const unsigned char POISON = 0xff;

static bool in_shared(const Block *b, const void *p, size_t bytes) {
    const unsigned char *c = (const unsigned char *)p;
    if (b->launch->smem > 0 && c >= b->dynamic_smem && c + bytes <= b->dynamic_smem + b->launch->smem) return true;
    for (const Block::Static &s : b->statics)
        if (c >= s.p && c + bytes <= s.p + s.bytes) return true;
    return false;
}

void *shared_dynamic() {
    return self("dynamic shared memory")->block->dynamic_smem;
}

// Static __shared__ arrays: one per declaration site and block. The limit is
// CUDA's: 48 KiB static, static + dynamic within the device's opt-in limit.
void *shared_static(const void *site, size_t bytes, size_t align) {
    Thread *t = self("static shared memory");
    Block *b = t->block;
    for (const Block::Static &s : b->statics)
        if (s.site == site) return s.p;
    b->static_bytes += (bytes + 15) / 16 * 16;
    if (b->static_bytes > STATIC_SMEM_LIMIT ||
        b->static_bytes + b->launch->smem > device_props().sharedMemPerBlockOptin)
        violation(t, "%zu bytes of static shared memory (+ %zu dynamic) exceed the device's limit "
                     "(CUDA C++ Programming Guide, Compute Capabilities: 48 KiB static, %zu in all)",
                  b->static_bytes, b->launch->smem, device_props().sharedMemPerBlockOptin);
    void *p;
    if (posix_memalign(&p, align < 16 ? 16 : align, bytes ? bytes : 1) != 0) fail("out of memory for shared memory");
    memset(p, POISON, bytes);
    b->statics.push_back({site, (unsigned char *)p, bytes});
    return p;
}

// ---- shared-memory wavefronts (CUDA C++ Programming Guide, "Shared Memory" of compute capability 5.x and
// later: 32 banks of 4 bytes, successive 4-byte words in successive banks; the accesses of one request to
// distinct words of one bank are served one after the other, a word read by several threads once). A request
// is served in phases: one ldmatrix matrix (its 8 row addresses of 16 bytes), 8 lanes of a 16-byte access
// (lanes 0-7, 8-15, 16-23, 24-31). A phase takes as many wavefronts as the most distinct words it touches in one
// bank (a bank holds one word of each 128-byte line: the most distinct 128-byte lines in one bank); its
// conflict-free minimum is its distinct words over 32, rounded up ----

static const int BANKS = 32;

// Wavefronts of one phase: n accesses of `bytes` (a multiple of 4) at addr[i] (0: no access), added to
// counts[counted] and its minimum to counts[minimum].
static void count_phase(uint64_t *counts, int counted, int minimum, const uintptr_t *addr, int n, int bytes) {
    uintptr_t words[8 * 4];
    int distinct = 0;
    for (int i = 0; i < n; i++)
        for (int w = 0; addr[i] && w < bytes / 4; w++) {
            const uintptr_t word = addr[i] / 4 + w;
            if (std::find(words, words + distinct, word) == words + distinct) words[distinct++] = word;
        }
    int per_bank[BANKS] = {0}, most = 0;
    for (int i = 0; i < distinct; i++) most = std::max(most, ++per_bank[words[i] % BANKS]);
    counts[counted] += (uint64_t)most;
    counts[minimum] += (uint64_t)(distinct + BANKS - 1) / BANKS;
}

// The cp.async calls since the last barrier: the k-th call of each lane of a warp is one warp instruction
// (the lanes of a warp run the same code), 16 bytes a lane, four phases of 8 lanes.
static void count_cp_async_wavefronts(Block *b) {
    for (auto &warp : b->cp_async_dst) {
        for (const std::array<uintptr_t, 32> &call : warp)
            for (int phase = 0; phase < 4; phase++)
                count_phase(b->counts, COUNT_CP_ASYNC_WAVEFRONTS, COUNT_CP_ASYNC_WAVEFRONTS_MIN,
                            call.data() + 8 * phase, 8, 16);
        warp.clear();
    }
    for (Thread &t : b->threads) t.cp_async_issued = 0;
}

// ---- barriers (CUDA C++ Programming Guide, "Synchronization Functions": __syncthreads waits until every
// thread of the block has reached it; PTX ISA "bar.sync": all threads of the CTA) ----

void syncthreads() {
    yield(self("__syncthreads"), AT_SYNCTHREADS);
}

// A warp collective: post the lane's operands, wait until the scheduler completes it.
static Thread *collective(const char *what, int op, int variant, unsigned mask) {
    Thread *t = self(what);
    if (!(mask >> (t->linear % 32) & 1u))
        violation(t, "%s with mask 0x%08x that leaves out the calling lane (CUDA C++ Programming Guide, "
                     "Warp Shuffle / Vote Functions: the caller must be in mask)", what, mask);
    t->op = op;
    t->variant = variant;
    t->mask = mask;
    return t;
}

void syncwarp(unsigned mask) {
    Thread *t = collective("__syncwarp", OP_SYNCWARP, 0, mask);
    yield(t, AT_WARP_OP);
}

// Without divergence tracking every live lane of the warp counts as active.
unsigned activemask() {
    Thread *t = self("__activemask");
    Block *b = t->block;
    const int w0 = t->linear / 32 * 32;
    unsigned m = 0;
    for (int i = 0; i < 32 && w0 + i < (int)b->threads.size(); i++)
        if (b->threads[w0 + i].wait != EXITED) m |= 1u << i;
    return m;
}

uint64_t shuffle(ShuffleMode mode, unsigned mask, uint64_t value, int lane_arg, int width) {
    Thread *t = collective("__shfl*_sync", OP_SHUFFLE, mode * 64 + width, mask);
    if (width < 1 || width > 32 || (width & (width - 1)))
        violation(t, "shuffle width %d is not a power of two <= 32 (CUDA C++ Programming Guide, "
                     "Warp Shuffle Functions)", width);
    t->in[0] = value;
    t->in[1] = (uint64_t)(int64_t)lane_arg;
    yield(t, AT_WARP_OP);
    return t->out[0];
}

unsigned vote(VoteMode mode, unsigned mask, int predicate) {
    Thread *t = collective("__ballot/__any/__all_sync", OP_VOTE, mode, mask);
    t->in[0] = predicate != 0;
    yield(t, AT_WARP_OP);
    return (unsigned)t->out[0];
}

// ---- ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): lanes 8i..8i+7 give the 16-byte
// row addresses of matrix i; register i of lane l receives row l/4, elements 2(l%4), 2(l%4)+1 of matrix i
// (with .trans: elements (2(l%4), l/4) and (2(l%4)+1, l/4)) ----

void ldmatrix(uint32_t *r, int count, bool trans, const void *smem_row) {
    Thread *t = collective("ldmatrix", OP_LDMATRIX, count * 2 + trans, 0xffffffffu);
    const int lane = t->linear % 32;
    if (lane < 8 * count) {
        if ((uintptr_t)smem_row % 16)
            violation(t, "ldmatrix row address %p is not 16-byte aligned (PTX ISA, ldmatrix)", smem_row);
        if (!in_shared(t->block, smem_row, 16))
            violation(t, "ldmatrix row address %p is not in the block's shared memory (PTX ISA, ldmatrix: .shared)",
                      smem_row);
    }
    t->in[0] = (uint64_t)(uintptr_t)smem_row;
    yield(t, AT_WARP_OP);
    for (int i = 0; i < count; i++) r[i] = (uint32_t)t->out[i];
}

static void complete_ldmatrix(Thread *const *lane, int count, bool trans, uint64_t *counts) {
    for (int i = 0; i < count; i++) {
        uintptr_t rows[8];
        for (int r = 0; r < 8; r++) rows[r] = (uintptr_t)lane[8 * i + r]->in[0];
        count_phase(counts, COUNT_LDMATRIX_WAVEFRONTS, COUNT_LDMATRIX_WAVEFRONTS_MIN, rows, 8, 16);
    }
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < count; i++) {
            uint16_t e[2];
            for (int k = 0; k < 2; k++) {
                const int row = trans ? 2 * (l % 4) + k : l / 4, col = trans ? l / 4 : 2 * (l % 4) + k;
                const uint16_t *row_p = (const uint16_t *)(uintptr_t)lane[8 * i + row]->in[0];
                e[k] = row_p[col];
            }
            lane[l]->out[i] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
        }
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments for mma.m16n8k16
// with floating point type"): g = lane / 4, t = lane % 4; A regs {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..),
// (g+8, 2t+8..)}; B regs {(k 2t..2t+1, n g), (k 2t+8.., n g)}; C/D {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)};
// the low half of a register holds the lower index. Products of bf16 are exact in fp32; the sum is formed in
// double and rounded once (the hardware's order and rounding are not specified bit for bit) ----

static float bf16_bits_to_float(uint32_t bits16) {
    const uint32_t u = bits16 << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4]) {
    Thread *t = collective("mma.sync", OP_MMA, 0, 0xffffffffu);
    for (int i = 0; i < 4; i++) t->in[i] = a[i];
    t->in[4] = b0;
    t->in[5] = b1;
    for (int i = 0; i < 4; i++) {
        uint32_t u;
        memcpy(&u, &c[i], 4);
        t->in[6 + i / 2] = i % 2 ? (t->in[6 + i / 2] | (uint64_t)u << 32) : u;
    }
    yield(t, AT_WARP_OP);
    for (int i = 0; i < 4; i++) {
        const uint32_t u = (uint32_t)(t->out[i / 2] >> (32 * (i % 2)));
        memcpy(&d[i], &u, 4);
    }
}

static void complete_mma(Thread *const *lane) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, tq = l % 4;
        const uint64_t *in = lane[l]->in;
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++)
                A[g + 8 * (r % 2)][2 * tq + h + 8 * (r / 2)] =
                    bf16_bits_to_float((uint32_t)(in[r] >> (16 * h)) & 0xffff);
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 2; h++)
                B[2 * tq + h + 8 * r][g] = bf16_bits_to_float((uint32_t)(in[4 + r] >> (16 * h)) & 0xffff);
        for (int i = 0; i < 4; i++) {
            const uint32_t u = (uint32_t)(in[6 + i / 2] >> (32 * (i % 2)));
            memcpy(&C[g + 8 * (i / 2)][2 * tq + i % 2], &u, 4);
        }
    }
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, tq = l % 4;
        uint32_t out[4];
        for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i / 2), col = 2 * tq + i % 2;
            double s = C[row][col];
            for (int k = 0; k < 16; k++) s += (double)A[row][k] * (double)B[k][col];
            const float f = (float)s;
            memcpy(&out[i], &f, 4);
        }
        lane[l]->out[0] = out[0] | (uint64_t)out[1] << 32;
        lane[l]->out[1] = out[2] | (uint64_t)out[3] << 32;
    }
}

// ---- cp.async (PTX ISA, "cp.async", "cp.async.commit_group", "cp.async.wait_group"): 16 bytes global ->
// shared, both addresses 16-byte aligned; src-size bytes read, the rest zero-filled. The data lands only when
// the thread waits for its group: until then the destination holds poison ----

void cp_async16(void *smem, const void *gmem, int src_bytes) {
    Thread *t = self("cp.async");
    t->block->counts[COUNT_CP_ASYNC_BYTES] += 16;
    if ((uintptr_t)smem % 16 || (uintptr_t)gmem % 16)
        violation(t, "cp.async of 16 bytes from %p to %p: both addresses must be 16-byte aligned (PTX ISA, cp.async)",
                  gmem, smem);
    if (!in_shared(t->block, smem, 16))
        violation(t, "cp.async destination %p is not in the block's shared memory (PTX ISA, cp.async)", smem);
    if (src_bytes < 0 || src_bytes > 16)
        violation(t, "cp.async src-size %d is not in 0..16 (PTX ISA, cp.async)", src_bytes);
    std::vector<std::array<uintptr_t, 32>> &calls = t->block->cp_async_dst[t->linear / 32];
    if ((int)calls.size() <= t->cp_async_issued) calls.push_back({});
    calls[t->cp_async_issued++][t->linear % 32] = (uintptr_t)smem;
    PendingCopy c;
    c.dst = smem;
    memset(c.data, 0, 16);
    if (src_bytes > 0) memcpy(c.data, gmem, (size_t)src_bytes);
    c.group = t->committed;
    memset(smem, POISON, 16);
    t->copies.push_back(c);
}

void cp_async_commit() {
    self("cp.async.commit_group")->committed++;
}

// Land this thread's copies of every committed group but the newest n.
static void land_copies(Thread *t, int64_t groups_done) {
    size_t keep = 0;
    for (size_t i = 0; i < t->copies.size(); i++) {
        PendingCopy &c = t->copies[i];
        if (c.group < groups_done) memcpy(c.dst, c.data, 16);
        else t->copies[keep++] = c;
    }
    t->copies.resize(keep);
}

void cp_async_wait(int n) {
    Thread *t = self("cp.async.wait_group");
    land_copies(t, t->committed - n);
}

// ---- Hopper: shared-memory addresses. The sim puts the block's dynamic shared memory at shared address 0
// (allocated 1024-byte aligned), so the swizzle patterns, functions of address bits, fall on a kernel's
// 1024-byte aligned tiles as on a GPU ----

static uint32_t dynamic_offset(Thread *t, const void *p, size_t bytes, const char *what) {
    const Block *b = t->block;
    const unsigned char *c = (const unsigned char *)p;
    if (c < b->dynamic_smem || c + bytes > b->dynamic_smem + b->launch->smem)
        violation(t, "%s %p (%zu bytes) is not in the block's dynamic shared memory (the sim addresses the Hopper "
                     "operations' shared operands there only)", what, p, bytes);
    return (uint32_t)(c - b->dynamic_smem);
}

uint32_t shared_address(const void *p) {
    return dynamic_offset(self("shared address"), p, 0, "shared address of");
}

// The swizzle of a shared address with a span of S = 32, 64 or 128 bytes (CUDA C++ Programming Guide,
// "Tensor Memory Access", swizzle modes; PTX ISA, "Shared Memory Matrix Layout"): the 16-byte chunk bits
// [4, 4 + log2(S/16)) are XORed with bits [7, 7 + log2(S/16)), the 128-byte line within 256, 512 or 1024 bytes.
static uint32_t swizzle(uint32_t addr, uint32_t span) {
    return span ? addr ^ ((addr >> 7 & (span / 16 - 1)) << 4) : addr;
}

// ---- mbarrier (PTX ISA, "mbarrier"): init sets the expected arrival count (1..2^20-1); arrive counts one
// arrival of the current phase, expect-tx adds bytes to its tx-count, a bulk copy's complete-tx subtracts its
// bytes; the phase completes when its pending arrivals and its tx-count are both zero, and the next phase
// starts with the expected count. test_wait/try_wait.parity P: true when the phase of parity P has completed,
// i.e. the current phase has the other parity ----

static const int64_t TX_LIMIT = (1 << 20) - 1;

static MBarrier &mbarrier_of(Thread *t, uint64_t *bar, const char *what) {
    auto it = t->block->mbarriers.find((uintptr_t)bar);
    if (it == t->block->mbarriers.end())
        violation(t, "%s on %p, which no mbarrier.init of this block initialised (PTX ISA, mbarrier: initialise "
                     "the object before any other mbarrier operation)", what, (void *)bar);
    return it->second;
}

static void complete_phase_if_done(MBarrier &m) {
    if (m.pending || m.tx) return;
    for (const Landing &l : m.landing) memcpy(l.dst, l.data.data(), l.data.size());
    m.landing.clear();
    m.phase++;
    m.pending = m.expected;
}

static bool parity_done(const MBarrier &m, unsigned parity) {
    return (m.phase & 1) != (parity & 1);
}

void mbarrier_init(uint64_t *bar, unsigned count) {
    Thread *t = self("mbarrier.init");
    if ((uintptr_t)bar % 8 || !in_shared(t->block, bar, 8))
        violation(t, "mbarrier.init of %p: the object must be 8-byte aligned in shared memory (PTX ISA, mbarrier)",
                  (void *)bar);
    if (count < 1 || count > TX_LIMIT)
        violation(t, "mbarrier.init with count %u: must be in [1, 2^20-1] (PTX ISA, mbarrier.init)", count);
    MBarrier &m = t->block->mbarriers[(uintptr_t)bar];
    if (!m.landing.empty())
        violation(t, "mbarrier.init of %p while bulk copies that completed on it have not landed", (void *)bar);
    m = MBarrier();
    m.expected = m.pending = count;
    *bar = 0;
}

void mbarrier_arrive(uint64_t *bar, unsigned tx_bytes) {
    Thread *t = self("mbarrier.arrive");
    MBarrier &m = mbarrier_of(t, bar, "mbarrier.arrive");
    m.tx += tx_bytes;
    if (m.tx > TX_LIMIT)
        violation(t, "mbarrier.arrive.expect_tx of %u bytes on %p: the tx-count %lld exceeds 2^20-1 (PTX ISA, "
                     "mbarrier: tx-count range)", tx_bytes, (void *)bar, (long long)m.tx);
    m.pending--;
    complete_phase_if_done(m);
}

bool mbarrier_test_wait_parity(uint64_t *bar, unsigned parity) {
    Thread *t = self("mbarrier.test_wait");
    t->block->counts[COUNT_MBARRIER_WAITS]++;
    return parity_done(mbarrier_of(t, bar, "mbarrier.test_wait"), parity);
}

void mbarrier_wait_parity(uint64_t *bar, unsigned parity) {
    Thread *t = self("mbarrier.try_wait");
    t->block->counts[COUNT_MBARRIER_WAITS]++;
    if (parity_done(mbarrier_of(t, bar, "mbarrier.try_wait"), parity)) return;
    t->mbarrier = bar;
    t->parity = parity;
    t->block->mbarrier_waiters++;
    yield(t, AT_MBARRIER);
}

// The waiters whose phase has completed may run again; true when one was released.
static bool release_mbarrier_waiters(Block *b, std::vector<std::vector<Thread *>> &ready) {
    bool released = false;
    for (Thread &t : b->threads)
        if (t.wait == AT_MBARRIER && parity_done(b->mbarriers[(uintptr_t)t.mbarrier], t.parity)) {
            t.wait = RUNNABLE;
            b->mbarrier_waiters--;
            ready[t.linear / 32].push_back(&t);
            released = true;
        }
    return released;
}

// ---- bulk copies (PTX ISA, "cp.async.bulk", "cp.async.bulk.tensor", .mbarrier::complete_tx::bytes): the
// source is read at the call and the destination holds poison; the copy is in flight until no thread of the
// block can run and no __syncthreads can complete (the latest a GPU may take), then its bytes complete on the
// mbarrier's current phase (complete-tx) and land when that phase completes ----

static void complete_tx(Thread *t, uint64_t *bar, unsigned char *dst, std::vector<unsigned char> data,
                        const char *what) {
    mbarrier_of(t, bar, what);
    memset(dst, POISON, data.size());
    t->block->counts[COUNT_TMA_BYTES] += data.size();
    t->block->in_flight.push_back({bar, dst, std::move(data)});
}

static void deliver_bulk_copies(Block *b) {
    for (BulkCopy &c : b->in_flight) {
        MBarrier &m = b->mbarriers[(uintptr_t)c.bar];
        m.tx -= (int64_t)c.data.size();
        if (m.tx < -TX_LIMIT)
            fail("kernel %s: bulk copies of %zu bytes on the mbarrier at %p take its tx-count to %lld, below "
                 "-(2^20-1) (PTX ISA, mbarrier: tx-count range)", b->launch->name.c_str(), c.data.size(),
                 (void *)c.bar, (long long)m.tx);
        m.landing.push_back({c.dst, std::move(c.data)});
        complete_phase_if_done(m);
    }
    b->in_flight.clear();
}

void bulk_copy(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    Thread *t = self("cp.async.bulk");
    if (bytes == 0 || bytes % 16 || (uintptr_t)smem % 16 || (uintptr_t)gmem % 16)
        violation(t, "cp.async.bulk of %u bytes from %p to %p: the size must be a non-zero multiple of 16 and both "
                     "addresses 16-byte aligned (PTX ISA, cp.async.bulk)", bytes, gmem, smem);
    if (!in_shared(t->block, smem, bytes))
        violation(t, "cp.async.bulk destination %p (%u bytes) is not in the block's shared memory", smem, bytes);
    const unsigned char *src = (const unsigned char *)gmem;
    complete_tx(t, bar, (unsigned char *)smem, std::vector<unsigned char>(src, src + bytes), "cp.async.bulk");
}

// The box at coords: element (i0, i1, ...) of the box is the tensor's (coords[0] + i0, coords[1] + i1, ...),
// zero outside the tensor; the box is stored dimension 0 fastest, its byte at offset o at shared address
// swizzle(destination + o).
void bulk_tensor_load(void *smem, const void *tensor_map, const int *coords, int rank, uint64_t *bar) {
    Thread *t = self("cp.async.bulk.tensor");
    TensorMapModel m;
    memcpy(&m, tensor_map, sizeof m);
    if (m.magic != TENSOR_MAP_MAGIC)
        violation(t, "cp.async.bulk.tensor with %p, which is no tensor map made by cuTensorMapEncodeTiled",
                  tensor_map);
    if ((int)m.rank != rank)
        violation(t, "cp.async.bulk.tensor.%dd with a tensor map of rank %u", rank, m.rank);
    if ((uintptr_t)smem % 128)
        violation(t, "cp.async.bulk.tensor destination %p is not 128-byte aligned (PTX ISA, cp.async.bulk.tensor)",
                  smem);
    uint64_t elements = 1;
    for (int i = 0; i < rank; i++) elements *= m.box[i];
    const size_t esize = m.element_bytes, bytes = elements * esize;
    const uint32_t base = dynamic_offset(t, smem, bytes, "cp.async.bulk.tensor destination");
    std::vector<unsigned char> box(bytes, 0), placed(bytes);
    for (uint64_t e = 0; e < elements; e++) {
        uint64_t rest = e;
        bool inside = true;
        const unsigned char *src = m.global;
        for (int i = 0; i < rank; i++) {
            const int64_t c = (int64_t)coords[i] + (int64_t)(rest % m.box[i]);
            rest /= m.box[i];
            if (c < 0 || c >= (int64_t)m.dim[i]) inside = false;
            else src += (uint64_t)c * m.stride[i];
        }
        if (inside) memcpy(&box[e * esize], src, esize);
    }
    for (size_t o = 0; o < bytes; o++) {
        const size_t at = swizzle(base + (uint32_t)o, m.swizzle_bytes) - base;
        if (at >= bytes)
            violation(t, "cp.async.bulk.tensor: the %zu-byte box swizzled by %u bytes does not fill whole 128-byte "
                         "lines", bytes, m.swizzle_bytes);
        placed[at] = box[o];
    }
    complete_tx(t, bar, (unsigned char *)smem, std::move(placed), "cp.async.bulk.tensor");
}

// ---- wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (PTX ISA, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate"): a collective of the warpgroup's 128 threads. D (64 x N, fp32) = A (64 x 16) B (16 x N)
// (+ D). Warp w of the warpgroup holds rows 16w..16w+15; with g = lane / 4, t = lane % 4, accumulator i of a
// thread is row 16w + g + 8 ((i % 4) / 2), column 8 (i / 4) + 2t + i % 2; A from registers as mma.m16n8k16's
// A fragment of the warp's 16 rows. The results are the thread's at the wgmma.wait_group that covers the
// group: until then the accumulator registers hold poison, and finding them written there is a violation.
// A wgmma.fence must come before the first wgmma.mma_async and again after each wgmma.wait_group (the
// registers are accessed there). Products exact, the sum in double rounded once, as mma.sync ----

static const uint32_t DESCRIPTOR_SPAN[4] = {0, 128, 64, 32};   // swizzle mode bits 62-63: none, 128B, 64B, 32B

// rows x 16 bf16 of an operand through its matrix descriptor (PTX ISA, "Matrix Descriptor Format":
// start address bits 0-13, leading byte offset 16-29, stride byte offset 32-45, each in 16-byte units;
// base offset 49-51; swizzle mode 62-63; "Shared Memory Matrix Layout" for the strides). K-major: without
// swizzle, 8 x 8 core matrices of 8 rows of 16 bytes: element (r, k) at start + (r/8) SBO + (k/8) LBO +
// 16 (r%8) + 2 (k%8); with a swizzle of S bytes, rows of S bytes in atoms of 8 rows: start + (r/8) SBO +
// S (r%8) + 2k, swizzled; LBO unused. MN-major (B transposed: r contiguous): without swizzle, element (r, k)
// at start + (r/8) SBO + (k/8) LBO + 16 (k%8) + 2 (r%8); with a swizzle of S bytes, rows of S bytes (S/2
// elements of r) for 8 consecutive k: start + (r / (S/2)) LBO + (k/8) SBO + S (k%8) + 2 (r % (S/2)), swizzled.
static void read_operand(Thread *t, uint64_t desc, int rows, bool mn_major, float *out) {
    const Block *b = t->block;
    const uint32_t start = (uint32_t)(desc & 0x3fff) << 4, lbo = (uint32_t)(desc >> 16 & 0x3fff) << 4,
                   sbo = (uint32_t)(desc >> 32 & 0x3fff) << 4, span = DESCRIPTOR_SPAN[desc >> 62];
    if (desc >> 49 & 7)
        violation(t, "wgmma descriptor 0x%016llx has a base offset: the sim models base offset 0 (tiles aligned "
                     "to the swizzle's repeat)", (unsigned long long)desc);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < 16; k++) {
            uint32_t linear;
            if (!mn_major)
                linear = span ? start + r / 8 * sbo + span * (r % 8) + 2 * k
                              : start + r / 8 * sbo + k / 8 * lbo + 16 * (r % 8) + 2 * (k % 8);
            else
                linear = span ? start + r / (span / 2) * lbo + k / 8 * sbo + span * (k % 8) + 2 * (r % (span / 2))
                              : start + r / 8 * sbo + k / 8 * lbo + 16 * (k % 8) + 2 * (r % 8);
            const uint32_t addr = swizzle(linear, span);
            if (addr + 2 > b->launch->smem)
                violation(t, "wgmma descriptor 0x%016llx reads shared address %u, past the block's %zu bytes of "
                             "dynamic shared memory", (unsigned long long)desc, addr, b->launch->smem);
            uint16_t bits;
            memcpy(&bits, b->dynamic_smem + addr, 2);
            out[r * 16 + k] = bf16_bits_to_float(bits);
        }
}

// The warpgroup's threads must make 4 whole warps.
static void check_warpgroup(Thread *t, const char *what) {
    if ((t->linear / 128 + 1) * 128 > (int)t->block->threads.size())
        violation(t, "%s in warpgroup %d, which the block's %zu threads do not fill (PTX ISA: a warpgroup is 4 "
                     "contiguous warps)", what, t->linear / 128, t->block->threads.size());
}

void wgmma_bf16(float *d, int n, uint64_t a_desc, const uint32_t *a_regs, uint64_t b_desc, bool b_mn_major,
                bool accumulate) {
    Thread *t = self("wgmma.mma_async");
    check_warpgroup(t, "wgmma.mma_async");
    if (n < 8 || n > 256 || n % 8)
        violation(t, "wgmma.mma_async.m64n%dk16: N must be a multiple of 8 in [8, 256] (PTX ISA)", n);
    if (!t->wgmma_fenced)
        violation(t, "wgmma.mma_async without a wgmma.fence since the kernel began or since the last "
                     "wgmma.wait_group (PTX ISA, wgmma.fence: required before the first wgmma.mma_async and "
                     "between register accesses and a wgmma.mma_async)");
    t->op = OP_WGMMA;
    t->variant = n * 8 + (b_mn_major ? 4 : 0) + (a_regs ? 2 : 0) + accumulate;
    t->mask = 0xffffffffu;
    t->in[0] = a_desc;
    t->in[1] = b_desc;
    t->in[2] = (uint64_t)(uintptr_t)d;
    if (a_regs) {
        t->in[4] = a_regs[0] | (uint64_t)a_regs[1] << 32;
        t->in[5] = a_regs[2] | (uint64_t)a_regs[3] << 32;
    }
    yield(t, AT_WARP_OP);
}

static void complete_wgmma(Thread *const *lane, uint64_t *counts) {
    Thread *t = lane[0];
    const int n = t->variant / 8;
    const bool b_mn_major = t->variant & 4, from_regs = t->variant & 2, accumulate = t->variant & 1;
    std::vector<float> A(64 * 16), B((size_t)n * 16);
    if (from_regs)
        for (int l = 0; l < 128; l++) {
            const int row0 = 16 * (l / 32) + l % 32 / 4, col0 = 2 * (l % 4);
            for (int r = 0; r < 4; r++)
                for (int h = 0; h < 2; h++)
                    A[(row0 + 8 * (r % 2)) * 16 + col0 + 8 * (r / 2) + h] =
                        bf16_bits_to_float((uint32_t)(lane[l]->in[4 + r / 2] >> (32 * (r % 2) + 16 * h)) & 0xffff);
        }
    else read_operand(t, t->in[0], 64, false, A.data());
    read_operand(t, t->in[1], n, b_mn_major, B.data());
    auto operands = std::make_shared<WgmmaOperands>(WgmmaOperands{
        from_regs ? 0 : t->in[0], t->in[1], n, b_mn_major, from_regs ? std::vector<float>() : A, B, 128});
    for (int l = 0; l < 128; l++) {
        Thread *u = lane[l];
        u->wgmma_operands.push_back({operands, u->wgmma_committed});
        float *d = (float *)(uintptr_t)u->in[2];
        PendingAccumulator *p = nullptr;
        for (PendingAccumulator &q : u->accumulators)
            if (q.d == d) p = &q;
        if (p && (int)p->values.size() != n / 2)
            violation(u, "wgmma.mma_async.m64n%dk16 on accumulators at %p still pending from one of another shape", n,
                      (void *)d);
        std::vector<float> c(n / 2, 0.0f);
        if (accumulate && p) c = p->values;
        else if (accumulate) memcpy(c.data(), d, c.size() * sizeof(float));
        for (int i = 0; i < n / 2; i++) {
            const int row = 16 * (l / 32) + l % 32 / 4 + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
            double s = c[i];
            for (int k = 0; k < 16; k++) s += (double)A[row * 16 + k] * (double)B[col * 16 + k];
            c[i] = (float)s;
        }
        if (!p) {
            u->accumulators.push_back({d, {}, 0});
            p = &u->accumulators.back();
        }
        p->values = std::move(c);
        p->group = u->wgmma_committed;
        memset(d, POISON, (size_t)n / 2 * sizeof(float));
    }
    counts[COUNT_WGMMA]++;
    counts[COUNT_WGMMA_FLOPS] += 2ull * 64 * (uint64_t)n * 16;
}

void wgmma_fence() {
    self("wgmma.fence")->wgmma_fenced = true;
}

void wgmma_commit_group() {
    self("wgmma.commit_group")->wgmma_committed++;
}

// Land the accumulators of every committed group but the newest n.
void wgmma_wait_group(int n) {
    Thread *t = self("wgmma.wait_group");
    size_t keep = 0;
    for (size_t i = 0; i < t->accumulators.size(); i++) {
        PendingAccumulator &p = t->accumulators[i];
        if (p.group >= t->wgmma_committed - n) {
            t->accumulators[keep++] = std::move(p);
            continue;
        }
        const unsigned char *bytes = (const unsigned char *)p.d;
        for (size_t j = 0; j < p.values.size() * sizeof(float); j++)
            if (bytes[j] != POISON)
                violation(t, "accumulator register %zu at %p was written between its wgmma.mma_async and the "
                             "wgmma.wait_group that covers it (PTX ISA, wgmma.mma_async: accessing the accumulators "
                             "before the wait is undefined)", j / sizeof(float), (void *)p.d);
        memcpy(p.d, p.values.data(), p.values.size() * sizeof(float));
    }
    t->accumulators.resize(keep);
    keep = 0;
    for (size_t i = 0; i < t->wgmma_operands.size(); i++) {
        PendingOperands &p = t->wgmma_operands[i];
        if (p.group >= t->wgmma_committed - n) {
            t->wgmma_operands[keep++] = std::move(p);
            continue;
        }
        WgmmaOperands &o = *p.operands;
        if (--o.waiting > 0) continue;
        std::vector<float> a(o.a.size()), b(o.b.size());
        if (o.a_desc) read_operand(t, o.a_desc, 64, false, a.data());
        read_operand(t, o.b_desc, o.n, o.b_mn_major, b.data());
        if (memcmp(a.data(), o.a.data(), a.size() * sizeof(float)) ||
            memcmp(b.data(), o.b.data(), b.size() * sizeof(float)))
            violation(t, "the shared memory a wgmma.mma_async read (descriptors A 0x%016llx, B 0x%016llx) changed "
                         "before the last wgmma.wait_group of its warpgroup covered it (PTX ISA, wgmma.mma_async: its "
                         "shared operands must not be modified until the wait)",
                      (unsigned long long)o.a_desc, (unsigned long long)o.b_desc);
    }
    t->wgmma_operands.resize(keep);
    t->wgmma_fenced = false;
}

// ---- setmaxnreg.{inc,dec}.sync.aligned.u32 (PTX ISA, "setmaxnreg"): a warpgroup collective setting the
// registers per thread of the warpgroup to a multiple of 8 in [24, 256]. The block's registers are 64K; the sim
// starts each warpgroup at 64K / (128 x warpgroups) rounded down to a multiple of 8 (at most 256); an .inc waits
// until the other warpgroups' counts leave room for it ----

static const unsigned BLOCK_REGISTERS = 65536;

void setmaxnreg(unsigned count, bool increase) {
    Thread *t = self("setmaxnreg");
    check_warpgroup(t, "setmaxnreg");
    if (count % 8 || count < 24 || count > 256)
        violation(t, "setmaxnreg.%s.sync.aligned.u32 %u: the count must be a multiple of 8 in [24, 256] (PTX ISA, "
                     "setmaxnreg)", increase ? "inc" : "dec", count);
    t->op = OP_SETMAXNREG;
    t->variant = (int)count * 2 + increase;
    t->mask = 0xffffffffu;
    yield(t, AT_WARP_OP);
}

// The registers per thread the block's warpgroups hold, once warpgroup wg holds count.
static unsigned registers_with(Block *b, int wg, unsigned count) {
    if (b->registers.empty()) {
        const unsigned groups = (unsigned)(b->threads.size() + 127) / 128;
        b->registers.assign(groups, std::min(256u, BLOCK_REGISTERS / (128 * groups) / 8 * 8));
    }
    unsigned total = 0;
    for (size_t g = 0; g < b->registers.size(); g++) total += (int)g == wg ? count : b->registers[g];
    return total;
}

// ---- the block scheduler ----

static void thread_main(void *arg) {
    fiber_entered();
    Thread *t = (Thread *)arg;
    running = t;
    current = &t->state;
    t->block->launch->body();
    land_copies(t, INT64_MAX);          // copies in flight at exit still land
    if (!t->accumulators.empty())
        violation(t, "the thread ends with the results of a wgmma.mma_async no wgmma.wait_group covered (PTX ISA, "
                     "wgmma.wait_group)");
    t->wait = EXITED;
    running = nullptr;
    current = nullptr;
    fiber_switch(&t->fiber, &t->block->scheduler, true);
}

static const char *wait_name(const Thread *t) {
    static thread_local char buf[96];
    if (t->wait == EXITED) return "has exited";
    if (t->wait == AT_SYNCTHREADS) return "waits at __syncthreads";
    if (t->wait == AT_MBARRIER) return "waits at mbarrier.try_wait";
    snprintf(buf, sizeof buf, "waits at %s (mask 0x%08x)", warp_op_name(t->op), t->mask);
    return buf;
}

// Complete the warpgroup collective that thread t waits at when all 128 threads are there (a setmaxnreg.inc
// also when the block's registers leave room for it); released threads go to `ready` of their warps.
static bool resolve_warpgroup(Block *b, Thread *t, std::vector<std::vector<Thread *>> &ready) {
    const int wg = t->linear / 128;
    Thread *lane[128];
    for (int j = 0; j < 128; j++) {
        lane[j] = &b->threads[wg * 128 + j];
        if (lane[j]->wait != AT_WARP_OP || lane[j]->op != t->op) return false;
    }
    for (int j = 0; j < 128; j++)
        if (lane[j]->variant != t->variant)
            violation(lane[j], "%s with operands other than thread %d's of its warpgroup (PTX ISA, .sync.aligned: "
                               "every thread of the warpgroup executes the same instruction)",
                      warp_op_name(t->op), t->linear);
    if (t->op == OP_WGMMA) complete_wgmma(lane, b->counts);
    else {
        const unsigned count = (unsigned)t->variant / 2, total = registers_with(b, wg, count);
        if (t->variant % 2 && total * 128 > BLOCK_REGISTERS) return false;
        b->registers[wg] = count;
    }
    for (int j = 0; j < 128; j++) {
        lane[j]->wait = RUNNABLE;
        ready[lane[j]->linear / 32].push_back(lane[j]);
    }
    if (t->op == OP_SETMAXNREG)   // registers released may let another warpgroup's .inc complete
        for (int g = 0; g < (int)b->registers.size(); g++) {
            Thread *first = &b->threads[g * 128];
            if (g != wg && first->wait == AT_WARP_OP && first->op == OP_SETMAXNREG) resolve_warpgroup(b, first, ready);
        }
    return true;
}

// Complete the collectives of warp w whose lanes are all there (released lanes go to `ready`).
static void resolve_warp(Block *b, int w, std::vector<std::vector<Thread *>> &ready_of) {
    const int n = (int)b->threads.size(), w0 = w * 32;
    std::vector<Thread *> &ready = ready_of[w];
    for (int i = 0; i < 32 && w0 + i < n; i++) {
        Thread *t = &b->threads[w0 + i];
        if (t->wait != AT_WARP_OP) continue;
        if (t->op == OP_WGMMA || t->op == OP_SETMAXNREG) {
            resolve_warpgroup(b, t, ready_of);
            continue;
        }
        bool complete = true;
        for (int j = 0; j < 32 && complete; j++) {
            if (!(t->mask >> j & 1u)) continue;
            const Thread *o = w0 + j < n ? &b->threads[w0 + j] : nullptr;
            complete = o && o->wait == AT_WARP_OP && o->op == t->op && o->variant == t->variant && o->mask == t->mask;
        }
        if (!complete) continue;
        Thread *lane[32] = {};
        for (int j = 0; j < 32; j++)
            if (t->mask >> j & 1u) lane[j] = &b->threads[w0 + j];
        switch (t->op) {
        case OP_SYNCWARP: break;
        case OP_SHUFFLE: {
            const int mode = t->variant / 64, width = t->variant % 64;
            for (int j = 0; j < 32; j++) {
                if (!lane[j]) continue;
                const int arg = (int)(int64_t)lane[j]->in[1], seg = j / width * width;
                int src = j;
                if (mode == SHFL_IDX) src = seg + ((arg % width) + width) % width;
                else if (mode == SHFL_UP) src = j - arg >= seg ? j - arg : j;
                else if (mode == SHFL_DOWN) src = j + arg < seg + width ? j + arg : j;
                else src = ((j ^ arg) & 31) / width == j / width ? (j ^ arg) & 31 : j;
                if (!lane[src])
                    violation(lane[j], "__shfl*_sync reads lane %d, which is not in mask 0x%08x (CUDA C++ "
                                       "Programming Guide, Warp Shuffle Functions: value undefined)", src, t->mask);
                lane[j]->out[0] = lane[src]->in[0];
            }
            break;
        }
        case OP_VOTE: {
            unsigned ballot = 0;
            for (int j = 0; j < 32; j++)
                if (lane[j] && lane[j]->in[0]) ballot |= 1u << j;
            const uint64_t r = t->variant == VOTE_BALLOT ? ballot
                               : t->variant == VOTE_ANY  ? ballot != 0
                                                         : ballot == t->mask;
            for (int j = 0; j < 32; j++)
                if (lane[j]) lane[j]->out[0] = r;
            break;
        }
        case OP_LDMATRIX: complete_ldmatrix(lane, t->variant / 2, t->variant % 2, b->counts); break;
        case OP_MMA: complete_mma(lane); break;
        }
        if (t->op == OP_SHUFFLE) b->counts[COUNT_SHUFFLES]++;
        if (t->op == OP_LDMATRIX) b->counts[COUNT_LDMATRIX_BYTES] += 128 * (uint64_t)(t->variant / 2);
        if (t->op == OP_MMA) b->counts[COUNT_MMA]++;
        for (int j = 0; j < 32; j++)
            if (lane[j]) {
                lane[j]->wait = RUNNABLE;
                ready.push_back(lane[j]);
            }
    }
}

// Nothing can run and nothing completes: name the first thread that is stuck and why.
[[noreturn]] static void deadlock(Block *b) {
    const int n = (int)b->threads.size();
    for (int i = 0; i < n; i++) {
        Thread *t = &b->threads[i];
        if (t->wait == AT_WARP_OP) {
            for (int j = 0; j < 32; j++) {
                if (!(t->mask >> j & 1u)) continue;
                const int o = i / 32 * 32 + j;
                if (o >= n)
                    violation(t, "%s with mask 0x%08x names lane %d, which the block does not have (CUDA C++ "
                                 "Programming Guide, Warp Shuffle Functions)", warp_op_name(t->op), t->mask, j);
                const Thread *u = &b->threads[o];
                if (u->wait != AT_WARP_OP || u->op != t->op || u->variant != t->variant || u->mask != t->mask)
                    violation(t, "%s with mask 0x%08x: lane %d of the mask %s (CUDA C++ Programming Guide: every "
                                 "lane of the mask must execute the same collective)",
                              warp_op_name(t->op), t->mask, j, wait_name(u));
            }
        }
    }
    for (int i = 0; i < n; i++) {
        Thread *t = &b->threads[i];
        if (t->wait == AT_WARP_OP && (t->op == OP_WGMMA || t->op == OP_SETMAXNREG)) {
            for (int j = i / 128 * 128; j < i / 128 * 128 + 128; j++) {
                const Thread *u = &b->threads[j];
                if (u->wait != AT_WARP_OP || u->op != t->op)
                    violation(t, "%s while thread %d of its warpgroup %s (PTX ISA, .sync.aligned: every thread of "
                                 "the warpgroup executes it)", warp_op_name(t->op), j, wait_name(u));
            }
            if (t->op == OP_SETMAXNREG)
                violation(t, "setmaxnreg.inc to %d registers waits forever: the block's warpgroups hold %u per "
                             "thread and no .dec releases any (PTX ISA, setmaxnreg; %u registers per block)",
                          t->variant / 2, registers_with(b, -1, 0), BLOCK_REGISTERS);
        }
        if (t->wait == AT_MBARRIER) {
            const MBarrier &m = b->mbarriers[(uintptr_t)t->mbarrier];
            violation(t, "mbarrier.try_wait.parity %u on %p never completes: no thread of the block can run; the "
                         "barrier's phase %llu has %u of %u arrivals pending and tx-count %lld%s (PTX ISA, "
                         "mbarrier: a phase completes when its pending arrivals and tx-count are zero)",
                      t->parity, (void *)t->mbarrier, (unsigned long long)m.phase, m.pending, m.expected,
                      (long long)m.tx,
                      m.tx < 0 ? ": more bytes arrived than an expect-tx announced"
                      : m.tx > 0 ? ": bytes an expect-tx announced never arrived" : "");
        }
    }
    for (int i = 0; i < n; i++) {
        Thread *t = &b->threads[i];
        if (t->wait == AT_SYNCTHREADS)
            for (int j = 0; j < n; j++)
                if (b->threads[j].wait != AT_SYNCTHREADS)
                    violation(t, "__syncthreads while thread (%u,%u,%u) %s (CUDA C++ Programming Guide, "
                                 "Synchronization Functions: barrier divergence)",
                              b->threads[j].state.thread_idx.x, b->threads[j].state.thread_idx.y,
                              b->threads[j].state.thread_idx.z, wait_name(&b->threads[j]));
    }
    fail("kernel %s: scheduler found no runnable thread and no violation", b->launch->name.c_str());
}

// ---- work counted per kernel name (cuda_runtime_api.h: cudasim_kernel_counts, CUDASIM_COUNTS) ----

static std::mutex counts_mutex;
static std::map<std::string, cudasimKernelCounts> counts_by_kernel;

void count_atomic() {
    if (running) running->block->counts[COUNT_ATOMICS]++;
}

// A launch (launches 1, no counts) or a finished block (launches 0) of kernel `name`.
static void add_counts(const std::string &name, uint64_t launches, const uint64_t *counts) {
    std::lock_guard<std::mutex> lock(counts_mutex);
    cudasimKernelCounts &k = counts_by_kernel[name];
    k.launches += launches;
    if (!counts) return;
    k.blocks++;
    k.mma += counts[COUNT_MMA];
    k.ldmatrix_bytes += counts[COUNT_LDMATRIX_BYTES];
    k.cp_async_bytes += counts[COUNT_CP_ASYNC_BYTES];
    k.shuffles += counts[COUNT_SHUFFLES];
    k.barriers += counts[COUNT_BARRIERS];
    k.atomics += counts[COUNT_ATOMICS];
    k.ldmatrix_wavefronts += counts[COUNT_LDMATRIX_WAVEFRONTS];
    k.ldmatrix_wavefronts_min += counts[COUNT_LDMATRIX_WAVEFRONTS_MIN];
    k.cp_async_wavefronts += counts[COUNT_CP_ASYNC_WAVEFRONTS];
    k.cp_async_wavefronts_min += counts[COUNT_CP_ASYNC_WAVEFRONTS_MIN];
    k.wgmma += counts[COUNT_WGMMA];
    k.wgmma_flops += counts[COUNT_WGMMA_FLOPS];
    k.tma_bytes += counts[COUNT_TMA_BYTES];
    k.mbarrier_waits += counts[COUNT_MBARRIER_WAITS];
}

// CUDASIM_COUNTS=FILE: the counts of every kernel at exit, written to a temporary name and renamed.
static void write_counts() {
    const char *path = getenv("CUDASIM_COUNTS");
    std::lock_guard<std::mutex> lock(counts_mutex);
    const std::string tmp = std::string(path) + ".tmp";
    FILE *f = fopen(tmp.c_str(), "w");
    if (!f) fail("CUDASIM_COUNTS=%s: cannot write %s", path, tmp.c_str());
    fprintf(f, "kernel\tlaunches\tblocks\tmma\tldmatrix_bytes\tcp_async_bytes\tshuffles\tbarriers\tatomics"
               "\tldmatrix_wavefronts\tldmatrix_wavefronts_min\tcp_async_wavefronts\tcp_async_wavefronts_min"
               "\twgmma\twgmma_flops\ttma_bytes\tmbarrier_waits\n");
    for (const auto &e : counts_by_kernel) {
        const cudasimKernelCounts &k = e.second;
        fprintf(f,
                "%s\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\n",
                e.first.c_str(), k.launches, k.blocks, k.mma, k.ldmatrix_bytes, k.cp_async_bytes, k.shuffles,
                k.barriers, k.atomics, k.ldmatrix_wavefronts, k.ldmatrix_wavefronts_min, k.cp_async_wavefronts,
                k.cp_async_wavefronts_min, k.wgmma, k.wgmma_flops, k.tma_bytes, k.mbarrier_waits);
    }
    if (fclose(f) != 0 || rename(tmp.c_str(), path) != 0) fail("CUDASIM_COUNTS=%s: cannot write it", path);
}

static void run_block(const Launch *l, uint3 block_idx, uint64_t block_linear) {
    Block b;
    b.launch = l;
    b.static_bytes = 0;
    memset(b.counts, 0, sizeof b.counts);
    b.rng.seed(seed() * 0x9e3779b97f4a7c15ull ^ (l->number << 32) ^ block_linear);
    fiber_init_thread(&b.scheduler);
    void *smem;
    if (posix_memalign(&smem, 1024, l->smem ? l->smem : 1) != 0) fail("out of memory for shared memory");
    b.dynamic_smem = (unsigned char *)smem;
    memset(b.dynamic_smem, POISON, l->smem);
    const dim3 bd = l->block;
    const int n = (int)(bd.x * bd.y * bd.z);
    b.threads.resize(n);
    const int nw = (n + 31) / 32;
    std::vector<std::vector<Thread *>> ready(nw);   // per warp: lanes that may run
    b.cp_async_dst.resize(nw);
    for (int i = 0; i < n; i++) {
        Thread *t = &b.threads[i];
        t->state.thread_idx = uint3{(unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y)};
        t->state.block_idx = block_idx;
        t->state.block_dim = bd;
        t->state.grid_dim = l->grid;
        t->block = &b;
        t->linear = i;
        t->wait = RUNNABLE;
        t->committed = 0;
        t->cp_async_issued = 0;
        fiber_start(&t->fiber, thread_main, t);
        ready[i / 32].push_back(t);
    }
    // A phase runs from one __syncthreads to the next. Its schedule is drawn
    // from the seed: either the warps one after the other in a shuffled order
    // (each up to the barrier: the widest skew between warps) or a random warp
    // at every step; within a warp, the lanes between two collectives in a
    // shuffled order.
    std::vector<int> warp_order(nw);
    for (int w = 0; w < nw; w++) warp_order[w] = w;
    bool sequential = false;
    auto new_phase = [&]() {
        std::shuffle(warp_order.begin(), warp_order.end(), b.rng);
        sequential = b.rng() & 1;
    };
    new_phase();
    std::vector<int> candidates;
    for (;;) {
        int w = -1;
        if (sequential) {
            for (int c : warp_order)
                if (!ready[c].empty()) { w = c; break; }
        } else {
            candidates.clear();
            for (int c = 0; c < nw; c++)
                if (!ready[c].empty()) candidates.push_back(c);
            if (!candidates.empty()) w = candidates[b.rng() % candidates.size()];
        }
        if (w >= 0) {
            std::vector<Thread *> lanes;
            lanes.swap(ready[w]);
            std::shuffle(lanes.begin(), lanes.end(), b.rng);
            for (Thread *t : lanes) {
                running = t;
                fiber_switch(&b.scheduler, &t->fiber, false);
                if (t->wait == EXITED) fiber_release(&t->fiber);
            }
            resolve_warp(&b, w, ready);
            if (b.mbarrier_waiters) release_mbarrier_waiters(&b, ready);
            continue;
        }
        if (b.mbarrier_waiters && release_mbarrier_waiters(&b, ready)) continue;
        int at_barrier = 0, exited = 0;
        for (const Thread &t : b.threads) {
            at_barrier += t.wait == AT_SYNCTHREADS;
            exited += t.wait == EXITED;
        }
        if (at_barrier != n && !b.in_flight.empty()) {   // the block waits (or has ended): the copies complete
            deliver_bulk_copies(&b);
            continue;
        }
        if (exited == n) break;
        if (at_barrier != n) deadlock(&b);
        count_cp_async_wavefronts(&b);
        b.counts[COUNT_BARRIERS]++;
        for (Thread &t : b.threads) {
            t.wait = RUNNABLE;
            ready[t.linear / 32].push_back(&t);
        }
        new_phase();
    }
    running = nullptr;
    for (const auto &e : b.mbarriers)
        if (!e.second.landing.empty())
            fail("kernel %s block (%u,%u,%u): bulk copies completed on the mbarrier at %p in a phase that never "
                 "completed, so they never landed (a missing arrive, or bytes no expect-tx announced; PTX ISA, "
                 "mbarrier) (CUDASIM_SEED=%llu)", l->name.c_str(), block_idx.x, block_idx.y, block_idx.z,
                 (void *)e.first, (unsigned long long)seed());
    count_cp_async_wavefronts(&b);
    free(b.dynamic_smem);
    for (const Block::Static &s : b.statics) free(s.p);
    add_counts(l->name, 0, b.counts);
}

void run_grid(const Launch *l) {
    static std::once_flag dump_at_exit;
    std::call_once(dump_at_exit, [] { if (getenv("CUDASIM_COUNTS") && *getenv("CUDASIM_COUNTS")) atexit(write_counts); });
    add_counts(l->name, 1, nullptr);
    const dim3 g = l->grid;
    const uint64_t nblocks = (uint64_t)g.x * g.y * g.z;
    std::vector<uint64_t> order(nblocks);
    for (uint64_t i = 0; i < nblocks; i++) order[i] = i;
    std::mt19937_64 rng(seed() ^ (l->number * 0x2545f4914f6cdd1dull));
    std::shuffle(order.begin(), order.end(), rng);
#pragma omp parallel for schedule(dynamic, 1)
    for (uint64_t i = 0; i < nblocks; i++) {
        const uint64_t b = order[i];
        run_block(l, uint3{(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / ((uint64_t)g.x * g.y))}, b);
    }
}

// ---- launch checks (CUDA C++ Programming Guide, "Compute Capabilities", table of technical
// specifications; "Execution Configuration"); a failed check is a launch error, no work is queued ----

static std::mutex attr_mutex;
static std::map<const void *, size_t> max_dynamic_smem;   // cudaFuncAttributeMaxDynamicSharedMemorySize

cudaError_t set_max_dynamic_smem(const void *fn, int bytes) {
    if (bytes < 0 || (size_t)bytes > device_props().sharedMemPerBlockOptin) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lock(attr_mutex);
    max_dynamic_smem[fn] = (size_t)bytes;
    return cudaSuccess;
}

// The kernel's symbol (the Itanium mangling g++ and nvcc share), empty when unknown.
static std::string mangled_name(const void *fn) {
    Dl_info info;
    return dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "";
}

static std::string readable_name(const std::string &mangled, const char *spelled) {
    if (mangled.empty()) return spelled;
    int status = 1;
    char *d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : mangled;
    free(d);
    return s;
}

// __launch_bounds__ of the project's kernels: mangled name -> max threads per
// block, the .maxntid of nvcc's PTX (PTX ISA, "Performance-Tuning Directives:
// .maxntid"), in the TSV that the build writes (header: kernel, max_threads).
// Without it (no nvcc) only the device's 1024 is checked.
static const std::map<std::string, uint64_t> &launch_bounds() {
    static const std::map<std::string, uint64_t> table = [] {
        std::map<std::string, uint64_t> t;
        const char *path = getenv("CUDASIM_LAUNCH_BOUNDS");
#ifdef CUDASIM_LAUNCH_BOUNDS_FILE
        if (!path) path = CUDASIM_LAUNCH_BOUNDS_FILE;
#endif
        FILE *f = path && *path ? fopen(path, "r") : nullptr;
        if (!f) return t;
        char line[4096], name[4000];
        int kernel_col = -1, threads_col = -1;
        if (fgets(line, sizeof line, f)) {
            int col = 0;
            for (char *p = strtok(line, "\t\n"); p; p = strtok(nullptr, "\t\n"), col++) {
                if (!strcmp(p, "kernel")) kernel_col = col;
                if (!strcmp(p, "max_threads")) threads_col = col;
            }
        }
        if (kernel_col < 0 || threads_col < 0) fail("%s: expected a header with columns kernel and max_threads", path);
        while (fgets(line, sizeof line, f)) {
            unsigned long long threads = 0;
            name[0] = 0;
            int col = 0;
            for (char *p = strtok(line, "\t\n"); p; p = strtok(nullptr, "\t\n"), col++) {
                if (col == kernel_col) snprintf(name, sizeof name, "%s", p);
                if (col == threads_col) threads = strtoull(p, nullptr, 10);
            }
            if (name[0] && threads) t[name] = threads;
        }
        fclose(f);
        return t;
    }();
    return table;
}

// cudaFuncGetAttributes: the dynamic shared memory cudaFuncSetAttribute allowed (0 before) and the
// __launch_bounds__ threads (the device's 1024 without); the sim compiles no SASS, so registers, static
// shared and local bytes are 0.
void func_attributes(const void *fn, cudaFuncAttributes *attr) {
    *attr = cudaFuncAttributes{};
    {
        std::lock_guard<std::mutex> lock(attr_mutex);
        auto it = max_dynamic_smem.find(fn);
        attr->maxDynamicSharedSizeBytes = it != max_dynamic_smem.end() ? (int)it->second : 0;
    }
    auto bound = launch_bounds().find(mangled_name(fn));
    attr->maxThreadsPerBlock = bound != launch_bounds().end() ? (int)bound->second : device_props().maxThreadsPerBlock;
}

void launch_grid(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                 std::function<void()> body) {
    const cudaDeviceProp &p = device_props();
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        block.x > (unsigned)p.maxThreadsDim[0] || block.y > (unsigned)p.maxThreadsDim[1] ||
        block.z > (unsigned)p.maxThreadsDim[2] || threads > (uint64_t)p.maxThreadsPerBlock ||
        grid.x > (unsigned)p.maxGridSize[0] || grid.y > (unsigned)p.maxGridSize[1] ||
        grid.z > (unsigned)p.maxGridSize[2]) {
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    size_t allowed = p.sharedMemPerBlock;
    {
        std::lock_guard<std::mutex> lock(attr_mutex);
        auto it = max_dynamic_smem.find(fn);
        if (it != max_dynamic_smem.end()) allowed = it->second;
    }
    if (smem > allowed || smem > p.sharedMemPerBlockOptin) {
        set_error(cudaErrorInvalidValue);
        return;
    }
    const std::string mangled = mangled_name(fn);
    auto bound = launch_bounds().find(mangled);
    if (bound != launch_bounds().end() && threads > bound->second) {   // as a real launch: too many resources
        set_error(cudaErrorLaunchOutOfResources);
        return;
    }
    auto l = std::make_shared<Launch>();
    l->name = readable_name(mangled, name);
    l->grid = grid;
    l->block = block;
    l->smem = smem;
    l->body = std::move(body);
    l->number = next_launch_number();
    enqueue(stream, "kernel", [l]() { run_grid(l.get()); });
}

}  // namespace cudasim

void cudasim_kernel_counts_reset(void) {
    std::lock_guard<std::mutex> lock(cudasim::counts_mutex);
    cudasim::counts_by_kernel.clear();
}

int cudasim_kernel_counts(const char *name, cudasimKernelCounts *out) {
    std::lock_guard<std::mutex> lock(cudasim::counts_mutex);
    memset(out, 0, sizeof(*out));
    int matched = 0;
    for (const auto &e : cudasim::counts_by_kernel) {
        if (e.first.find(name) == std::string::npos) continue;
        const cudasimKernelCounts &k = e.second;
        matched++;
        out->launches += k.launches;
        out->blocks += k.blocks;
        out->mma += k.mma;
        out->ldmatrix_bytes += k.ldmatrix_bytes;
        out->cp_async_bytes += k.cp_async_bytes;
        out->shuffles += k.shuffles;
        out->barriers += k.barriers;
        out->atomics += k.atomics;
        out->ldmatrix_wavefronts += k.ldmatrix_wavefronts;
        out->ldmatrix_wavefronts_min += k.ldmatrix_wavefronts_min;
        out->cp_async_wavefronts += k.cp_async_wavefronts;
        out->cp_async_wavefronts_min += k.cp_async_wavefronts_min;
        out->wgmma += k.wgmma;
        out->wgmma_flops += k.wgmma_flops;
        out->tma_bytes += k.tma_bytes;
        out->mbarrier_waits += k.mbarrier_waits;
    }
    return matched;
}
