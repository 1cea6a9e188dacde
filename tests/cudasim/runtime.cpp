// runtime.cpp: the host side of the sim's CUDA runtime. Device memory is host
// memory (posix_memalign per allocation, exactly the size asked, so that AddressSanitizer sees every
// out-of-bounds access; filled with 0xFF, NaN, as cudaMalloc leaves it
// undefined). Streams are queues of operations run lazily, when a host call
// must wait, in an interleaving drawn from CUDASIM_SEED that respects stream
// order, the legacy default stream's implicit synchronisation (CUDA Runtime
// API, "Stream synchronization behavior") and cudaStreamWaitEvent.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
};
struct SimOp {
    uint64_t seq;
    std::vector<uint64_t> deps;
    const char *what;
    std::function<bool()> step;   // one attempt; true when the operation is complete
};
struct CUevent_st {
    uint64_t recorded = 0;    // sequence number of the recording op, 0 = never recorded
    double ms = 0;            // wall clock when it ran
};
struct CUmemPoolHandle_st {
    int device;
};

namespace cudasim {

static std::recursive_mutex host_mutex;   // one host call at a time
static CUstream_st legacy_stream{true, true, {}, 0};
static std::vector<CUstream_st *> streams{&legacy_stream};
static std::vector<bool> done{true};      // done[seq]; seq 0 = "nothing"
static uint64_t next_seq = 1;
static std::mt19937_64 stream_rng;
static bool rng_ready = false;
static thread_local cudaError_t last_error = cudaSuccess;
static std::map<uintptr_t, size_t> allocations;
static std::mutex alloc_mutex;

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
        snprintf(d.name, sizeof d.name, "cudasim A100-SXM4-80GB (CPU execution model)");
        d.totalGlobalMem = (size_t)80 << 30;
        d.sharedMemPerBlock = 48 * 1024;
        d.sharedMemPerBlockOptin = 163 * 1024;
        d.sharedMemPerMultiprocessor = 164 * 1024;
        d.regsPerBlock = 65536;
        d.warpSize = 32;
        d.maxThreadsPerBlock = 1024;
        d.maxThreadsDim[0] = 1024; d.maxThreadsDim[1] = 1024; d.maxThreadsDim[2] = 64;
        d.maxGridSize[0] = 2147483647; d.maxGridSize[1] = 65535; d.maxGridSize[2] = 65535;
        d.maxThreadsPerMultiProcessor = 2048;
        d.multiProcessorCount = 108;
        d.major = 8;
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
    s->last = o.seq;
    s->ops.push_back(std::move(o));
    return s->last;
}

static uint64_t enqueue_after(cudaStream_t stream, const char *what, std::function<void()> op, uint64_t extra_dep) {
    return enqueue_after(stream, what, std::function<bool()>([op]() { op(); return true; }), extra_dep);
}

void enqueue(cudaStream_t stream, const char *what, std::function<void()> op) {
    enqueue_after(stream, what, std::move(op), 0);
}

void enqueue_polled(cudaStream_t stream, const char *what, std::function<bool()> step) {
    enqueue_after(stream, what, std::move(step), 0);
}

static bool ready(const SimOp &o) {
    for (uint64_t d : o.deps)
        if (!done[d]) return false;
    return true;
}

// Attempt one op chosen at random among the heads of the queues that may
// run; whether it completed (a polled op not yet complete stays at its head).
static bool run_one() {
    if (!rng_ready) { stream_rng.seed(seed() * 0x9e3779b97f4a7c15ull + 7); rng_ready = true; }
    std::vector<CUstream_st *> runnable;
    for (CUstream_st *s : streams)
        if (!s->ops.empty() && ready(s->ops.front())) runnable.push_back(s);
    if (runnable.empty()) fail("internal: queued work but nothing can run");
    CUstream_st *s = runnable[stream_rng() % runnable.size()];
    SimOp o = std::move(s->ops.front());
    s->ops.pop_front();
    if (!o.step()) {
        s->ops.push_front(std::move(o));
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
        if (!any) return;
        if (run_one()) stalls = 0;
        else stalled(&stalls);
    }
}

// ---- memory ----

bool is_device(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    const uintptr_t a = (uintptr_t)p;
    auto it = allocations.upper_bound(a);
    if (it == allocations.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
}

static void *device_alloc(size_t bytes) {
    void *p;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return nullptr;
    memset(p, 0xff, bytes);
    std::lock_guard<std::mutex> lock(alloc_mutex);
    allocations[(uintptr_t)p] = bytes;
    return p;
}

static cudaError_t device_free(void *p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(alloc_mutex);
        auto it = allocations.find((uintptr_t)p);
        if (it == allocations.end()) return cudaErrorInvalidValue;
        allocations.erase(it);
    }
    free(p);
    return cudaSuccess;
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
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
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
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "unknown error";
    }
}

// The devices this process sees: CUDASIM_DEVICES (default 1), all of them
// names of the one simulated device, so that a program choosing its GPU from
// its rank on the node can be run as on a node with that many GPUs.
static int device_count() {
    static const int n = [] {
        const char *e = getenv("CUDASIM_DEVICES");
        if (!e || !*e) return 1;
        char *end;
        const long v = strtol(e, &end, 10);
        if (*end || v < 1 || v > 1024) fail("CUDASIM_DEVICES=%s: expected a number of devices from 1 to 1024", e);
        return (int)v;
    }();
    return n;
}
static int current_device = 0;
static bool valid_device(int device) { return device >= 0 && device < device_count(); }

cudaError_t cudaGetDevice(int *device) { *device = current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) {
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *count) { *count = device_count(); return cudaSuccess; }

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

cudaError_t cudaDeviceSynchronize(void) { drain(0); return cudaSuccess; }

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
    static CUmemPoolHandle_st pool0{0};
    if (!valid_device(device)) return result(cudaErrorInvalidDevice);
    *pool = &pool0;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
    return result(pool && value && attr == cudaMemPoolAttrReleaseThreshold ? cudaSuccess : cudaErrorInvalidValue);
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return result(cudaErrorInvalidValue);
    return result(set_max_dynamic_smem(func, value));
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
    *ptr = device_alloc(size);
    return result(*ptr ? cudaSuccess : cudaErrorMemoryAllocation);
}

// cudaFree synchronises the device (CUDA Runtime API, cudaFree).
cudaError_t cudaFree(void *ptr) {
    drain(0);
    return result(device_free(ptr));
}

// Stream-ordered allocation (CUDA Runtime API, "Stream Ordered Memory Allocator"): the memory exists from
// the call on; the free runs in stream order.
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream) {
    (void)stream;
    *ptr = device_alloc(size);
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

// Pageable host memory (the only host memory the sim has): host -> device is staged at the call, device ->
// host waits for the stream and copies at once (CUDA Runtime API, "API synchronization behavior").
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    kind = memcpy_kind(dst, src, count, kind);
    if ((int)kind < 0 || (int)kind > 4 || !memcpy_sides_ok(dst, src, count, kind)) return result(cudaErrorInvalidValue);
    if (count == 0) return cudaSuccess;
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost) {
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                    (const unsigned char *)src + count);
        enqueue(stream, "cudaMemcpyAsync", [dst, staged]() { memcpy(dst, staged->data(), staged->size()); });
    } else if (kind == cudaMemcpyDeviceToHost) {
        drain(stream);
        memcpy(dst, src, count);
    } else {
        enqueue(stream, "cudaMemcpyAsync", [dst, src, count]() { memmove(dst, src, count); });
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    const cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, 0);
    if (e == cudaSuccess) drain(0);
    return e;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
    if (count && !is_device(ptr, count)) return result(cudaErrorInvalidValue);
    enqueue(stream, "cudaMemsetAsync", [ptr, value, count]() { memset(ptr, value, count); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    const cudaError_t e = cudaMemsetAsync(ptr, value, count, 0);
    if (e == cudaSuccess) drain(0);
    return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    CUstream_st *s = new CUstream_st{false, !(flags & cudaStreamNonBlocking), {}, 0};
    streams.push_back(s);
    *stream = s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

// Work queued on a destroyed stream still completes (CUDA Runtime API, cudaStreamDestroy).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    drain(stream);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == stream) streams.erase(streams.begin() + (long)i);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { drain(stream); return cudaSuccess; }

// Later work on `stream` waits for the event's most recent record (none: no wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!event || flags) return result(cudaErrorInvalidValue);
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
    run_until(event->recorded);
    return cudaSuccess;
}

// The device runs behind the host: a record not complete when the query
// begins answers cudaErrorNotReady, while what can run up to it runs (as the
// device would have meanwhile), so a later query may find it done. Like every
// answer other than cudaSuccess, cudaErrorNotReady becomes the host thread's
// last error (CUDA Runtime API, cudaGetLastError), until cudaGetLastError.
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    const bool was_done = done[event->recorded];
    return result(progress_until(event->recorded) && was_done ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end || !start->recorded || !end->recorded) return result(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(host_mutex);
    if (!done[start->recorded] || !done[end->recorded]) return result(cudaErrorNotReady);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

}  // extern "C"
