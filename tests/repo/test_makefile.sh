#!/usr/bin/env bash
# test_makefile.sh: a fresh build of a test program, then a second make has
# nothing to do (its object is kept, so nothing is recompiled or relinked).
# Runs in a copy of the tree with the library objects of build/ and no test
# objects, so that the first make is the fresh build. Then the real tree, as
# `make test` built it: `make all` has nothing left to do (no object of the
# CPU, GPU or sim programs was deleted as an intermediate). The sanitized
# build (make test SANITIZE=1) and the fuzz targets write only under their
# own folders, build/san/ and build/fuzz/. `make` (the default goal) and
# `make demo` build build/mtrain and its objects only: no test program, no sim,
# no CUDA object.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

copy="$tmp/tree"
mkdir "$copy"
cp -a Makefile dist data attention model trainer tests scripts build "$copy"/
rm -rf "$copy/build/obj/tests" "$copy/build/tests"
expect "fresh build of a test program" 'make -C "$copy" build/tests/test_rope >"$tmp/build.txt" 2>&1'
expect "its object is kept" '[ -f "$copy/build/obj/tests/unit/test_rope.o" ]'
expect "second make -q: up to date" 'make -s -C "$copy" -q build/tests/test_rope'
make -C "$copy" -n build/tests/test_rope >"$tmp/dry.txt" 2>&1
expect "second make -n: nothing to do" 'grep -q "is up to date" "$tmp/dry.txt" && ! grep -q " -o " "$tmp/dry.txt"'
for pair in build-san:build/san build-fuzz:build/fuzz; do
  target=${pair%%:*} dir=${pair#*:}
  make -C "$copy" -B -n "$target" 2>/dev/null | grep -o ' -o [^ ]*' | awk '{print $2}' >"$tmp/outputs.txt"
  expect "make $target writes only under $dir/ ($(wc -l <"$tmp/outputs.txt") files)" \
    '[ -s "$tmp/outputs.txt" ] && ! grep -v "^$dir/" "$tmp/outputs.txt"'
done
for goal in "" demo; do
  make -C "$copy" -B -n $goal 2>/dev/null | grep -o ' -o [^ ]*' | awk '{print $2}' >"$tmp/outputs.txt"
  expect "make ${goal:-(default goal)} builds build/mtrain and its objects only ($(wc -l <"$tmp/outputs.txt") files)" \
    'grep -qx build/mtrain "$tmp/outputs.txt" && ! grep -v -e "^build/obj/" -e "^build/mtrain$" "$tmp/outputs.txt"'
done
make -C "$copy" -B -n all 2>/dev/null | grep -o ' -o [^ ]*' | awk '{print $2}' >"$tmp/outputs.txt"
expect "make all still builds the test programs and the sim" \
  'grep -q "^build/tests/test_rope$" "$tmp/outputs.txt" && grep -q "^build/sim/" "$tmp/outputs.txt"'
expect "make -q all after make all: up to date" 'make -s -q all'
exit $((failures > 0))
