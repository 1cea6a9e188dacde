// attn_case.h: the cases of the dense attention test programs
// (gpu_test_attention.c, gpu_test_sm90.c): n tokens, head dim and heads; the
// queries the whole sequence (world 1) or one rank's chunk of a striped
// layout, the key chunks in ring order from that rank; documents at the
// program's DOC_STARTS. A program defines LAYOUT_BLOCK (tokens per layout
// block) and DOC_STARTS before including it, and sets d_doc_starts (DOC_STARTS
// on the device) in main. Include after attention.h and layout.h.
#ifndef MTRAIN_ATTN_CASE_H
#define MTRAIN_ATTN_CASE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t n;       // sequence length
    int D, Hq, Hkv;
    int world;       // 1: queries and keys are the whole sequence; else striped chunks
    int rank;        // the queries' rank (world > 1); chunks come in ring order from it
    int docs;        // 1: documents at DOC_STARTS; 0: one document
} Case;

static const int64_t *d_doc_starts;   // DOC_STARTS on the device (main)

// The shape of Tq queries against a chunk of Tk keys (Tk = 0: the queries' own, for initialisation).
static AttnShape shape_of(const Case *c, int64_t Tq, int64_t Tk) {
    int64_t count = 0;
    while (c->docs && count < (int64_t)(sizeof DOC_STARTS / sizeof DOC_STARTS[0]) && DOC_STARTS[count] < c->n)
        count++;
    return (AttnShape){Tq, Tk, c->Hq, c->Hkv, c->D, LAYOUT_BLOCK, 1.0f / sqrtf((float)c->D),
                       count > 0 ? DOC_STARTS : NULL, count, count > 0 ? d_doc_starts : NULL};
}

// Positions pos [n] of key chunk i in ring order (chunk 0: the queries' own); returns its tokens.
static int64_t case_chunk_positions(const Case *c, int i, int64_t *pos) {
    if (c->world == 1) {
        for (int64_t t = 0; t < c->n; t++) pos[t] = t;
        return c->n;
    }
    const int r = ((c->rank - i) % c->world + c->world) % c->world;
    return layout_rank_positions(LAYOUT_STRIPED, c->n, LAYOUT_BLOCK, c->world, r, pos);
}

#endif
