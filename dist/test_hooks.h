// test_hooks.h: what tests ask of production code through the environment,
// behind one interface: the variables are read and checked once (one line and
// exit 1 when malformed; unset: nothing happens), and production code calls
// one function at each named point.
//   MTRAIN_TEST_FAULT   a stall, a slow rank or a kill at a fault point (test_fault)
//   MTRAIN_TEST_NAN_STEP  a NaN loss and gradient on some steps (test_nan_step)
//   MTRAIN_SYNC_REPORT  the CUDA backend's host synchronisations of the last step (test_sync_report)
//   MTRAIN_TEST_GEMM_ANSWER  which timed GEMM algorithm each problem keeps (test_gemm_answer)
#ifndef MTRAIN_TEST_HOOKS_H
#define MTRAIN_TEST_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

// Read and check every variable now (else on the first call below).
void test_hooks_read(void);

// MTRAIN_TEST_FAULT=KIND:RANK[@POINT[#N]] (for tests of the no-hang rule and
// of kills): the N-th time (default the first) world rank RANK reaches the
// fault point named POINT (default reduce: the gradient reduction of the
// first step a rank trains; ring: each wait of the CUDA backend's ring
// exchange, dist/comm_device.c; start: start-up, after the checkpoint folder
// is recovered; step: after each optimizer step; write: inside a checkpoint
// write, model.safetensors written; rename: the step folder renamed into
// place, `latest` not yet moved; latest: `latest` moved, nothing pruned;
// prune: each checkpoint being removed, renamed to NAME.del.PID), it sleeps (KIND stall: a
// rank stuck elsewhere, its transfer or collective never posted) for
// 10 timeout_s + 10 s, sleeps 2 timeout_s + 1 s and goes on (KIND slow: a
// slow disk), or dies by SIGKILL (KIND kill). Other ranks and points are
// unaffected.
void test_fault(const char *point, int world_rank, double timeout_s);

// MTRAIN_TEST_NAN_STEP=N[,RANK[,COUNT]]: whether step `step` on world rank
// `world_rank` gets a NaN loss and gradient (steps N .. N + COUNT - 1 on
// world rank RANK; RANK default 0, COUNT default 1).
bool test_nan_step(int64_t step, int world_rank);

// MTRAIN_SYNC_REPORT=1 (for tests and tuning; 0 or unset: off): whether to
// count and print the host synchronisations of a run's last step.
bool test_sync_report(void);

// MTRAIN_TEST_GEMM_ANSWER=N|fastest (for tests): under train.gemm_choice
// timed, each GEMM problem keeps the cuBLASLt heuristic's N-th answer (N >=
// 1; its last when it gives fewer), all of them timed still, or the fastest
// (under the CPU execution model of CUDA, whose timings are the CPU's, timed
// only when this is set). Returns N, -1 for fastest, 0 when unset.
int test_gemm_answer(void);

#endif
