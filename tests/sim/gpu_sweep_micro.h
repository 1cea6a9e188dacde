// gpu_sweep_micro.h: the micro-benchmarks of gpu_sweep_attention
// (gpu_sweep_micro.cu): the rates the attention cost model
// (attention/kernels/kernel_cost.c) takes per SM, measured on the GPU at hand.
#ifndef MTRAIN_GPU_SWEEP_MICRO_H
#define MTRAIN_GPU_SWEEP_MICRO_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double sm_clock_mhz;              // clock64 cycles over event time, every SM busy
    double mma_tflops, mma_per_sm_clock;   // mma.sync.m16n8k16 bf16, 4 independent per warp
    double ldmatrix_bytes_per_sm_clock;    // ldmatrix.x4, conflict-free rows
    double exp2_per_sm_clock;              // ex2.approx, 8 independent chains per thread
    double scalar_atomics_per_s;           // fp32 atomicAdd, consecutive lanes on consecutive floats
    double vector_atomics_per_s;           // float4 atomicAdd (sm_90 and later; 0 elsewhere), floats per second
} SweepMicro;

// Every micro-benchmark: `blocks` blocks of 256 threads; per thread mma.sync
// `iterations` x 4, ldmatrix iterations / 128, exp2 and atomics iterations / 2
// (x 8 chains for exp2); the clock iterations x 200 cycles per block.
void sweep_micro(int blocks, int iterations, SweepMicro *out);

#ifdef __cplusplus
}
#endif

#endif
