#!/usr/bin/env python3
"""Byte-level token shards of a real English corpus, for the toy LM config.

Tokenization: token = byte value (vocab 256). Documents are joined with a 0
byte as separator (0 bytes inside documents are dropped, so 0 only ever means
"document boundary"). The stream is split into train (first part) and
validation (last --val-fraction) and written as kvshift token shards
(docs/DATA.md): OUT/train_000.bin and OUT/val_000.bin (u16 tokens), each
written atomically, plus OUT/manifest.json.

Default corpus (no --input): English prose shipped with every Python 3
installation, so it exists on any machine our setup script has run on:
  1. the Python Language Reference / library topics of pydoc_data.topics
     (the text `help("topic")` prints), in sorted topic order;
  2. the docstrings of the standard library's modules, classes and functions,
     one document per module, in sorted file order (tests excluded).
About 2 MB with Python 3.11. The order is deterministic; the exact bytes
depend on the Python version (manifest.json records it and a sha256).

--input GLOB (repeatable) replaces it: each matching file is one document,
files in sorted order. Standard library only.
"""
import argparse
import ast
import glob
import hashlib
import json
import os
import sys
import sysconfig

MAGIC = b"KVSTOKS\0"
VERSION = 1
SEPARATOR = 0
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__")


def stdlib_documents():
    """(source, bytes) documents of the default corpus."""
    docs = []
    try:
        from pydoc_data import topics as pydoc_topics

        for key in sorted(pydoc_topics.topics):
            docs.append((f"pydoc_data.topics[{key!r}]", pydoc_topics.topics[key].encode("utf-8")))
    except ImportError:
        print("prepare_byte_shards: warning: pydoc_data is missing; using docstrings only", file=sys.stderr)
    root = sysconfig.get_paths()["stdlib"]
    paths = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    for path in paths:
        rel = os.path.relpath(path, root)
        if any(part in SKIP_DIRS for part in rel.split(os.sep)[:-1]) or rel.startswith("test_"):
            continue
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), filename=path)
        except (SyntaxError, ValueError, UnicodeDecodeError, OSError):
            continue
        parts = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:  # skip one-liners like "Return x."
                    parts.append(doc)
        if parts:
            docs.append((os.path.join(root, rel), "\n\n".join(parts).encode("utf-8", "replace")))
    return docs, f"python{sys.version_info.major}.{sys.version_info.minor} stdlib docs ({root})"


def input_documents(patterns):
    files = set()
    for pat in patterns:
        matches = [m for m in glob.glob(os.path.expanduser(pat), recursive=True) if os.path.isfile(m)]
        if not matches:
            sys.exit(f"prepare_byte_shards: error: --input {pat!r} matches no file")
        files.update(matches)
    docs = []
    for path in sorted(files):
        with open(path, "rb") as f:
            docs.append((path, f.read()))
    return docs, "files: " + ", ".join(patterns)


def write_shard(path, tokens):
    """Writes byte tokens as a u16 shard: 32-byte header + little-endian tokens, atomically."""
    data = bytearray(2 * len(tokens))
    data[0::2] = tokens  # low byte = the token, high byte = 0
    header = (MAGIC + VERSION.to_bytes(4, "little") + (2).to_bytes(4, "little")
              + len(tokens).to_bytes(8, "little") + bytes(8))
    write_atomic(path, header + bytes(data))


def write_atomic(path, blob):
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", action="append", metavar="GLOB",
                    help="text files to use instead of the default corpus (repeatable; ** allowed)")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "bytes"),
                    help="output directory (default: data/bytes under the repo root)")
    ap.add_argument("--val-fraction", type=float, default=0.05,
                    help="last fraction of the stream used for validation (default 0.05)")
    ap.add_argument("--max-bytes", type=int, default=0, help="keep at most this many tokens in all (0 = all)")
    args = ap.parse_args()
    if not 0.0 < args.val_fraction < 1.0:
        sys.exit("prepare_byte_shards: error: --val-fraction must be in (0, 1)")
    if args.max_bytes < 0:
        sys.exit("prepare_byte_shards: error: --max-bytes must be >= 0")

    docs, corpus = input_documents(args.input) if args.input else stdlib_documents()
    stream = bytearray()
    used = []
    for source, text in docs:
        text = text.replace(b"\0", b"")
        if not text:
            continue
        if args.max_bytes and len(stream) + 1 >= args.max_bytes:
            break  # no room for the separator and a byte of this document: the stream ends with a document
        if stream:
            stream.append(SEPARATOR)
        stream += text
        used.append(source)
        if args.max_bytes and len(stream) >= args.max_bytes:
            del stream[args.max_bytes:]
            break
    if len(stream) < 2:
        sys.exit("prepare_byte_shards: error: the corpus is empty")

    n_val = int(len(stream) * args.val_fraction)
    if n_val < 2:
        sys.exit(f"prepare_byte_shards: error: validation split of {n_val} tokens is too small")
    train, val = bytes(stream[:-n_val]), bytes(stream[-n_val:])

    os.makedirs(args.out, exist_ok=True)
    write_shard(os.path.join(args.out, "train_000.bin"), train)
    write_shard(os.path.join(args.out, "val_000.bin"), val)
    manifest = {
        "format": "kvshift token shards v1 (docs/DATA.md)",
        "tokenizer": "bytes",
        "vocab_size": 256,
        "token_bytes": 2,
        "document_separator": SEPARATOR,
        "corpus": corpus,
        "python": sys.version.split()[0],
        "val_fraction": args.val_fraction,
        "max_bytes": args.max_bytes,
        "documents": len(used),
        "total_tokens": len(stream),
        "shards": {
            "train_000.bin": {"tokens": len(train), "sha256": hashlib.sha256(train).hexdigest()},
            "val_000.bin": {"tokens": len(val), "sha256": hashlib.sha256(val).hexdigest()},
        },
        "sources": used,
    }
    write_atomic(os.path.join(args.out, "manifest.json"), (json.dumps(manifest, indent=1) + "\n").encode())
    print(f"prepare_byte_shards: {len(stream):,} bytes from {len(used)} documents ({corpus}) -> {args.out}: "
          f"train_000.bin {len(train):,} tokens, val_000.bin {len(val):,} tokens")


if __name__ == "__main__":
    main()
