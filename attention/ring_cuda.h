// ring_cuda.h: ring attention on device buffers (ring_cuda.c), for the CUDA
// attention op (attention_cuda_op.cu): the schedules of ring.c over a
// RingMemory on the GPU, where K/V travel as bf16 and the dK/dV accumulators
// as fp32 through dist/comm_device.h's exchange (NCCL on a communication
// stream, or host-staged MPI under parallel.comm: mpi), with the dense
// kernels of attention_cuda.h per ring step. C, callable from the .cu files
// (no MPI in this header). Every call is enqueued on the op's stream.
#ifndef MTRAIN_RING_CUDA_H
#define MTRAIN_RING_CUDA_H

#include <stdbool.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Comm;
typedef struct RingCuda RingCuda;

// Ranks of cp (1 for NULL), for the .cu files that cannot see a Comm.
int ring_cuda_group_size(const struct Comm *cp);
// The ring over cp (more than one rank) with inner ranks per inner ring;
// ring_send selected sends only the key blocks later holders read.
RingCuda *ring_cuda_new(const struct Comm *cp, int inner, RingSend send);
void ring_cuda_free(RingCuda *rc);
// A new sequence: this rank's positions pos [tokens] (host). Collective over cp.
void ring_cuda_sequence(RingCuda *rc, const int64_t *pos, int64_t tokens);
// q [T, Hq, D], k, v [T, Hkv, D] bf16: o_acc [T, Hq, D] fp32 and lse [Hq, T]
// over every rank's keys (written).
void ring_cuda_forward(RingCuda *rc, const AttnShape *shape, const uint16_t *q, const uint16_t *k,
                       const uint16_t *v, float *o_acc, float *lse, cudaStream_t stream);
// From o, dout [T, Hq, D] bf16 and lse: dq_acc [T, Hq, D], this rank's
// dk_acc, dv_acc [T, Hkv, D] (fp32) accumulated (+=) over every rank's queries.
void ring_cuda_backward(RingCuda *rc, const AttnShape *shape, const uint16_t *q, const uint16_t *k,
                        const uint16_t *v, const uint16_t *o, const float *lse, const uint16_t *dout,
                        float *dq_acc, float *dk_acc, float *dv_acc, cudaStream_t stream);
// Bytes this rank sent in the ring since the sequence began.
double ring_cuda_bytes(const RingCuda *rc);

#ifdef __cplusplus
}
#endif

#endif
