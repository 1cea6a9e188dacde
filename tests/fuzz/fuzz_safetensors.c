// fuzz_safetensors.c: libFuzzer target for .safetensors: the header is
// validated, then every tensor is read as fp32 with its own shape.
#include "fuzz.h"

#include <stdlib.h>

#include "../../dist/util.h"
#include "../../model/safetensors.h"

static void read_safetensors(const char *path) {
    SafeTensors st;
    st_open(&st, path);
    for (int i = 0; i < st.count; i++) {
        const StTensor *t = &st.tensors[i];
        float *values = xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
        st_read_f32(&st, t->name, t->ndim, t->shape, values);
        free(values);
    }
    st_close(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_read(data, size, ".safetensors", read_safetensors);
    return 0;
}
