#!/usr/bin/env bash
# test_gpu_bundle.sh: the GPU bundle (make gpu-bundle, scripts/gpu_bundle.sh)
# runs where the project's libraries are absent. A root made for chroot holds
# only glibc (its loader and libraries), libstdc++, libgcc_s, /bin/sh, the
# unpacked bundle, /dev/null, /proc (its own, in a mount namespace that
# ends with the command) and a python3 site-packages laid out as PyTorch's CUDA
# wheels lay theirs (nvidia/cu13/lib/libcublasLt.so.13,
# nvidia/nccl/lib/libnccl.so.2: the CUDA toolkit's, hard-linked) with a
# python3 that names it. There the launcher finds both libraries, the
# bundle's mtrain prints --help, trains configs/tiny-cpu.yaml on the CPU
# backend (finite losses), and stops with one line, never a loader error, for
# train.backend=cuda (no GPU), without the site-packages, and when the
# environment asks for more than one rank (single-rank MPI; its semantics:
# build/bundle/tests/single_rank_mpi, from tests/repo/single_rank_mpi.c). Any library the
# bundle needed from the host would be missing there. Builds the bundle when
# it is missing or stale (make gpu-bundle; needs nvcc) and runs as root
# (chroot); otherwise prints one skip line saying why and checks nothing else.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ] || [ "$(id -u)" -ne 0 ]; then
  skip gpu_bundle "needs nvcc in $cuda and root for chroot"
  exit 0
fi
expect "make gpu-bundle" \
  'make -s gpu-bundle build/bundle/tests/single_rank_mpi >"$tmp/build.txt" 2>&1 || { tail -n 5 "$tmp/build.txt"; false; }'
build/bundle/tests/single_rank_mpi || bad "single_rank_mpi" "exit $?"
size=$(du -sb gpu-bundle | cut -f1)
expect "gpu_bundle_size: $size bytes <= 60 MiB, printed" \
  '[ "$size" -le $((60 * 1024 * 1024)) ] && grep -q "^gpu-bundle/: .* MiB" "$tmp/build.txt"'

root=$tmp/root
chroot=$(command -v chroot) unshare=$(command -v unshare)
sp=/opt/venv/lib/python3.12/site-packages
mkdir -p "$root"/{bin,dev,proc,tmp,lib64,lib/x86_64-linux-gnu,opt/venv/bin} "$root$sp/nvidia/cu13/lib" "$root$sp/nvidia/nccl/lib"
cp -L /bin/sh "$root/bin/sh"
mknod -m 666 "$root/dev/null" c 1 3
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libstdc++.so.6 libgcc_s.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$root/lib/x86_64-linux-gnu/"
done
link() { ln "$1" "$2" 2>/dev/null || cp "$1" "$2"; }
link "$(readlink -f "$cuda/lib64/libcublasLt.so.13")" "$root$sp/nvidia/cu13/lib/libcublasLt.so.13"
link "$(readlink -f "$cuda/lib64/libnccl.so.2")" "$root$sp/nvidia/nccl/lib/libnccl.so.2"
printf '#!/bin/sh\necho %s\n' "$sp" >"$root/opt/venv/bin/python3"
chmod +x "$root/opt/venv/bin/python3"
tar -xzf gpu-bundle/mtrain-gpu.tar.gz -C "$root"

# inside [VAR=VALUE...] -- COMMAND...: COMMAND in the root with a bare environment (PATH: the venv, /bin),
# in its own mount and process namespaces (its /proc unmounted when it ends).
inside() {
  local vars=(PATH=/opt/venv/bin:/bin HOME=/tmp OMP_NUM_THREADS=2)
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  env -i "${vars[@]}" "$unshare" --mount --pid --fork --mount-proc="$root/proc" "$chroot" "$root" "$@"
}
loader_error() { grep -qi 'error while loading shared libraries\|not found (required by' "$1"; }

inside -- /mtrain-gpu/run mtrain --help >"$tmp/help.txt" 2>&1
rc=$?
expect "bundle_help: mtrain --help in the bare root (exit $rc)" '[ $rc -eq 0 ] && grep -q "^usage: mtrain" "$tmp/help.txt"'

run="train.steps=4 train.warmup_steps=1 log.every=1 log.dir=/tmp/log checkpoint.dir=/tmp/ck"
# shellcheck disable=SC2086  # $run is a list of settings
inside -- /mtrain-gpu/run mtrain train /mtrain-gpu/configs/tiny-cpu.yaml $run >"$tmp/cpu.txt" 2>&1
rc=$?
losses=$(awk '/^step .* loss / { for (i = 1; i < NF; i++) if ($i == "loss") print $(i + 1) }' "$tmp/cpu.txt" | tr '\n' ' ')
expect "bundle_cpu_train: 4 finite losses on the CPU backend (exit $rc: $losses)" \
  '[ $rc -eq 0 ] && [ "$(echo "$losses" | wc -w)" -eq 4 ] && awk -v l="$losses" "BEGIN { n = split(l, a, \" \"); for (i = 1; i <= n; i++) if (!(a[i] + 0 > 0 && a[i] + 0 < 100)) exit 1 }"'

# shellcheck disable=SC2086
inside -- /mtrain-gpu/run mtrain train /mtrain-gpu/configs/tiny-cpu.yaml $run train.backend=cuda >"$tmp/cuda.txt" 2>&1
rc=$?
expect "bundle_no_gpu: train.backend=cuda stops with one line, exit 1 (exit $rc: $(head -c 200 "$tmp/cuda.txt"))" \
  '[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/cuda.txt")" -eq 1 ] && grep -q "^mtrain: train.backend: cuda: no GPU visible" "$tmp/cuda.txt" && ! loader_error "$tmp/cuda.txt"'

inside PATH=/bin -- /mtrain-gpu/run mtrain --help >"$tmp/nolib.txt" 2>&1
rc=$?
expect "bundle_no_site_packages: no python3 with the wheels: one line, exit 1 (exit $rc: $(head -c 200 "$tmp/nolib.txt"))" \
  '[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/nolib.txt")" -eq 1 ] && grep -q "libcublasLt.so.13 not found" "$tmp/nolib.txt"'

inside OMPI_COMM_WORLD_SIZE=2 -- /mtrain-gpu/run mtrain train /mtrain-gpu/configs/tiny-cpu.yaml $run >"$tmp/ranks.txt" 2>&1
rc=$?
expect "bundle_single_rank: OMPI_COMM_WORLD_SIZE=2 refused with one line, exit 1 (exit $rc: $(head -c 200 "$tmp/ranks.txt"))" \
  '[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/ranks.txt")" -eq 1 ] && grep -q "single-rank MPI" "$tmp/ranks.txt"'

expect "bundle_entry: gpu-bundle/run unpacks and runs mtrain --help on this machine" \
  'gpu-bundle/run mtrain --help 2>&1 | grep -q "^usage: mtrain"'
exit $((failures > 0))
