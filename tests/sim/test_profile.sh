#!/usr/bin/env bash
# test_profile.sh: log.profile, the per-op profile of a step (model/profile.h).
# On the CUDA backend under the sim (build/sim/mtrain, 2 steps, dp 2 so that
# the gradients are summed, train.recompute full so that attention runs in
# every phase, MTRAIN_SYNC_REPORT=1 so that the step's launches are counted
# apart) and on the CPU backend (build/mtrain, one step):
#   json        log.dir/profile.json is the profiled step's (the second; the
#               only one on the CPU), its table printed;
#   categories  every op category has calls (gemm, attention, norm, rope,
#               swiglu, cross_entropy, embedding, optimizer, memory, and on
#               dp 2 communication), attention in the forward, recompute and
#               backward phases;
#   sums        the rows' ms plus idle make the step's wall time; the rows'
#               launches make the step's launches, which equal the sync
#               report's "device launches per step" (test_launches's counter);
#               the CPU counts none (-1).
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
sim_setup profile
RUN="$SIM_RUN train.steps=2 checkpoint.resume=never"

# check NAME JSON [LAUNCHES]: the checks above on the profile JSON of run NAME;
# LAUNCHES the sync report's count (none: the CPU backend, which counts none).
check() {
  local name=$1 json=$2 launches=${3:--1} comm=${4:-0}
  python3 - "$json" "$launches" "$comm" <<'EOF'
import json, sys
path, want_launches, comm = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
p = json.load(open(path))
rows = p["rows"]
need = ["gemm", "attention", "norm", "rope", "swiglu", "cross_entropy", "embedding", "optimizer", "memory"]
if comm:
    need.append("communication")
missing = [c for c in need if p["categories"][c]["calls"] <= 0]
print("categories", "ok" if not missing else "missing " + ",".join(missing))
phases = sorted({r["phase"] for r in rows if r["category"] == "attention" and r["shape"] == ""})
print("phases", "ok" if phases == ["backward", "forward", "recompute"] else "got " + ",".join(phases))
ms = sum(r["ms"] for r in rows)
print("ms", "ok" if abs(ms + p["idle_ms"] - p["wall_ms"]) <= 1e-3 and p["idle_ms"] >= -1e-3 else
      f"rows {ms} + idle {p['idle_ms']} != wall {p['wall_ms']}")
launches = sum(r["launches"] for r in rows) if want_launches >= 0 else -1
ok = (p["launches"] == want_launches and launches == want_launches) if want_launches >= 0 else \
     all(r["launches"] == -1 for r in rows) and p["launches"] == -1
print("launches", "ok" if ok else f"rows {launches}, step {p['launches']}, sync report {want_launches}")
EOF
}

# expect_checks NAME OUTPUT: one expect per line of check's OUTPUT.
expect_checks() {
  local what verdict
  while read -r what verdict; do
    expect "profile_${1}_$what: $verdict" "[ '$verdict' = ok ]"
  done <<<"$2"
}

MTRAIN_SYNC_REPORT=1 sim_train sim 2 2 parallel.dp=2 train.recompute=full log.profile=true
rc=$?
sync_launches=$(sed -n 's/^device launches per step: \([0-9]*\) .*/\1/p' "$tmp/sim.out" | head -1)
expect "profile_sim_json: exit $rc, profile.json of step 2, its table printed" \
  "[ $rc -eq 0 ] && grep -q '\"step\": 2,' '$tmp/sim/profile.json' && grep -q '^profile of step 2 (log.profile)' '$tmp/sim.out' && grep -q '^| \*\*step\*\* |' '$tmp/sim.out'"
if [ -f "$tmp/sim/profile.json" ] && [ -n "$sync_launches" ]; then
  expect_checks sim "$(check sim "$tmp/sim/profile.json" "$sync_launches" 1)"
else
  bad profile_sim_checks "no profile.json or no sync report: $(tail -3 "$tmp/sim.out")"
fi

build/mtrain train configs/tiny-cpu.yaml train.steps=1 train.recompute=full log.profile=true log.dir="$tmp/cpu" \
  checkpoint.dir="$tmp/cpu" checkpoint.resume=never >"$tmp/cpu.out" 2>&1
rc=$?
expect "profile_cpu_json: exit $rc, profile.json of step 1 (the run's only)" \
  "[ $rc -eq 0 ] && grep -q '\"step\": 1,' '$tmp/cpu/profile.json' && grep -q '^profile of step 1 (log.profile)' '$tmp/cpu.out'"
if [ -f "$tmp/cpu/profile.json" ]; then
  expect_checks cpu "$(check cpu "$tmp/cpu/profile.json")"
else
  bad profile_cpu_checks "no profile.json: $(tail -3 "$tmp/cpu.out")"
fi
exit $((failures > 0))
