#!/bin/sh
# gpu_bundle_unpack.sh: the entry of the GPU bundle (scripts/gpu_bundle.sh
# installs it as gpu-bundle/run beside mtrain-gpu.tar.gz). Unpacks the
# bundle into a temporary folder ($TMPDIR, default /tmp), runs COMMAND there
# through the bundle's launcher (mtrain-gpu/run: a program of its bin/ or a
# script of its scripts/), removes the folder and exits with COMMAND's status.
#   gpu-bundle/run mtrain --help
#   OUT=DIR gpu-bundle/run gpu_check.sh        the GPU check (scripts/gpu_check.sh)
set -u
case $0 in */*) here=${0%/*} ;; *) here=. ;; esac
dir=$(mktemp -d "${TMPDIR:-/tmp}/mtrain-gpu.XXXXXX") || exit 1
if ! tar -xzf "$here/mtrain-gpu.tar.gz" -C "$dir"; then
  echo "gpu-bundle/run: cannot unpack $here/mtrain-gpu.tar.gz into $dir" >&2
  rm -rf "$dir"
  exit 1
fi
"$dir/mtrain-gpu/run" "$@"
rc=$?
rm -rf "$dir"
exit $rc
