#!/usr/bin/env bash
# The real-text corpus of configs/toy/lm-text-*.json, in one command:
#   1. the English Linux kernel documentation that scripts/setup.sh installs
#      (Debian's linux-doc: the reStructuredText sources under
#      /usr/share/doc/linux-doc-*/html/_sources, translations excluded), listed
#      in sorted order into data/corpus-files.txt;
#   2. a sentencepiece BPE tokenizer trained on it -> data/tokenizer/ (skipped
#      if present: the shards and every run trained on them depend on it);
#   3. token shards -> data/corpus/{train,val}_NNNNNN.bin + manifest.json.
# No downloads. Usage: scripts/prepare_corpus.sh [--force]   (--force redoes 2 and 3)
# Env: KVSHIFT (binary, default build/kvshift), VOCAB (default 8192), THREADS (default 0 = all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
KVSHIFT=${KVSHIFT:-./build/kvshift}
VOCAB=${VOCAB:-8192}
THREADS=${THREADS:-0}
FORCE=0
case "${1:-}" in
  --force) FORCE=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

[ -x "$KVSHIFT" ] || { echo "prepare_corpus: $KVSHIFT not found; build first (scripts/build.sh) or set KVSHIFT" >&2; exit 1; }
SRC=$(ls -d /usr/share/doc/linux-doc-*/html/_sources 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$SRC" ]; then
  echo "prepare_corpus: no /usr/share/doc/linux-doc-*/html/_sources: run scripts/setup.sh (Debian package linux-doc);" \
       "slim container images may drop /usr/share/doc (a path-exclude in /etc/dpkg/dpkg.cfg.d/)" >&2
  exit 1
fi

mkdir -p data
# LC_ALL=C: the same order (and so the same shards) on every machine.
find "$SRC" -name '*.rst.txt' -not -path '*/translations/*' | LC_ALL=C sort > data/corpus-files.txt
echo "prepare_corpus: $(wc -l < data/corpus-files.txt) files from $SRC"

if [ "$FORCE" = 1 ] || [ ! -f data/tokenizer/kvshift_tokenizer.json ]; then
  "$KVSHIFT" tokenizer train --input-list data/corpus-files.txt --vocab-size "$VOCAB" --out data/tokenizer --force
else
  echo "prepare_corpus: keeping data/tokenizer (--force retrains it)"
fi
# The shards are redone when missing or made with another tokenizer (the manifest records its sha256).
tok_sha=$(sed -n 's/^  "sha256": "\([0-9a-f]*\)".*/\1/p' data/tokenizer/kvshift_tokenizer.json)
if [ "$FORCE" = 1 ] || [ ! -f data/corpus/manifest.json ] || ! grep -q "\"sha256\": \"$tok_sha\"" data/corpus/manifest.json; then
  "$KVSHIFT" data prepare --tokenizer data/tokenizer --input-list data/corpus-files.txt --out data/corpus \
    --threads "$THREADS" --force
else
  echo "prepare_corpus: data/corpus is up to date with data/tokenizer (--force redoes it)"
fi
echo "prepare_corpus: done; train with: $KVSHIFT train --config configs/toy/lm-text-kvshift.json --run-dir runs/lm-text-kvshift"
