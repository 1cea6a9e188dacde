#!/usr/bin/env bash
# test_gemm_choice.sh: train.gemm_choice on the CUDA backend under the sim
# (build/sim/mtrain, one step of 128 tokens). The sim's timings are the CPU's,
# so `timed` times only when MTRAIN_TEST_GEMM_ANSWER asks (dist/test_hooks.h),
# and no check depends on which answer is fastest:
#   default     timed, the hook unset: nothing timed or printed (as heuristic);
#   fastest     the hook `fastest`: one "gemm choice: OP m M n N k K...: answer
#               I of A (...) X ms" line per problem, all in the first step
#               (before its cost line), I <= A; the cost line "gemm choice: P
#               problems timed, S answers in L launches" with P the lines, S
#               their A summed, L = 3 S (a warm-up and 2 timed runs each); the
#               loss within 1e-4 (relative) of the default run's (the
#               weights after AdamW's first step, near sign descent at eps
#               1e-3, magnify rounding: each answer's accuracy is
#               gpu_test_matmul's, which keeps every answer in turn);
#   first       the hook 1: every line keeps answer 1 and the run's loss and
#               weights are the default run's bit for bit (the timed runs
#               leave the outputs the step adds to untouched);
#   heuristic   train.gemm_choice=heuristic with the hook set: nothing timed;
#   bad_hook    MTRAIN_TEST_GEMM_ANSWER=0: a last line naming it, exit 1, no step.
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup gemm_choice
RUN="$SIM_RUN train.steps=1 checkpoint.resume=never"

sim_train default 1 1
rc=$?
expect "gemm_choice_default: exit $rc, no choice printed" "[ $rc -eq 0 ] && ! grep -q '^gemm choice' '$tmp/default.out'"

# check_lines NAME: the per-problem lines and the cost line of run NAME, as above; prints "ok" or what is wrong.
check_lines() {
  awk '
    /^step +1\// { stepped = 1 }
    /^gemm choice: [0-9]+ problems timed/ { cost = 1; problems = $3; answers = $6; launches = $9; next }
    /^gemm choice: / {
      if (stepped || cost) late = 1
      lines++
      if (!match($0, /: answer [0-9]+ of [0-9]+ \(algo -?[0-9]+ tile [0-9]+ split-K [0-9]+\) [0-9.]+ ms/)) bad = bad " " NR
      split(substr($0, RSTART + 9), f, " ")
      if (f[1] + 0 < 1 || f[1] + 0 > f[3] + 0) bad = bad " " NR
      sum += f[3]
    }
    END {
      if (!cost || lines == 0 || late || bad != "" || problems != lines || answers != sum || launches != 3 * sum)
        printf "lines %d (late %d, malformed:%s), cost line %d: %s problems, %s answers (lines: %d), %s launches\n",
               lines, late, bad, cost, problems, answers, sum, launches
      else print "ok"
    }' "$tmp/$1.out"
}

MTRAIN_TEST_GEMM_ANSWER=fastest sim_train fastest 1 1
rc=$?
verdict=$(check_lines fastest)
expect "gemm_choice_fastest_lines: exit $rc, one line per problem in step 1, the cost line's figures ($verdict)" \
  "[ $rc -eq 0 ] && [ '$verdict' = ok ]"
read -r loss weights <<<"$(runs_differ fastest default 1)"
expect "gemm_choice_fastest_rounding: the fastest answers' loss within rounding of the first's ($loss; weights $weights)" \
  "below $loss 1e-4"

MTRAIN_TEST_GEMM_ANSWER=1 sim_train first 1 1
rc=$?
verdict=$(check_lines first)
others=$(grep '^gemm choice: .*: answer ' "$tmp/first.out" | grep -vc ': answer 1 of ')
expect "gemm_choice_first_lines: exit $rc, answer 1 kept on every line ($others others; $verdict)" \
  "[ $rc -eq 0 ] && [ '$verdict' = ok ] && [ $others -eq 0 ]"
read -r loss weights <<<"$(runs_differ first default 1)"
expect "gemm_choice_first_bitwise: timed runs change nothing (loss $loss, weights $weights)" \
  "[ '$loss' = 0.000e+00 ] && [ '$weights' = 0.000e+00 ]"

MTRAIN_TEST_GEMM_ANSWER=fastest sim_train heuristic 1 1 train.gemm_choice=heuristic
rc=$?
expect "gemm_choice_heuristic: exit $rc, nothing timed or printed" \
  "[ $rc -eq 0 ] && ! grep -q '^gemm choice' '$tmp/heuristic.out'"

MTRAIN_TEST_GEMM_ANSWER=0 sim_train bad_hook 1 1
rc=$?
expect "gemm_choice_bad_hook: exit $rc, the last line names MTRAIN_TEST_GEMM_ANSWER, no step" \
  "[ $rc -eq 1 ] && tail -n 1 '$tmp/bad_hook.out' | grep -q '^mtrain: MTRAIN_TEST_GEMM_ANSWER=0: expected' &&
   ! grep -q '^step' '$tmp/bad_hook.out'"
[ "$failures" -eq 0 ]
