// attention_cuda_ring.c: the CUDA op's attention_cuda_set_ring
// (attention_api.h): the device ring made (ring_cuda_new) and bound. Apart
// from attention_cuda_op.cu so that the programs that link only the CUDA
// objects (the GPU tests) need no MPI.
#ifdef MTRAIN_CUDA

#include "attention_cuda_op.h"

bool attention_cuda_set_ring(AttnState *st, const struct Comm *cp, int inner) {
    const AttnRingCuda ring = ring_cuda_new(cp, inner);
    return attention_cuda_bind_ring(st, &ring);
}

#endif
