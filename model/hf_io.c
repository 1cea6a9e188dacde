// hf_io.c: parameters from and to safetensors files under HF tensor names.
#include "hf_io.h"

#include <stdlib.h>

void model_load_safetensors(Model *m, const char *path) {
    SafeTensors st;
    st_open(&st, path);
    float *host = xmalloc(sizeof(float) * (size_t)m->total_params);
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        if (!st_find(&st, p->name))
            fail("%s: tensor '%s' is missing (expected shape [%lld%s%lld])", path, p->name, (long long)p->shape[0],
                 p->ndim == 2 ? ", " : "", p->ndim == 2 ? (long long)p->shape[1] : 0LL);
        st_read_f32(&st, p->name, p->ndim, p->shape, host + p->offset);
    }
    st_close(&st);
    m->be->upload(m->param_mem, host, sizeof(float) * (size_t)m->total_params);
    free(host);
}

void model_write_safetensors(const Model *m, float *arena, const char *path, StDtype dtype) {
    float *host = xmalloc(sizeof(float) * (size_t)m->total_params);
    m->be->download(host, arena, sizeof(float) * (size_t)m->total_params);
    StWriteTensor *tensors = xcalloc((size_t)m->num_params, sizeof(StWriteTensor));
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->params[i];
        tensors[i].name = p->name;
        tensors[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) tensors[i].shape[d] = p->shape[d];
        tensors[i].data = host + p->offset;
    }
    st_write(path, tensors, m->num_params, dtype);
    free(tensors);
    free(host);
}
