// test_hooks.c: the environment of the test hooks (test_hooks.h), read once.
#include "test_hooks.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

// The fault points of MTRAIN_TEST_FAULT, and how often this process has reached each.
static const char *const fault_points[] = {"reduce", "ring", "start", "step", "write", "shard", "rename", "latest", "prune"};
#define FAULT_POINTS ((int)(sizeof(fault_points) / sizeof(fault_points[0])))

static struct {
    bool read;
    int fault_point;              // index into fault_points; -1 = no fault
    char fault_kind[8];           // stall, kill or slow
    int fault_rank;
    int64_t fault_nth;
    int64_t reached[FAULT_POINTS];
    int64_t nan_first, nan_last;  // steps with a NaN on nan_rank; none when nan_first is 0
    int nan_rank;
    bool sync_report;
    int gemm_answer;              // 0: unset; -1: the fastest
} hooks;

static void read_fault(void) {
    hooks.fault_point = -1;
    const char *text = getenv("MTRAIN_TEST_FAULT");
    if (!text || !text[0]) return;
    char where[8] = "reduce";
    int n = 0, which = -1;
    long long nth = 1;
    hooks.fault_rank = -1;
    const int fields = sscanf(text, "%7[a-z]:%d%n@%7[a-z]%n#%lld%n", hooks.fault_kind, &hooks.fault_rank, &n, where,
                              &n, &nth, &n);
    for (int i = 0; i < FAULT_POINTS; i++)
        if (!strcmp(where, fault_points[i])) which = i;
    if (fields < 2 || text[n] || hooks.fault_rank < 0 || nth < 1 || which < 0 ||
        (strcmp(hooks.fault_kind, "stall") && strcmp(hooks.fault_kind, "kill") && strcmp(hooks.fault_kind, "slow")))
        fail("MTRAIN_TEST_FAULT=%s: expected stall:RANK, kill:RANK or slow:RANK, then optionally @POINT (reduce, ring, "
             "start, step, write, shard, rename, latest, prune) and #N (rank >= 0, N >= 1)", text);
    hooks.fault_point = which;
    hooks.fault_nth = nth;
}

static void read_nan_step(void) {
    const char *text = getenv("MTRAIN_TEST_NAN_STEP");
    if (!text || !text[0]) return;
    long long step = 0, count = 1;
    int rank = 0, n = 0;
    if (sscanf(text, "%lld%n,%d%n,%lld%n", &step, &n, &rank, &n, &count, &n) < 1 || text[n] || step < 1 || rank < 0 ||
        count < 1)
        fail("MTRAIN_TEST_NAN_STEP=%s: expected STEP[,RANK[,COUNT]] (step >= 1, rank >= 0, count >= 1)", text);
    hooks.nan_first = step;
    hooks.nan_last = step + count - 1;
    hooks.nan_rank = rank;
}

static void read_sync_report(void) {
    const char *text = getenv("MTRAIN_SYNC_REPORT");
    if (!text || !strcmp(text, "0")) return;
    if (strcmp(text, "1") != 0) fail("MTRAIN_SYNC_REPORT=%s: expected 1 or 0", text);
    hooks.sync_report = true;
}

static void read_gemm_answer(void) {
    const char *text = getenv("MTRAIN_TEST_GEMM_ANSWER");
    if (!text || !text[0]) return;
    int n = 0;
    if (!strcmp(text, "fastest")) hooks.gemm_answer = -1;
    else if (sscanf(text, "%d%n", &hooks.gemm_answer, &n) != 1 || text[n] || hooks.gemm_answer < 1)
        fail("MTRAIN_TEST_GEMM_ANSWER=%s: expected N >= 1 (the heuristic's N-th answer) or fastest", text);
}

void test_hooks_read(void) {
    if (hooks.read) return;
    read_nan_step();
    read_sync_report();
    read_gemm_answer();
    read_fault();
    hooks.read = true;
}

void test_fault(const char *point, int world_rank, double timeout_s) {
    test_hooks_read();
    if (hooks.fault_point < 0 || hooks.fault_rank != world_rank || strcmp(fault_points[hooks.fault_point], point))
        return;
    if (++hooks.reached[hooks.fault_point] != hooks.fault_nth) return;
    fprintf(stderr, "rank %d: MTRAIN_TEST_FAULT: %s at the fault point %s\n", world_rank, hooks.fault_kind, point);
    fflush(stderr);
    if (!strcmp(hooks.fault_kind, "kill")) raise(SIGKILL);
    sleep((unsigned)(!strcmp(hooks.fault_kind, "slow") ? 2 * timeout_s + 1 : 10 * timeout_s + 10));
}

bool test_nan_step(int64_t step, int world_rank) {
    test_hooks_read();
    return hooks.nan_first > 0 && world_rank == hooks.nan_rank && step >= hooks.nan_first && step <= hooks.nan_last;
}

bool test_sync_report(void) {
    test_hooks_read();
    return hooks.sync_report;
}

int test_gemm_answer(void) {
    test_hooks_read();
    return hooks.gemm_answer;
}
