#!/bin/sh
# gpu_bundle_launch.sh: the launcher inside the GPU bundle (scripts/gpu_bundle.sh
# installs it as mtrain-gpu/run). Puts cuBLASLt and NCCL on LD_LIBRARY_PATH,
# from the nvidia wheels in the site-packages of python3 (PyTorch's: $PYTHON,
# else the python3 on PATH; any nvidia/*/lib layout), else from
# $CUDA_HOME/lib64 (default /usr/local/cuda), then runs bin/COMMAND or the
# script scripts/COMMAND. Needs only /bin/sh. A missing library or glibc
# older than the bundle needs ends with one line, never a loader error.
#   mtrain-gpu/run mtrain train RUN.yaml ...      a program of bin/
#   OUT=DIR mtrain-gpu/run gpu_check.sh           a script of scripts/
set -u
case $0 in */*) here=${0%/*} ;; *) here=. ;; esac
here=$(cd "$here" && pwd)
python=${PYTHON:-python3}

# Where python3 looks for packages (one line each).
sites=$("$python" -c 'import site
print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)

# lib_dir NAME: the folder that holds the library NAME, or nothing.
lib_dir() {
  while read -r sp; do
    [ -n "$sp" ] || continue
    for f in "$sp"/nvidia/*/lib/"$1" "$sp"/nvidia/*/*/lib/"$1" "$sp"/nvidia/*/lib64/"$1" "$sp/$1"; do
      if [ -e "$f" ]; then echo "${f%/*}"; return; fi
    done
  done <<END
$sites
${CUDA_HOME:-/usr/local/cuda}/lib64
END
}

# The glibc version the bundle was linked against (file GLIBC), as this machine's glibc must be at least.
if command -v getconf >/dev/null 2>&1 && [ -f "$here/GLIBC" ]; then
  need=$(cat "$here/GLIBC") have=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/^glibc //')
  if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
    echo "mtrain-gpu/run: this machine's glibc is $have; the bundle's programs need glibc $need or newer" >&2
    exit 1
  fi
fi

path=
for name in libcublasLt.so.13 libnccl.so.2; do
  dir=$(lib_dir "$name")
  if [ -z "$dir" ]; then
    echo "mtrain-gpu/run: $name not found under the site-packages of $python (nvidia/*/lib) nor in" \
         "${CUDA_HOME:-/usr/local/cuda}/lib64: expected PyTorch's CUDA 13 wheels (set PYTHON to its python3)" >&2
    exit 1
  fi
  case ":$path:" in *":$dir:"*) ;; *) path=${path:+$path:}$dir ;; esac
done
export LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MTRAIN_BUNDLE="$here"

if [ $# -eq 0 ]; then
  echo "usage: mtrain-gpu/run COMMAND [ARGS...] (COMMAND: a program of $here/bin or a script of $here/scripts)" >&2
  exit 2
fi
command=$1
shift
if [ -x "$here/bin/$command" ]; then exec "$here/bin/$command" "$@"; fi
case $command in
  *.sh) [ -f "$here/scripts/$command" ] && exec bash "$here/scripts/$command" "$@" ;;
  *.py) [ -f "$here/scripts/$command" ] && exec "$python" "$here/scripts/$command" "$@" ;;
esac
echo "mtrain-gpu/run: no program or script '$command' in $here/bin or $here/scripts" >&2
exit 2
