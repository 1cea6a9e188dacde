// ring_plan.h: the geometry of the ring schedules (ring.h), without MPI:
// where a rank sits, which chunk it holds at each step, and which tokens of
// a chunk a K/V or dK/dV message carries under ring_send selected; and
// ring_send_tokens, the byte planner built on it. ring.c moves the messages
// this geometry describes.
#ifndef MTRAIN_RING_PLAN_H
#define MTRAIN_RING_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "ring.h"

// Where a rank sits and who its neighbours are; cp rank = o * inner + i.
typedef struct {
    int inner, outer, o, i;
    int inner_next, inner_prev, outer_next, outer_prev;
    int64_t kv;                // floats of K (or V) per token: Hkv * D
} Place;

// The holdings of a chunk (outer steps [o_from, o_to) x inner steps
// [i_from, i_to) of its journey) whose key-block needs one message serves.
// Holding (0, 0) is the chunk's owner, which no message serves: K/V start
// there, and the owner's own dK/dV contribution stays home.
typedef struct {
    int o_from, o_to, i_from, i_to;
} Holdings;

// The cp rank at outer place o, inner place i (both taken modulo the ring).
int ring_rank_at(const Place *p, int o, int i);
// Rank r's place in the ring, for chunks of kv floats per token and tensor.
Place ring_place(const Ring *ring, int r, int64_t kv);
// The chunk (its owner's cp rank) held at outer step so, inner step si.
int ring_chunk_at(const Place *p, int so, int si);
// K/V delivered to holding (so, si) serve the holders it reaches: via the
// inner ring (si > 0) inner steps si .. inner-1 of outer step so; via the
// outer ring (si == 0) every holding of outer steps so .. outer-1.
Holdings ring_kv_serves(const Place *p, int so, int si);
// The tokens of chunk c (local indices, ascending, into sel [counts[c]]) that
// a message serving holdings h carries; returns how many. Without need: all.
// With need: those in a key block that a holder in h uses. mask: scratch
// [need->words].
int64_t ring_selected_tokens(const Ring *ring, const Place *p, const RingNeed *need, int c, Holdings h,
                             uint64_t *mask, int64_t *sel);
// The rows (into sel) of the dK/dV message leaving holding (so, si) of chunk
// c; returns how many, or -1 at the owner's holding (0, 0), which sends none:
// its contribution stays home and the accumulator starts at the next holder.
int64_t ring_dkv_rows(const Ring *ring, const Place *p, const RingNeed *need, int c, int so, int si,
                      uint64_t *mask, int64_t *sel);
// Whether some query at q_pos [Tq] sees some key at k_pos [Tk] (both
// ascending): k <= q and, with documents (doc_starts [doc_count], attention.h),
// k in q's document. A ring step whose chunk fails this has no attention work.
bool ring_chunk_visible(const int64_t *q_pos, int64_t Tq, const int64_t *k_pos, int64_t Tk,
                        const int64_t *doc_starts, int64_t doc_count);

// uint64 words of a need row (RingNeed): ceil(num_blocks / 64) for N tokens in blocks of B.
int64_t ring_need_words(int64_t seq_len, int block_size);

// ring_send selected for the dense kernels (attention.h): bit b of row r of
// bits [cp size, words] (words = ring_need_words(N, B), B = block_size) is
// set when some query tile of rank r reads key block b, i.e. the block holds
// a key at or before the tile's last query and at or after the start of its
// first query's document (without documents: every block up to the last
// query's). Every rank's tokens must be whole blocks of B (layout.h).
void ring_dense_need(const Ring *ring, const AttnShape *shape, int64_t words, uint64_t *bits);
// ring_dense_need's bits kept by a ring between its calls: every layer's
// forward and backward of a sequence reads the same ones, so they are
// computed again only after ring_dense_need_forget (a new sequence) or when
// the block size or the document starts differ from the last call's.
typedef struct {
    uint64_t *bits;            // [cp size, ring_need_words]
    int block_size;            // 0: nothing kept
    int64_t *doc_starts;       // [doc_count] the starts they were computed for
    int64_t doc_count;
} RingDenseNeed;
// The need of shape's dense kernels on ring; its bits stay kept's.
RingNeed ring_dense_need_kept(RingDenseNeed *kept, const Ring *ring, const AttnShape *shape);
void ring_dense_need_forget(RingDenseNeed *kept);
void ring_dense_need_free(RingDenseNeed *kept);

// Tokens (rows of K and V, or of dK and dV) the transfers of one ring pass
// send, per rank and step, with `need` (NULL: whole chunks), without MPI: the
// byte model of ring_send for any ring (ring->cp only gives the size).
// kv_tokens [W, W]: kv_tokens[r * W + s] = K/V tokens rank r sends in step s
// of either pass (s = so * inner + si; an outer transfer counts in the step
// that posts it). dkv_tokens [W, W]: dK/dV accumulator tokens rank r sends at
// the end of backward step s (on the ring, to the next node, or home).
void ring_send_tokens(const Ring *ring, const RingNeed *need, int64_t *kv_tokens, int64_t *dkv_tokens);

#endif
