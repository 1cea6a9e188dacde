#!/usr/bin/env bash
# test_trainer_backend.sh: trainer/ knows no backend: no MTRAIN_CUDA (its
# objects are the same in every build) and no call of the CUDA backend's own
# functions (backend_cuda*): a run reaches its backend through the table of
# model/backend.h (the device's memory peak and sync report too),
# backend_select and backend_join_devices.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

cuda=$(grep -n 'MTRAIN_CUDA' trainer/*.c trainer/*.h)
expect "trainer_no_mtrain_cuda: no MTRAIN_CUDA in trainer/ (${cuda:-none})" '[ -z "$cuda" ]'
calls=$(grep -nE '\bbackend_cuda[a-z_]*\(' trainer/*.c trainer/*.h)
expect "trainer_no_backend_cuda: no backend_cuda* call in trainer/ (${calls:-none})" '[ -z "$calls" ]'
exit $((failures > 0))
