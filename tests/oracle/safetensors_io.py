"""Minimal numpy reader/writer for the safetensors format (no third-party package).

Layout: 8-byte little-endian u64 N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
then the raw little-endian tensor bytes (offsets are relative to the end of the header).

Read supports F64, F32, F16, BF16 (returned as float32), I64, I32, I16, I8, U8, BOOL.
Write supports float64, float32, int64, int32, uint8 arrays.
"""
import json
import os
import struct

import numpy as np

_NP_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}
_ITEMSIZE = {"BF16": 2, **{k: v.itemsize for k, v in _NP_DTYPES.items()}}

_WRITE_DTYPES = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("uint8"): "U8",
}


class SafetensorsError(ValueError):
    pass


def _bf16_to_f32(raw):
    u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    return (u16 << 16).view(np.float32)


def read_safetensors(path, with_metadata=False):
    """Returns {name: np.ndarray} in file order (and the metadata dict if asked).

    Validates the header: known dtypes, offsets in range and equal to shape*itemsize.
    """
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: file too short ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise SafetensorsError(f"{path}: header length {n} exceeds file size {len(blob)}")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: bad JSON header: {e}") from e
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _ITEMSIZE:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {dt}")
        shape = tuple(int(s) for s in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
        numel = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(data)):
            raise SafetensorsError(f"{path}: tensor {name}: offsets {begin},{end} out of range")
        if end - begin != numel * _ITEMSIZE[dt]:
            raise SafetensorsError(
                f"{path}: tensor {name}: {end - begin} bytes for shape {shape} dtype {dt}")
        raw = data[begin:end]
        if dt == "BF16":
            arr = _bf16_to_f32(raw)
        else:
            arr = np.frombuffer(raw, dtype=_NP_DTYPES[dt])
        out[name] = arr.reshape(shape).copy()
    if with_metadata:
        return out, meta
    return out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: np.ndarray} (insertion order, contiguous offsets from 0).

    The header is padded with spaces to a multiple of 8 bytes, as Hugging Face does.
    Written atomically (temp file + rename).
    """
    header = {}
    chunks = []
    offset = 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype not in _WRITE_DTYPES:
            raise SafetensorsError(f"tensor {name}: cannot write dtype {arr.dtype}")
        dt = _WRITE_DTYPES[arr.dtype]
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)
