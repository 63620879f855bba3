"""A small pure-python safetensors reader/writer (numpy), for fp32/fp16/bf16/int checkpoints.

Format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
data region; offsets are relative to the data region start. Writer: tensors sorted by name,
packed back to back, header padded with spaces to a multiple of 8 bytes.
"""

import json
import struct

import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


def load_file(path):
    """-> dict name -> numpy array (BF16 is widened to float32)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if end > len(data):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file")
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            u16 = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        elif dt in _DTYPES:
            arr = np.frombuffer(data[begin:end], dtype=np.dtype(_DTYPES[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dt}")
        out[name] = arr.reshape(shape).copy()
    return out


def save_file(tensors, path, metadata=None):
    """dict name -> numpy array -> safetensors file (deterministic bytes)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        key = arr.dtype.newbyteorder("<").str if arr.dtype.byteorder == ">" else arr.dtype.str
        if key not in _NAMES:
            raise ValueError(f"tensor {name}: unsupported dtype {arr.dtype}")
        blob = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NAMES[key], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for blob in blobs:
            f.write(blob)
