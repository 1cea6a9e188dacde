// runtime.cpp: the host side of the sim's CUDA runtime. Device memory is host
// memory (posix_memalign per allocation, exactly the size asked, so that AddressSanitizer sees every
// out-of-bounds access; filled with 0xFF, NaN, as cudaMalloc leaves it
// undefined). Streams are queues of operations run lazily, when a host call
// must wait, in an interleaving drawn from CUDASIM_SEED (runs of one op or of
// as many as a stream can, run_one) that respects stream order, the legacy
// default stream's implicit synchronisation (CUDA Runtime API, "Stream
// synchronization behavior") and cudaStreamWaitEvent.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "cudasim.h"
#include "runtime.h"

struct CUstream_st {
    bool legacy, blocking;
    std::deque<struct SimOp> ops;
    uint64_t last = 0;        // sequence number of the newest op enqueued
    int priority = 0;         // recorded (cudaStreamGetPriority); the seeded order ignores it
    std::string coupled;      // a wait for a node-local and a network transfer at once, not yet consumed
};
struct SimOp {
    uint64_t seq;
    std::vector<uint64_t> deps;
    const char *what;
    std::function<bool()> step;   // one attempt; true when the operation is complete
};
struct CUevent_st {
    uint64_t recorded = 0;    // sequence number of the recording op, 0 = never recorded
    uint64_t queried = 0;     // the record cudaEventQuery last asked about
    double ms = 0;            // wall clock when it ran
};
struct CUmemPoolHandle_st {
    int device;
};

namespace cudasim {

static std::recursive_mutex host_mutex;   // one host call at a time
static CUstream_st legacy_stream{true, true, {}, 0, 0, {}};
static std::vector<CUstream_st *> streams{&legacy_stream};
static std::vector<bool> done{true};      // done[seq]; seq 0 = "nothing"
static uint64_t next_seq = 1;
static std::mt19937_64 stream_rng;
static bool rng_ready = false;
// The order between operations, kept to check NCCL's rules (nccl_enqueued):
// preds[seq] the operations op seq waits for (its stream's previous one and
// its dependencies); observed[seq] once the host has waited for op seq or a
// later one that waits for it (every operation enqueued afterwards is then
// ordered after it).
static std::vector<std::vector<uint64_t>> preds{{}};
static std::vector<bool> observed{true};
static uint64_t observed_below = 1;   // every op before it is observed (a wait for the whole device)
// An NCCL stream operation (one call, or one group): its communicators, and
// whether it moves data between ranks of one node or of different nodes.
struct NcclOp {
    std::vector<const void *> comms;
    cudaStream_t stream;
    std::string what;
    bool p2p_local, p2p_network;
};
static std::map<uint64_t, NcclOp> nccl_open;   // NCCL ops the host has not yet observed
static thread_local cudaError_t last_error = cudaSuccess;
static std::map<uintptr_t, size_t> allocations;
static std::map<uintptr_t, size_t> pinned;   // page-locked host ranges: cudaMallocHost, cudaHostAlloc, cudaHostRegister
static std::mutex alloc_mutex;
// Host synchronisations since cudasim_host_syncs_reset, per call site (the
// caller's return address) and call.
static std::map<std::pair<const void *, std::string>, long> host_syncs;
// The priorities of the streams NCCL operations were enqueued on since the reset.
static long nccl_ops = 0;
static int nccl_least = 0, nccl_greatest = 0;
// Device launches enqueued since the reset: kernels, cuBLASLt matmuls, memsets.
static long launched_kernels = 0, launched_matmuls = 0, launched_memsets = 0;
// Stream priorities of the A100 (cudaDeviceGetStreamPriorityRange): 0 least, -5 greatest.
static const int LEAST_PRIORITY = 0, GREATEST_PRIORITY = -5;

[[noreturn]] void fail(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "cudasim: %s\n", msg);
    fflush(stderr);
    _exit(1);
}

uint64_t seed() {
    static const uint64_t s = [] {
        const char *e = getenv("CUDASIM_SEED");
        if (!e || !*e) return (uint64_t)1;
        char *end;
        const unsigned long long v = strtoull(e, &end, 10);
        if (*end) fail("CUDASIM_SEED=%s: expected a non-negative integer", e);
        return (uint64_t)v;
    }();
    return s;
}

const cudaDeviceProp &device_props() {
    static const cudaDeviceProp p = [] {
        cudaDeviceProp d;
        memset(&d, 0, sizeof d);
        // CUDASIM_SM=90: an H100-SXM5-80GB (compute capability 9.0, 227 KiB of shared memory per block).
        const char *sm = getenv("CUDASIM_SM");
        const bool hopper = sm && strcmp(sm, "90") == 0;
        if (sm && !hopper && strcmp(sm, "80") != 0) {
            fprintf(stderr, "cudasim: CUDASIM_SM=%s (expected 80 or 90)\n", sm);
            exit(1);
        }
        snprintf(d.name, sizeof d.name, "cudasim %s (CPU execution model)",
                 hopper ? "H100-SXM5-80GB" : "A100-SXM4-80GB");
        d.totalGlobalMem = (size_t)80 << 30;
        d.sharedMemPerBlock = 48 * 1024;
        d.sharedMemPerBlockOptin = (hopper ? 227 : 163) * 1024;
        d.sharedMemPerMultiprocessor = (hopper ? 228 : 164) * 1024;
        d.regsPerBlock = 65536;
        d.warpSize = 32;
        d.maxThreadsPerBlock = 1024;
        d.maxThreadsDim[0] = 1024; d.maxThreadsDim[1] = 1024; d.maxThreadsDim[2] = 64;
        d.maxGridSize[0] = 2147483647; d.maxGridSize[1] = 65535; d.maxGridSize[2] = 65535;
        d.maxThreadsPerMultiProcessor = 2048;
        d.multiProcessorCount = hopper ? 132 : 108;
        d.major = hopper ? 9 : 8;
        d.minor = 0;
        return d;
    }();
    return p;
}

void set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
}

static cudaError_t result(cudaError_t e) {
    set_error(e);
    return e;
}

uint64_t next_launch_number() {
    static uint64_t n = 0;
    return ++n;
}

static double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// ---- streams: queues, run in a seeded interleaving ----

static CUstream_st *stream_of(cudaStream_t s) {
    return s ? s : &legacy_stream;
}

static uint64_t enqueue_after(cudaStream_t stream, const char *what, std::function<bool()> step,
                              uint64_t extra_dep) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    CUstream_st *s = stream_of(stream);
    SimOp o{next_seq++, {}, what, std::move(step)};
    done.push_back(false);
    if (s->legacy) {
        for (CUstream_st *other : streams)
            if (other->blocking && other->last) o.deps.push_back(other->last);
    } else if (s->blocking && legacy_stream.last) {
        o.deps.push_back(legacy_stream.last);
    }
    if (extra_dep) o.deps.push_back(extra_dep);
    preds.push_back(o.deps);
    if (s->last) preds.back().push_back(s->last);
    observed.push_back(false);
    s->last = o.seq;
    s->ops.push_back(std::move(o));
    return s->last;
}

static uint64_t enqueue_after(cudaStream_t stream, const char *what, std::function<void()> op, uint64_t extra_dep) {
    return enqueue_after(stream, what, std::function<bool()>([op]() { op(); return true; }), extra_dep);
}

void enqueue(cudaStream_t stream, const char *what, std::function<void()> op) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    if (!stream_of(stream)->coupled.empty()) fail("%s, then a %s there", stream_of(stream)->coupled.c_str(), what);
    launched_kernels += !strcmp(what, "kernel");
    launched_matmuls += !strcmp(what, "cublasLtMatmul");
    launched_memsets += !strcmp(what, "cudaMemsetAsync");
    enqueue_after(stream, what, std::move(op), 0);
}

void enqueue_polled(cudaStream_t stream, const char *what, std::function<bool()> step) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    stream_of(stream)->coupled.clear();   // a communication stream orders its transfer after the others
    enqueue_after(stream, what, std::move(step), 0);
}

static bool ready(const SimOp &o) {
    for (uint64_t d : o.deps)
        if (!done[d]) return false;
    return true;
}

static bool is_observed(uint64_t seq) { return seq < observed_below || observed[seq]; }

// The operations op seq waits for, itself included, as far back as what the
// host has observed (everything before that is ordered before any new op).
static std::vector<uint64_t> unobserved_past(uint64_t seq) {
    std::vector<uint64_t> past, todo{seq};
    while (!todo.empty()) {
        const uint64_t q = todo.back();
        todo.pop_back();
        if (q == 0 || is_observed(q) || std::find(past.begin(), past.end(), q) != past.end()) continue;
        past.push_back(q);
        todo.insert(todo.end(), preds[q].begin(), preds[q].end());
    }
    return past;
}

// The host has waited for op seq: it and its past are ordered before what comes next.
static void observe(uint64_t seq) {
    for (uint64_t q : unobserved_past(seq)) {
        observed[q] = true;
        nccl_open.erase(q);
    }
}

static void observe_all() {
    observed_below = next_seq;
    nccl_open.clear();
}

// The stream that runs on, and the streams that could run when it was drawn.
static CUstream_st *running = nullptr;
static std::vector<CUstream_st *> drawn_among;

// Attempt one op: the running stream's next one, else one drawn among the
// heads of the queues that may run, together with how far its stream runs:
// this op alone, or (one draw in two) on while its next op can run and no
// other stream became able to run (its next op waited, or a polled op of it
// was not yet complete, or its queue was empty). So a stream may run ahead
// of another that nothing orders it with, or behind it, by any number of
// ops. Whether the op completed (a polled op not yet complete stays at its
// head).
static bool run_one() {
    if (!rng_ready) { stream_rng.seed(seed() * 0x9e3779b97f4a7c15ull + 7); rng_ready = true; }
    std::vector<CUstream_st *> runnable;
    for (CUstream_st *q : streams)
        if (!q->ops.empty() && ready(q->ops.front())) runnable.push_back(q);
    if (runnable.empty()) fail("internal: queued work but nothing can run");
    bool redraw = !running || std::find(runnable.begin(), runnable.end(), running) == runnable.end();
    for (CUstream_st *q : runnable)
        redraw |= std::find(drawn_among.begin(), drawn_among.end(), q) == drawn_among.end();
    CUstream_st *s = running;
    if (redraw) {
        s = runnable[stream_rng() % runnable.size()];
        running = stream_rng() % 2 ? s : nullptr;
        drawn_among = runnable;
    }
    SimOp o = std::move(s->ops.front());
    s->ops.pop_front();
    if (!o.step()) {
        s->ops.push_front(std::move(o));
        running = nullptr;
        return false;
    }
    done[o.seq] = true;
    return true;
}

// Between attempts that completed nothing (ops waiting for other
// processes): poll freely for a while, then leave the core to them.
static void stalled(long *count) {
    static const struct timespec pause = {0, 100000};
    if (++*count > 1000) nanosleep(&pause, nullptr);
}

static void run_until(uint64_t seq) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    long stalls = 0;
    while (!done[seq])
        if (run_one()) stalls = 0;
        else stalled(&stalls);
    observe(seq);
}

// Run what can run now, as a device would have meanwhile, without waiting on
// an op that cannot complete yet; whether op seq is done.
static bool progress_until(uint64_t seq) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    size_t stalls = 0;
    while (!done[seq])
        if (run_one()) stalls = 0;
        else if (++stalls > streams.size()) return false;
    return true;
}

void progress() {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    size_t stalls = 0;
    for (;;) {
        bool any = false;
        for (CUstream_st *s : streams) any |= !s->ops.empty();
        if (!any) return;
        if (run_one()) stalls = 0;
        else if (++stalls > streams.size()) return;
    }
}

void drain(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    if (stream) {
        run_until(stream->last);
        return;
    }
    long stalls = 0;
    for (;;) {
        bool any = false;
        for (CUstream_st *s : streams) any |= !s->ops.empty();
        if (!any) {
            observe_all();
            return;
        }
        if (run_one()) stalls = 0;
        else stalled(&stalls);
    }
}

void host_sync(const char *what, const void *caller) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    host_syncs[{caller, what}]++;
}

static std::string describe(const NcclOp &o) {
    char stream[64];
    snprintf(stream, sizeof stream, " (stream %p)", (void *)o.stream);
    return o.what + stream;
}

// NCCL documentation, "Using multiple NCCL communicators concurrently": NCCL
// kernels block waiting for their peers, so operations of two communicators
// in flight at the same time may deadlock unless the program orders them.
// The new op (the newest on `stream`) must come after every op of another
// communicator the host has not yet seen complete, by stream order or
// events; else one line and exit.
void nccl_enqueued(cudaStream_t stream, const std::vector<const void *> &comms, bool p2p_local, bool p2p_network,
                   const std::string &what) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    const uint64_t seq = stream_of(stream)->last;
    const NcclOp op{comms, stream, what, p2p_local, p2p_network};
    const std::vector<uint64_t> past = unobserved_past(seq);
    for (const auto &open : nccl_open) {
        bool shared = false;
        for (const void *c : open.second.comms)
            shared |= std::find(comms.begin(), comms.end(), c) != comms.end();
        if (!shared && std::find(past.begin(), past.end(), open.first) == past.end())
            fail("NCCL: %s may run at the same time as %s, with no order between them (NCCL documentation, "
                 "\"Using multiple NCCL communicators concurrently\": they may deadlock): order them by a stream or "
                 "an event", describe(op).c_str(), describe(open.second).c_str());
    }
    nccl_open[seq] = op;
    const int p = stream_of(stream)->priority;
    if (nccl_ops == 0 || p > nccl_least) nccl_least = p;
    if (nccl_ops == 0 || p < nccl_greatest) nccl_greatest = p;
    nccl_ops++;
}

// "file:line (function)" of the call that returned to `caller`, from the
// binary's debug information (addr2line); the symbol name when it has none.
static std::string call_site(const void *caller) {
    Dl_info info;
    if (!dladdr((const char *)caller - 1, &info) || !info.dli_fname) return "?";
    const ElfW(Ehdr) *elf = (const ElfW(Ehdr) *)info.dli_fbase;
    const uintptr_t at = (uintptr_t)caller - 1 - (elf->e_type == ET_DYN ? (uintptr_t)info.dli_fbase : 0);
    char cmd[4200], fn[1024] = "", line[2048] = "";
    snprintf(cmd, sizeof cmd, "addr2line -f -C -e '%s' 0x%llx 2>/dev/null", info.dli_fname, (unsigned long long)at);
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(fn, sizeof fn, p) || !fgets(line, sizeof line, p)) fn[0] = line[0] = 0;
        pclose(p);
    }
    fn[strcspn(fn, "\n")] = 0;
    line[strcspn(line, " \n")] = 0;
    if (!line[0] || line[0] == '?') return info.dli_sname ? info.dli_sname : "?";
    std::string where = line;
    char cwd[1024];
    if (getcwd(cwd, sizeof cwd) && where.compare(0, strlen(cwd) + 1, std::string(cwd) + "/") == 0)
        where.erase(0, strlen(cwd) + 1);
    return where + " (" + fn + ")";
}

// A wait of `stream` for op `until` (cudaStreamWaitEvent): an NCCL group
// completes as a unit (an event after it fires when all its operations are
// done), so a wait that newly orders the stream after a transfer between
// ranks of one node and after one between nodes (CUDASIM_NODE_RANKS) makes
// the consumer of the node-local data wait for the network. Remembered on
// the stream: its next kernel, copy or library call ends the program with
// one line (enqueue); its next NCCL operation forgets it (a communication
// stream orders a transfer after others, it consumes nothing).
static void check_coupled_wait(CUstream_st *stream, uint64_t until, const void *caller) {
    if (!until || nccl_open.empty()) return;
    const std::vector<uint64_t> had = stream->last ? unobserved_past(stream->last) : std::vector<uint64_t>{};
    const NcclOp *local = nullptr, *network = nullptr;
    for (uint64_t q : unobserved_past(until)) {
        auto it = nccl_open.find(q);
        if (it == nccl_open.end() || std::find(had.begin(), had.end(), q) != had.end()) continue;
        if (it->second.p2p_local) local = &it->second;
        if (it->second.p2p_network) network = &it->second;
    }
    char line[1024];
    if (local && network && stream->coupled.empty()) {
        snprintf(line, sizeof line, "cudaStreamWaitEvent at %s: stream %p waits at once for %s, a transfer "
                 "within the node, and for %s, a transfer between nodes (CUDASIM_NODE_RANKS): the node-local data's "
                 "consumer waits for the network", call_site(caller).c_str(), (void *)stream, describe(*local).c_str(), describe(*network).c_str());
        stream->coupled = line;
    }
}

// ---- memory ----

// Whether [p, p+bytes) lies inside one range of `ranges`.
static bool inside(const std::map<uintptr_t, size_t> &ranges, const void *p, size_t bytes) {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    const uintptr_t a = (uintptr_t)p;
    auto it = ranges.upper_bound(a);
    if (it == ranges.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
}

bool is_device(const void *p, size_t bytes) { return inside(allocations, p, bytes); }
static bool is_pinned(const void *p, size_t bytes) { return inside(pinned, p, bytes); }

// Device memory held (cudasimMemoryPeak): cudaMalloc's live bytes, the
// stream-ordered pool's live bytes and what it keeps reserved (at most its
// release threshold above the live bytes), and the peak of their sum.
static size_t malloc_live = 0, pool_live = 0, pool_reserved = 0, memory_peak = 0;
static uint64_t pool_threshold = 0;
static std::map<uintptr_t, bool> pooled;   // allocations made by cudaMallocAsync

static void *device_alloc(size_t bytes, bool from_pool) {
    void *p;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return nullptr;
    memset(p, 0xff, bytes);
    std::lock_guard<std::mutex> lock(alloc_mutex);
    allocations[(uintptr_t)p] = bytes;
    pooled[(uintptr_t)p] = from_pool;
    if (from_pool) {
        pool_live += bytes;
        if (pool_reserved < pool_live) pool_reserved = pool_live;
    } else {
        malloc_live += bytes;
    }
    if (memory_peak < malloc_live + pool_reserved) memory_peak = malloc_live + pool_reserved;
    return p;
}

static cudaError_t device_free(void *p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(alloc_mutex);
        auto it = allocations.find((uintptr_t)p);
        if (it == allocations.end()) return cudaErrorInvalidValue;
        auto from_pool = pooled.find((uintptr_t)p);
        if (from_pool->second) {
            pool_live -= it->second;
            if (pool_reserved - pool_live > pool_threshold) pool_reserved = pool_live + pool_threshold;
        } else {
            malloc_live -= it->second;
        }
        pooled.erase(from_pool);
        allocations.erase(it);
    }
    free(p);
    return cudaSuccess;
}

static void set_pool_threshold(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    pool_threshold = bytes;
}

static size_t device_memory_peak() {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    return memory_peak;
}

}  // namespace cudasim

using namespace cudasim;

extern "C" {

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    default: return "cudaErrorUnknown";
    }
}

// The toolkit's strings.
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    default: return "unknown error";
    }
}

// The node has CUDASIM_DEVICES devices (default 1), all of them copies of the
// one simulated device. The process sees those CUDA_VISIBLE_DEVICES lists, in
// its order (CUDA C++ Programming Guide, "CUDA Environment Variables"; the
// list ends at the first entry that is not a device of the node), else all;
// visible device i is the node's device visible[i] (its PCI bus id), so that
// a program choosing its GPU from its rank on the node, or bound to one GPU
// per task as Slurm does, runs as on such a node.
static const std::vector<int> &visible_devices() {
    static const std::vector<int> v = [] {
        int node = 1;
        const char *e = getenv("CUDASIM_DEVICES");
        if (e && *e) {
            char *end;
            const long n = strtol(e, &end, 10);
            if (*end || n < 1 || n > 1024) fail("CUDASIM_DEVICES=%s: expected a number of devices from 1 to 1024", e);
            node = (int)n;
        }
        std::vector<int> list;
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        if (!cvd) {
            for (int i = 0; i < node; i++) list.push_back(i);
            return list;
        }
        for (const char *p = cvd; *p;) {
            char *end;
            const long d = strtol(p, &end, 10);
            if (end == p || d < 0 || d >= node || (*end && *end != ',')) break;
            list.push_back((int)d);
            p = *end ? end + 1 : end;
        }
        return list;
    }();
    return v;
}
static int device_count() { return (int)visible_devices().size(); }
static int current_device = 0;
static bool valid_device(int device) { return device >= 0 && device < device_count(); }

cudaError_t cudaGetDevice(int *device) { *device = current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) {
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *count) {
    *count = device_count();
    return *count ? cudaSuccess : result(cudaErrorNoDevice);
}

// The node's device behind visible device `device`: "0000:NN:00.0", NN its index on the node.
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    if (!pciBusId || len < 13) return result(cudaErrorInvalidValue);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", visible_devices()[(size_t)device]);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    *prop = device_props();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    const cudaDeviceProp &p = device_props();
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return result(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    host_sync("cudaDeviceSynchronize", __builtin_return_address(0));
    drain(0);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
    static CUmemPoolHandle_st pool0{0};
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    *pool = &pool0;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
    if (!(pool && value && attr == cudaMemPoolAttrReleaseThreshold)) return result(cudaErrorInvalidValue);
    set_pool_threshold(*(const uint64_t *)value);
    return cudaSuccess;
}

cudaError_t cudasimMemoryPeak(size_t *bytes) {
    if (!bytes) return result(cudaErrorInvalidValue);
    *bytes = device_memory_peak();
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return result(cudaErrorInvalidValue);
    return result(set_max_dynamic_smem(func, value));
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, const void *func) {
    if (!func || !attr) return result(cudaErrorInvalidValue);
    func_attributes(func, attr);
    return cudaSuccess;
}

// Resident blocks per SM of the device's limits (CUDA C++ Programming Guide, "Compute Capabilities": threads
// and blocks per SM, shared memory per SM with 1 KiB reserved per block); registers are not known to the sim.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *func, int block_size,
                                                          size_t dynamic_smem) {
    if (!func || !blocks || block_size <= 0) return result(cudaErrorInvalidValue);
    const cudaDeviceProp &p = device_props();
    const int warps = (block_size + 31) / 32;
    int n = std::min(32, p.maxThreadsPerMultiProcessor / (warps * 32));
    n = std::min(n, (int)(p.sharedMemPerMultiprocessor / (dynamic_smem + 1024)));
    *blocks = n;
    return cudaSuccess;
}

// cudaMalloc and cudaFree synchronise the device (CUDA C++ Programming Guide,
// "Implicit Synchronization"): each counts as a host synchronisation.
cudaError_t cudaMalloc(void **ptr, size_t size) {
    host_sync("cudaMalloc", __builtin_return_address(0));
    *ptr = device_alloc(size, false);
    return result(*ptr ? cudaSuccess : cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *ptr) {
    host_sync("cudaFree", __builtin_return_address(0));
    drain(0);
    return result(device_free(ptr));
}

// Stream-ordered allocation (CUDA Runtime API, "Stream Ordered Memory Allocator"): the memory exists from
// the call on; the free runs in stream order.
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream) {
    (void)stream;
    *ptr = device_alloc(size, true);
    return result(*ptr ? cudaSuccess : cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
    if (ptr && !is_device(ptr, 1)) return result(cudaErrorInvalidValue);
    enqueue(stream, "cudaFreeAsync", [ptr]() {
        if (device_free(ptr) != cudaSuccess) fail("cudaFreeAsync(%p): not a live device allocation", ptr);
    });
    return cudaSuccess;
}

static cudaMemcpyKind memcpy_kind(const void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
    if (kind != cudaMemcpyDefault) return kind;
    const bool d = is_device(dst, count), s = is_device(src, count);
    return (cudaMemcpyKind)((s ? 2 : 0) | (d ? 1 : 0)) == 3 ? cudaMemcpyDeviceToDevice
           : d ? cudaMemcpyHostToDevice
           : s ? cudaMemcpyDeviceToHost
               : cudaMemcpyHostToHost;
}

static bool memcpy_sides_ok(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    return count == 0 || ((!dst_dev || is_device(dst, count)) && (!src_dev || is_device(src, count)));
}

// Host memory is pageable unless page-locked (cudaMallocHost, cudaHostAlloc,
// cudaHostRegister). CUDA Runtime API, "API synchronization behavior": an
// async copy with pinned host memory runs in stream order (the host memory is
// read or written when the copy runs, so the host must not touch it before);
// with pageable memory the driver stages it through its own pinned buffer:
// host to device is copied to the staging buffer at the call (no device
// synchronisation; the device copy runs in stream order), device to host
// returns only once the copy has completed (the stream's work first). Either
// counts as a host synchronisation: the host does the copy, and a staging
// buffer smaller than the copy makes the call wait for the device. sync:
// cudaMemcpy (waits for the device whatever the memory).
static cudaError_t memcpy_on(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream,
                             bool sync, const void *caller) {
    kind = memcpy_kind(dst, src, count, kind);
    if ((int)kind < 0 || (int)kind > 4 || !memcpy_sides_ok(dst, src, count, kind)) return result(cudaErrorInvalidValue);
    if (count == 0) return cudaSuccess;
    const void *host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : nullptr;
    const bool pageable = kind == cudaMemcpyHostToHost || (host && !is_pinned(host, count));
    if (sync) host_sync("cudaMemcpy", caller);
    else if (pageable) host_sync("cudaMemcpyAsync with pageable host memory", caller);
    if (kind == cudaMemcpyHostToHost || (kind == cudaMemcpyDeviceToHost && (sync || pageable))) {
        drain(stream);
        memmove(dst, src, count);
    } else if (kind == cudaMemcpyHostToDevice && pageable) {
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                    (const unsigned char *)src + count);
        enqueue(stream, "cudaMemcpyAsync", [dst, staged]() { memcpy(dst, staged->data(), staged->size()); });
    } else {
        enqueue(stream, "cudaMemcpyAsync", [dst, src, count]() { memmove(dst, src, count); });
    }
    if (sync) drain(0);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    return memcpy_on(dst, src, count, kind, stream, false, __builtin_return_address(0));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return memcpy_on(dst, src, count, kind, 0, true, __builtin_return_address(0));
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
    if (count && !is_device(ptr, count)) return result(cudaErrorInvalidValue);
    enqueue(stream, "cudaMemsetAsync", [ptr, value, count]() { memset(ptr, value, count); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    host_sync("cudaMemset", __builtin_return_address(0));
    const cudaError_t e = cudaMemsetAsync(ptr, value, count, 0);
    if (e == cudaSuccess) drain(0);
    return e;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    if (leastPriority) *leastPriority = LEAST_PRIORITY;
    if (greatestPriority) *greatestPriority = GREATEST_PRIORITY;
    return cudaSuccess;
}

// A priority outside the device's range is clamped to it (CUDA Runtime API,
// cudaStreamCreateWithPriority). Lower numbers are higher priorities.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority) {
    if (!stream) return result(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    CUstream_st *s = new CUstream_st{false, !(flags & cudaStreamNonBlocking), {}, 0, 0, {}};
    s->priority = priority > LEAST_PRIORITY ? LEAST_PRIORITY : priority < GREATEST_PRIORITY ? GREATEST_PRIORITY : priority;
    streams.push_back(s);
    *stream = s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    return cudaStreamCreateWithPriority(stream, flags, LEAST_PRIORITY);
}
cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
    if (!priority) return result(cudaErrorInvalidValue);
    *priority = stream_of(stream)->priority;
    return cudaSuccess;
}

// Work queued on a destroyed stream still completes (CUDA Runtime API, cudaStreamDestroy).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    drain(stream);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == stream) streams.erase(streams.begin() + (long)i);
    if (running == stream) running = nullptr;
    drawn_among.clear();
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    host_sync("cudaStreamSynchronize", __builtin_return_address(0));
    drain(stream);
    return cudaSuccess;
}

// Later work on `stream` waits for the event's most recent record (none: no wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!event || flags) return result(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    check_coupled_wait(stream_of(stream), event->recorded, __builtin_return_address(0));
    enqueue_after(stream, "cudaStreamWaitEvent", []() {}, event->recorded);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { *event = new CUevent_st; return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    return cudaEventCreate(event);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) { delete event; return cudaSuccess; }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return result(cudaErrorInvalidResourceHandle);
    event->recorded = enqueue_after(stream, "cudaEventRecord", [event]() { event->ms = now_ms(); }, 0);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event) return result(cudaErrorInvalidResourceHandle);
    host_sync("cudaEventSynchronize", __builtin_return_address(0));
    run_until(event->recorded);
    return cudaSuccess;
}

// The device runs behind the host: a record not complete when the query
// begins answers cudaErrorNotReady, while what can run up to it runs (as the
// device would have meanwhile), so a later query may find it done. Like every
// answer other than cudaSuccess, cudaErrorNotReady becomes the host thread's
// last error (CUDA Runtime API, cudaGetLastError), until cudaGetLastError.
// The first query of each record counts as a host synchronisation: a host
// polls to wait for the event (as the NCCL watchdog does).
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    if (event->queried != event->recorded) host_sync("cudaEventQuery (a poll until the event)", __builtin_return_address(0));
    event->queried = event->recorded;
    const bool was_done = done[event->recorded];
    if (!(progress_until(event->recorded) && was_done)) return result(cudaErrorNotReady);
    observe(event->recorded);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end || !start->recorded || !end->recorded) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    if (!done[start->recorded] || !done[end->recorded]) return result(cudaErrorNotReady);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

// Page-locked host memory (CUDA Runtime API, cudaMallocHost, cudaHostAlloc,
// cudaHostRegister): ordinary host memory whose range the sim remembers, so
// that async copies with it run in stream order (memcpy_on).
static void pin(void *p, size_t bytes) {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    pinned[(uintptr_t)p] = bytes ? bytes : 1;
}
static bool unpin(void *p) {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    return pinned.erase((uintptr_t)p) == 1;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
    if (!ptr || flags) return result(cudaErrorInvalidValue);
    if (posix_memalign(ptr, 4096, size ? size : 1) != 0) return result(cudaErrorMemoryAllocation);
    pin(*ptr, size);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

// The device is synchronised first: a copy in flight may still use the memory.
cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    host_sync("cudaFreeHost", __builtin_return_address(0));
    drain(0);
    if (!unpin(ptr)) return result(cudaErrorInvalidValue);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    if (!ptr || !size || flags) return result(cudaErrorInvalidValue);
    if (is_pinned(ptr, 1) || is_pinned((char *)ptr + size - 1, 1)) return result(cudaErrorHostMemoryAlreadyRegistered);
    pin(ptr, size);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr) {
    host_sync("cudaHostUnregister", __builtin_return_address(0));
    drain(0);
    return unpin(ptr) ? cudaSuccess : result(cudaErrorHostMemoryNotRegistered);
}

// ---- extensions of the sim (no toolkit counterpart) ----

void cudasim_host_syncs_reset(void) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    host_syncs.clear();
    nccl_ops = 0;
    launched_kernels = launched_matmuls = launched_memsets = 0;
}

long cudasim_host_syncs(FILE *sites) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    std::map<std::string, long> lines;
    long total = 0;
    for (const auto &h : host_syncs) {
        total += h.second;
        if (sites) lines[call_site(h.first.first) + ": " + h.first.second] += h.second;
    }
    for (const auto &l : lines) fprintf(sites, "  %s: %ld\n", l.first.c_str(), l.second);
    return total;
}

long cudasim_device_launches(long *kernels, long *matmuls, long *memsets) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    *kernels = launched_kernels;
    *matmuls = launched_matmuls;
    *memsets = launched_memsets;
    return launched_kernels + launched_matmuls + launched_memsets;
}

long cudasim_nccl_priorities(int *least, int *greatest) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    *least = nccl_least;
    *greatest = nccl_greatest;
    return nccl_ops;
}

}  // extern "C"
