"""Streaming access to Hugging Face weight files, and a streaming safetensors writer.

Reading: `WeightSource(dir)` indexes `model.safetensors`, a sharded `model.safetensors.index.json`,
`pytorch_model.bin` or a sharded `pytorch_model.bin.index.json` WITHOUT loading tensors. safetensors tensors are
read with plain positioned reads from the offsets in the header, one tensor (or one TP row range: rows are
contiguous in the row-major layout) at a time. We do not mmap them: mapped pages that were touched count as
resident memory until unmapped, so a mmap reader's peak RSS grows towards the model size. `.bin` files are opened
with `torch.load(weights_only=True, mmap=True)` (a pickle has no offsets to read from). A truncated or corrupt
file raises `WeightFileError` naming the file, before anything is written.

Writing: `write_safetensors(path, plan)` writes the safetensors header first (names, dtypes, shapes are known from
the plan) and then produces and writes one tensor at a time, so peak memory is one tensor, not one rank.
Format: u64 little-endian header length N, N bytes of JSON (space padded to 8 bytes), then the raw data
(safetensors spec, huggingface/safetensors README "Format").
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

# safetensors dtype codes <-> torch dtypes (safetensors/src/tensor.rs `Dtype`).
ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
TORCH_TO_ST = {v: k for k, v in ST_DTYPES.items()}

DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

_MAX_HEADER = 100 << 20  # safetensors itself refuses headers above 100 MB


class WeightFileError(ValueError):
    """A weight file is missing, truncated, corrupt or lacks a tensor; the message names the file and the fix."""


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int = -1  # absolute byte offset of the data in a safetensors file (-1 for .bin)


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header; raise WeightFileError if the file is truncated or corrupt."""
    size = path.stat().st_size
    fix = "re-download or re-copy it (a partial download or a full disk truncates weight files)"
    if size < 8:
        raise WeightFileError(f"{path}: truncated safetensors file ({size} bytes, no header); {fix}")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _MAX_HEADER or 8 + n > size:
            raise WeightFileError(
                f"{path}: truncated or corrupt safetensors file (header of {n} bytes, file {size}); {fix}"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise WeightFileError(f"{path}: corrupt safetensors header ({e}); {fix}") from None
    if not isinstance(header, dict):
        raise WeightFileError(f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object of "
                              f"tensors); {fix}")
    data_len = size - 8 - n
    out: dict[str, TensorInfo] = {}
    end_max = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dt = ST_DTYPES.get(str(meta.get("dtype"))) if isinstance(meta, dict) else None
        if dt is None:
            raise WeightFileError(f"{path}: tensor {name!r} has unsupported or missing dtype in the header; {fix}")
        begin, end, shape = _offsets_and_shape(path, name, meta, fix)
        numel = 1
        for s in shape:
            numel *= s
        if end - begin != numel * torch.empty((), dtype=dt).element_size():
            raise WeightFileError(f"{path}: tensor {name!r} byte range does not match its shape {shape}; {fix}")
        end_max = max(end_max, end)
        out[name] = TensorInfo(path, dt, shape, 8 + n + begin)
    if end_max > data_len:
        raise WeightFileError(
            f"{path}: truncated safetensors file: the header needs {end_max} data bytes but only {data_len} are "
            f"present ({end_max - data_len} missing); {fix}"
        )
    return out


def _offsets_and_shape(path: Path, name: str, meta: dict[str, Any], fix: str) -> tuple[int, int, tuple[int, ...]]:
    """A header entry's `data_offsets` [begin, end] (0 <= begin <= end) and `shape` (non-negative ints)."""
    try:
        begin, end = (int(x) for x in meta["data_offsets"])
        shape = tuple(int(x) for x in meta["shape"])
    except (KeyError, TypeError, ValueError):
        raise WeightFileError(
            f"{path}: tensor {name!r} has missing or malformed data_offsets/shape in the header "
            f"(got data_offsets={meta.get('data_offsets')!r}, shape={meta.get('shape')!r}); {fix}"
        ) from None
    if not 0 <= begin <= end or any(d < 0 for d in shape):
        raise WeightFileError(
            f"{path}: tensor {name!r} has invalid data_offsets {[begin, end]} or shape {shape}; {fix}"
        )
    return begin, end, shape


def _check_zip(path: Path) -> None:
    """torch.save files are zip archives; a truncated one has no end-of-central-directory record."""
    if not zipfile.is_zipfile(path):
        raise WeightFileError(
            f"{path}: not a readable torch zip archive (truncated, corrupt, or a legacy pre-1.6 pickle); re-download "
            "it, or re-save it with a current torch.save"
        )


class WeightSource:
    """Read-only, lazy view of the tensors of one HF model directory."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = Path(model_dir)
        self.files = self._discover()
        self._stack = ExitStack()
        self._handles: dict[Path, io.FileIO] = {}  # unbuffered: readinto() straight into the tensor
        self._bin_state: dict[Path, dict[str, torch.Tensor]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        for f in self.files:
            for name, info in self._index_file(f).items():
                if name in self.tensors:
                    raise WeightFileError(f"{f}: tensor {name!r} also appears in {self.tensors[name].file}")
                self.tensors[name] = info

    # ---- discovery ---------------------------------------------------------------------------------------------
    def _discover(self) -> list[Path]:
        d = self.dir
        for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            index = d / index_name
            if index.is_file():
                try:
                    weight_map = json.loads(index.read_text())["weight_map"]
                except (ValueError, KeyError) as e:
                    raise WeightFileError(f"{index}: unreadable shard index ({e!r}); re-download it") from None
                files = sorted({d / v for v in weight_map.values()})
                missing = [str(f) for f in files if not f.is_file()]
                if missing:
                    raise WeightFileError(
                        f"{index} lists shard(s) that are missing: {', '.join(missing)}; download them"
                    )
                return files
        for single in ("model.safetensors", "pytorch_model.bin"):
            if (d / single).is_file():
                return [d / single]
        raise WeightFileError(
            f"{d}: no weights found (expected model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
            "pytorch_model.bin.index.json)"
        )

    def _index_file(self, f: Path) -> dict[str, TensorInfo]:
        if f.suffix == ".safetensors":
            return read_safetensors_header(f)
        _check_zip(f)
        state = self._load_bin(f)
        return {k: TensorInfo(f, v.dtype, tuple(v.shape)) for k, v in state.items()}

    def _load_bin(self, f: Path) -> dict[str, torch.Tensor]:
        if f not in self._bin_state:
            try:
                # weights_only: never unpickle arbitrary objects; mmap: tensors stay on disk until read.
                state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # torch raises several types for corrupt archives
                raise WeightFileError(f"{f}: cannot be read by torch.load(weights_only=True): {e}") from None
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise WeightFileError(f"{f}: expected a flat state dict of tensors")
            self._bin_state[f] = state
        return self._bin_state[f]

    # ---- reading -----------------------------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightFileError(
                f"{self.dir}: tensor {name!r} not found in {', '.join(f.name for f in self.files)}"
            ) from None

    def read_as(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The whole tensor `name` cast to `dtype` (an OutTensor's make())."""
        return self.read(name).to(dtype)

    def read(self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """One tensor, or the rows (dim 0) / columns (dim 1) [start, stop) of it, read without the rest."""
        info = self.info(name)
        if dim is not None:
            self._check_range(name, info, dim, start, stop)
        if info.file.suffix == ".safetensors":
            if dim == 0:  # rows [start, stop) are one contiguous byte range
                return self._read_rows(info, start, info.shape[0] if stop is None else stop)
            t = self._read_rows(info, 0, info.shape[0]) if info.shape else self._read_rows(info, 0, 1)
            return t if dim is None else t[:, start:stop].contiguous()
        t = self._load_bin(info.file)[name]
        if dim is None:
            return t.clone()
        return (t[start:stop] if dim == 0 else t[:, start:stop]).clone()

    def row_bytes(self, name: str) -> int:
        info = self.info(name)
        row = torch.empty((), dtype=info.dtype).element_size()
        for d in info.shape[1:]:
            row *= d
        return row

    def byte_range(self, name: str, start: int = 0, stop: int | None = None) -> ByteRange | None:
        """Where rows [start, stop) of a tensor lie on disk, for a kernel-side copy; None for .bin files."""
        info = self.info(name)
        if info.offset < 0:
            return None
        if info.shape:
            self._check_range(name, info, 0, start, stop)
        stop = (info.shape[0] if info.shape else 1) if stop is None else stop
        row = self.row_bytes(name)
        return ByteRange(info.file, info.offset + start * row, (stop - start) * row)

    @staticmethod
    def _check_range(name: str, info: TensorInfo, dim: int, start: int, stop: int | None) -> None:
        """Never read outside a tensor: a range past its end would return the next tensor's bytes."""
        size = info.shape[dim] if dim < len(info.shape) else 0
        if not 0 <= start <= (size if stop is None else stop) <= size:
            raise WeightFileError(f"{info.file}: tensor {name!r} has shape {info.shape}; [{start}, {stop}) on dim "
                                  f"{dim} is outside it; the weights do not match their config.json")

    def _read_rows(self, info: TensorInfo, start: int, stop: int) -> torch.Tensor:
        f = self._handles.get(info.file)
        if f is None:
            f = self._stack.enter_context(info.file.open("rb", buffering=0))
            self._handles[info.file] = f
        row = torch.empty((), dtype=info.dtype).element_size()
        for d in info.shape[1:]:
            row *= d
        shape = (stop - start, *info.shape[1:]) if info.shape else ()
        buf = torch.empty((stop - start) * row, dtype=torch.uint8)  # not zero-filled: read straight into it
        view = buf.numpy().data  # a memoryview of the tensor's bytes
        f.seek(info.offset + start * row)
        got = 0
        while got < len(view):  # readinto may return short counts
            n = f.readinto(view[got:])
            if not n:
                raise WeightFileError(f"{info.file}: unexpected end of file while reading; the file is truncated")
            got += n
        return buf.view(info.dtype).reshape(shape)

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()
        self._bin_state.clear()

    def __enter__(self) -> WeightSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- writing ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ByteRange:
    """`length` bytes at `offset` of a source file, copied verbatim."""

    file: Path
    offset: int
    length: int


@dataclass(frozen=True)
class Zeros:
    length: int


Piece = ByteRange | Zeros


@dataclass(frozen=True)
class OutTensor:
    """One output tensor: its name, shape and dtype are known up front. Its bytes come either from `make()` (computed
    on demand: casts, column splits) or, when it is a verbatim concatenation of source byte ranges (same dtype, whole
    tensors or row ranges, zero padding), from `pieces`, copied by the kernel without passing through Python."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]
    pieces: tuple[Piece, ...] = ()

    @property
    def nbytes(self) -> int:
        n = torch.empty((), dtype=self.dtype).element_size()
        for d in self.shape:
            n *= d
        return n


_CHUNK = 16 << 20


def _pwrite_all(fd: int, data: memoryview | bytes, pos: int) -> int:
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], pos + done)
    return pos + done


def _copy_range(src_fd: int, dst_fd: int, src_pos: int, dst_pos: int, length: int) -> int:
    """Kernel copy (copy_file_range: no user-space buffer, reflinks where the filesystem can); pread/pwrite in
    16 MiB chunks where the kernel or filesystem refuses."""
    left = length
    try:
        while left:
            n = os.copy_file_range(src_fd, dst_fd, left, src_pos + length - left, dst_pos + length - left)
            if n == 0:
                raise OSError("copy_file_range returned 0 before the end of the range")
            left -= n
    except (OSError, AttributeError):
        while left:
            chunk = os.pread(src_fd, min(left, _CHUNK), src_pos + length - left)
            if not chunk:
                raise WeightFileError(f"source ended early while copying {length} bytes at offset {src_pos}") from None
            _pwrite_all(dst_fd, chunk, dst_pos + length - left)
            left -= len(chunk)
    return dst_pos + length


def _write_pieces(t: OutTensor, fd: int, pos: int, fds: dict[Path, int], stack: ExitStack) -> int:
    total = sum(p.length for p in t.pieces)
    if total != t.nbytes:
        raise AssertionError(f"{t.name}: pieces hold {total} bytes, planned {t.nbytes} (converter bug)")
    for p in t.pieces:
        if isinstance(p, Zeros):
            for a in range(0, p.length, _CHUNK):
                pos = _pwrite_all(fd, bytes(min(_CHUNK, p.length - a)), pos)
            continue
        if p.file not in fds:
            fds[p.file] = os.open(p.file, os.O_RDONLY)
            stack.callback(os.close, fds[p.file])
        pos = _copy_range(fds[p.file], fd, p.offset, pos, p.length)
    return pos


def _write_made(t: OutTensor, fd: int, pos: int) -> int:
    value = t.make()
    if tuple(value.shape) != t.shape or value.dtype != t.dtype:
        raise AssertionError(
            f"{t.name}: produced {tuple(value.shape)} {value.dtype}, planned {t.shape} {t.dtype} (converter bug)"
        )
    flat = value.detach().contiguous().reshape(-1)
    if flat.numel():
        pos = _pwrite_all(fd, flat.view(torch.uint8).numpy().data, pos)
    return pos


def write_safetensors(path: Path, plan: Iterable[OutTensor], desc: str, metadata: dict[str, str] | None = None) -> None:
    """Write `plan` as a safetensors file, one tensor at a time (tqdm progress per tensor)."""
    items = list(plan)
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for t in items:
        if t.name in header:
            raise ValueError(f"duplicate output tensor {t.name!r}")
        header[t.name] = {
            "dtype": TORCH_TO_ST[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data must start 8-byte aligned
    with ExitStack() as stack:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        stack.callback(os.close, fd)
        pos = _pwrite_all(fd, struct.pack("<Q", len(raw)) + raw, 0)
        fds: dict[Path, int] = {}
        for t in tqdm(items, desc=desc, unit="tensor", leave=False):
            pos = _write_pieces(t, fd, pos, fds, stack) if t.pieces else _write_made(t, fd, pos)
        if pos != 8 + len(raw) + offset:
            raise AssertionError(f"{path}: wrote {pos} bytes, planned {8 + len(raw) + offset} (converter bug)")
