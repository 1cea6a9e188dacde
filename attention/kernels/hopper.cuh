// hopper.cuh: PTX wrappers for the Hopper (sm_90) instructions of the
// attention kernels: mbarrier (init, arrive, arrive with expect-tx, waits on a
// phase parity), bulk copies and bulk tensor copies (TMA) completing on an
// mbarrier, wgmma.mma_async m64nNk16 (bf16 in, fp32 accumulate; N 64, 128,
// 256) with shared-memory matrix descriptors, its fence / commit / wait, and
// setmaxnreg; and what the sm_90 attention kernels share (a warp's position
// bounds, the host's tensor maps of [T][H D] bf16). nvcc compiles the
// wrappers for the arch-specific target sm_90a only (wgmma and setmaxnreg
// need it: -gencode arch=compute_90a,code=sm_90a; device code for other
// targets does not see them); under the CPU execution model of CUDA
// (-D__CUDASIM__) each calls the sim's implementation of the same
// instruction (tests/sim/cudasim/grid.cpp; the rules in docs/SIM.md).
#ifndef MTRAIN_HOPPER_CUH
#define MTRAIN_HOPPER_CUH

#include <cuda.h>
#include <stdint.h>

#include "../../dist/cuda_check.h"
#include "flash_tiles.cuh"

#if defined(__CUDASIM__) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- mbarrier (PTX ISA, "mbarrier"): a 64-bit object in shared memory ----

// count arrivals complete a phase (with the bytes announced by expect-tx).
__device__ __forceinline__ void mbarrier_init(uint64_t *bar, unsigned count) {
#ifdef __CUDASIM__
    cudasim::mbarrier_init(bar, count);
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}

// After the CTA's mbarrier_init calls, before a __syncthreads: the initialisations visible to the bulk copies
// (the async proxy) that complete on the barriers. The sim's barriers are visible to them at once.
__device__ __forceinline__ void mbarrier_init_fence() {
#ifndef __CUDASIM__
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival on the current phase.
__device__ __forceinline__ void mbarrier_arrive(uint64_t *bar) {
#ifdef __CUDASIM__
    cudasim::mbarrier_arrive(bar, 0);
#else
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
#endif
}

// The current phase also waits for `bytes` bytes of bulk copies, then one arrival.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t *bar, unsigned bytes) {
#ifdef __CUDASIM__
    cudasim::mbarrier_arrive(bar, bytes);
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
#endif
}

// Has the phase of parity `parity` completed? (does not wait)
__device__ __forceinline__ bool mbarrier_test_wait(uint64_t *bar, unsigned parity) {
#ifdef __CUDASIM__
    return cudasim::mbarrier_test_wait_parity(bar, parity);
#else
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    return done != 0;
#endif
}

// Wait until the phase of parity `parity` has completed (try_wait in a loop).
__device__ __forceinline__ void mbarrier_wait(uint64_t *bar, unsigned parity) {
#ifdef __CUDASIM__
    cudasim::mbarrier_wait_parity(bar, parity);
#else
    asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
}

// ---- bulk copies global -> shared completing their bytes on an mbarrier (PTX ISA, "cp.async.bulk",
// "cp.async.bulk.tensor"): the data is the program's once the barrier's phase has completed ----

// `bytes` (a multiple of 16) from 16-byte aligned gmem to 16-byte aligned smem.
__device__ __forceinline__ void bulk_copy(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
#ifdef __CUDASIM__
    cudasim::bulk_copy(smem, gmem, bytes, bar);
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_addr(smem)), "l"(gmem), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#endif
}

// The box of the tensor map (cuTensorMapEncodeTiled, rank 1) at element c0, into 128-byte aligned smem.
__device__ __forceinline__ void tma_load_1d(void *smem, const CUtensorMap *map, int c0, uint64_t *bar) {
#ifdef __CUDASIM__
    const int coords[1] = {c0};
    cudasim::bulk_tensor_load(smem, map, coords, 1, bar);
#else
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n"
                 :: "r"(smem_addr(smem)), "l"(map), "r"(c0), "r"(smem_addr(bar)) : "memory");
#endif
}

// The box of the tensor map (rank 2) whose first element is (c0 in the contiguous dimension, c1).
__device__ __forceinline__ void tma_load_2d(void *smem, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
#ifdef __CUDASIM__
    const int coords[2] = {c0, c1};
    cudasim::bulk_tensor_load(smem, map, coords, 2, bar);
#else
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(smem_addr(smem)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)) : "memory");
#endif
}

// After this thread's generic writes to shared memory (stores; cp.async once waited for) that the async proxy
// (wgmma operands, bulk copies) reads later: orders them before those reads (PTX ISA, "fence.proxy.async").
// The sim has one proxy: nothing to order.
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifndef __CUDASIM__
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): a warpgroup (128 threads,
// warps 4i..4i+3) computes D (64 x N, fp32) = A (64 x 16) B (16 x N) (+ D), A and B K-major bf16 ----

// The swizzle mode field of a shared-memory matrix descriptor.
enum WgmmaSwizzle { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };

// The matrix descriptor of a K-major operand at smem: leading_bytes between core matrices adjacent in K
// (unused with a swizzle), stride_bytes between groups of 8 rows (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t wgmma_descriptor(const void *smem, uint32_t leading_bytes, uint32_t stride_bytes,
                                                     WgmmaSwizzle swizzle) {
    return (uint64_t)((smem_addr(smem) & 0x3ffff) >> 4) | (uint64_t)((leading_bytes & 0x3ffff) >> 4) << 16 |
           (uint64_t)((stride_bytes & 0x3ffff) >> 4) << 32 | (uint64_t)swizzle << 62;
}

// Before the first wgmma_bf16 and between the warpgroup's register accesses and a wgmma_bf16.
__device__ __forceinline__ void wgmma_fence() {
#ifdef __CUDASIM__
    cudasim::wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// The wgmma_bf16 calls since the last commit make one group.
__device__ __forceinline__ void wgmma_commit_group() {
#ifdef __CUDASIM__
    cudasim::wgmma_commit_group();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Wait until at most N committed groups are in flight: only then are their accumulators the thread's.
template <int N> __device__ __forceinline__ void wgmma_wait_group() {
#ifdef __CUDASIM__
    cudasim::wgmma_wait_group(N);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
#endif
}

// The accumulators of wgmma with M a thread: their PTX register list and their asm operands.
#define WGMMA_D32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_D32_OPERANDS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
    "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
    "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
    "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_D64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63"
#define WGMMA_D64_OPERANDS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
    "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
    "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
    "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
    "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
    "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
    "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_D128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
    "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
    "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
    "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_D128_OPERANDS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
    "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
    "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
    "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
    "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
    "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
    "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), \
    "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), \
    "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), \
    "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), \
    "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
    "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), \
    "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
    "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), \
    "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// d (the thread's N/2 accumulators; row 16 warp + lane/4 + 8 ((i%4)/2), column 8 (i/4) + 2 (lane%4) + i%2) =
// A B (+ d when accumulate), A and B through matrix descriptors.
template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, bool accumulate) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_bf16: N is 64, 128 or 256");
#ifdef __CUDASIM__
    cudasim::wgmma_bf16(d, N, a_desc, nullptr, b_desc, false, accumulate);
#else
    if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_D32
                     "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : WGMMA_D32_OPERANDS(d)
                     : "l"(a_desc), "l"(b_desc), "r"((int)accumulate));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_D64
                     "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WGMMA_D64_OPERANDS(d)
                     : "l"(a_desc), "l"(b_desc), "r"((int)accumulate));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WGMMA_D128
                     "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : WGMMA_D128_OPERANDS(d)
                     : "l"(a_desc), "l"(b_desc), "r"((int)accumulate));
    }
#endif
}

// The same with A from registers: a[4] as mma.m16n8k16's A fragment of the warp's rows 16 warp .. 16 warp + 15.
// B_MN_MAJOR: B's descriptor is of the transposed (MN-major) layout, N contiguous (imm-trans-b 1).
template <int N, bool B_MN_MAJOR = false>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                              bool accumulate) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_bf16_rs: N is 64, 128 or 256");
#ifdef __CUDASIM__
    cudasim::wgmma_bf16(d, N, 0, a, b_desc, B_MN_MAJOR, accumulate);
#else
    if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_D32
                     "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : WGMMA_D32_OPERANDS(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"((int)accumulate),
                       "n"((int)B_MN_MAJOR));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_D64
                     "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                     : WGMMA_D64_OPERANDS(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"((int)accumulate),
                       "n"((int)B_MN_MAJOR));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WGMMA_D128
                     "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
                     : WGMMA_D128_OPERANDS(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"((int)accumulate),
                       "n"((int)B_MN_MAJOR));
    }
#endif
}

// ---- setmaxnreg (PTX ISA, "setmaxnreg"): the registers per thread of the calling warpgroup, a multiple of 8
// in [24, 256] ----

template <int COUNT> __device__ __forceinline__ void setmaxnreg_inc() {
#ifdef __CUDASIM__
    cudasim::setmaxnreg(COUNT, true);
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(COUNT));
#endif
}
template <int COUNT> __device__ __forceinline__ void setmaxnreg_dec() {
#ifdef __CUDASIM__
    cudasim::setmaxnreg(COUNT, false);
#else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(COUNT));
#endif
}

// ---- shared by the sm_90 attention kernels (flash_sm90.cu, flash_sm90_backward.cu, flash_sm90_sparse.cu) ----

// Min and max over the warp of a (lanes with !valid left out); every lane gets them.
static __device__ __forceinline__ void warp_bounds(int64_t a, bool valid_a, int64_t b, bool valid_b, int64_t *lo,
                                            int64_t *hi) {
    int64_t mn = min(valid_a ? a : INT64_MAX, valid_b ? b : INT64_MAX);
    int64_t mx = max(valid_a ? a : INT64_MIN, valid_b ? b : INT64_MIN);
    for (int off = 16; off > 0; off /= 2) {
        mn = min(mn, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)mn, off));
        mx = max(mx, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)mx, off));
    }
    *lo = mn;
    *hi = mx;
}

#endif  // sm_90a or the sim

// ---- host side ----

// x [T][H D] bf16 as a 2D tensor map of boxes of 64 elements x 64 rows, 128-byte swizzle.
static inline CUtensorMap tensor_map(const uint16_t *x, int64_t T, int H, int D) {
    typedef CUresult (*Encode)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                               const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                               CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static Encode encode = NULL;
    if (!encode) {
        enum cudaDriverEntryPointQueryResult found;
        void *fn = NULL;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        CHECK(found == cudaDriverEntryPointSuccess && fn, "attention (sm_90): the driver has no cuTensorMapEncodeTiled");
        encode = (Encode)fn;
    }
    CUtensorMap map;
    const cuuint64_t dim[2] = {(cuuint64_t)H * D, (cuuint64_t)T}, stride[1] = {(cuuint64_t)H * D * 2};
    const cuuint32_t box[2] = {64, 64}, step[2] = {1, 1};
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)x, dim, stride, box, step,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CHECK(r == CUDA_SUCCESS, "attention (sm_90): cuTensorMapEncodeTiled of a [%lld][%d] tensor: error %d",
          (long long)T, H * D, (int)r);
    return map;
}

#endif
