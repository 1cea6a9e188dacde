#!/usr/bin/env bash
# install_deps.sh: installs every Debian package that mtrain's build, tests and
# demo need, when it is missing. Idempotent: installs nothing when all is there.
#   scripts/install_deps.sh                    install what is missing (root)
#   scripts/install_deps.sh --check-or-install as above when root; otherwise
#                                              print the exact command and fail
set -euo pipefail

# package : file whose presence shows it is installed
checks=(
  "gcc:/usr/bin/gcc"
  "make:/usr/bin/make"
  "libyaml-dev:/usr/include/yaml.h"
  "libzstd-dev:/usr/include/zstd.h"
  "zstd:/usr/bin/zstd"
  "libcjson-dev:/usr/include/cjson/cJSON.h"
  "libxxhash-dev:/usr/include/xxhash.h"
  "libopenblas-openmp-dev:/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so"
  "openmpi-bin:/usr/bin/mpirun"
  "libopenmpi-dev:/usr/bin/mpicc"
  "python3-torch:/usr/lib/python3/dist-packages/torch/__init__.py"
  "python3-numpy:/usr/lib/python3/dist-packages/numpy/__init__.py"
  "gnuplot-nox:/usr/bin/gnuplot"
  "libpcre2-dev:/usr/include/pcre2.h"
  "libutf8proc-dev:/usr/include/utf8proc.h"
  "npm:/usr/bin/npm"
  "python3-regex:/usr/lib/python3/dist-packages/regex/__init__.py"
  "munge:/usr/sbin/munged"
  "slurmctld:/usr/sbin/slurmctld"
  "slurmd:/usr/sbin/slurmd"
  "slurm-client:/usr/bin/srun"
  "clang:/usr/bin/clang"
  "libclang-rt-14-dev:/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a"
  "libomp-14-dev:/usr/lib/llvm-14/lib/libomp.so"
)

missing=()
for entry in "${checks[@]}"; do
  pkg=${entry%%:*}; file=${entry#*:}
  [ -e "$file" ] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "mtrain: missing Debian packages: ${missing[*]}" >&2
  echo "mtrain: install them with: sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "mtrain: installing missing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
