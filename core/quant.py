"""A target checkpoint's own quantization, as TensorRT-LLM's PyTorch backend reads it, and the bytes its weights take
(torch-free: builders/capacity.py sizes the target with `weight_bytes`, the convert preflight and the ledger check
validate with `checkpoint_quant`).

Where upstream reads it (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py, the ledger's `published.*` rows):
- `hf_quant_config.json` (ModelOpt's export) first: `ModelConfig.load_modelopt_quant_config` /
  `_build_modelopt_quant_config` take `quantization.quant_algo` and `kv_cache_quant_algo` as QuantAlgo names
  (`QuantAlgo(value)`: the upper-case enum names of tensorrt_llm/quantization/mode.py), `group_size` and
  `exclude_modules`; FP8_BLOCK_SCALES defaults group_size to 128.
- else config.json's `quantization_config`, `ModelConfig.load_hf_quant_config`: `quant_method` fp8 with
  `weight_block_size` (DeepSeek-V3's 128x128 blocks; any other block size fails an assert) or `activation_scheme`
  static -> FP8_BLOCK_SCALES, excluding `*kv_b_proj*`, `*k_b_proj*`, `*eh_proj` (loaded at 16 bits) on top of
  `modules_to_not_convert`; `mxfp4` (group 32), `mxfp8` (1x32 blocks), `nvfp4` (group 16 only), `compressed-tensors`
  (llm-compressor); an inline ModelOpt block is read as the file would be. `ignored_layers` / `ignore` are excluded
  whatever the format. Anything else sets no quant_algo: the weights would be read as they are, so it is refused.

Bytes (`weight_bytes`): the quantized parameters at the algorithm's bits per weight including its scales (FP8 per
tensor: 8; 128x128 blocks: 8 + one float32 per 16,384 weights; NVFP4: 4 + one e4m3 per 16; MXFP4: 4 + one byte per
32; MXFP8: 8 + one byte per 32; INT4 AWQ / GPTQ: 4 + one 16-bit scale per group of 128; INT8: 8), the embedding and
an untied LM head at the 16-bit dtype (ModelOpt excludes them, the HF FP8 checkpoints keep them 16-bit), and with
128x128 blocks on an MLA target the kv_b_proj that upstream excludes at 16 bits. Norms and routers (under 0.1% of a
large target) are counted at the quantized width: the budget check stays a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from core.shapes import ShapeError

MODELOPT_FILE = "hf_quant_config.json"
# tensorrt_llm/quantization/mode.py QuantAlgo: the names this builder sizes, with bits per stored weight (scales in)
BITS: dict[str, Fraction] = {
    "FP8": Fraction(8), "FP8_PER_CHANNEL_PER_TOKEN": Fraction(8), "FP8_BLOCK_SCALES": 8 + Fraction(32, 128 * 128),
    "NVFP4": 4 + Fraction(8, 16), "W4A8_NVFP4_FP8": 4 + Fraction(8, 16), "MXFP8": 8 + Fraction(8, 32),
    "W4A16_MXFP4": 4 + Fraction(8, 32), "W4A8_MXFP4_FP8": 4 + Fraction(8, 32), "W4A8_MXFP4_MXFP8": 4 + Fraction(8, 32),
    "W4A16_AWQ": 4 + Fraction(16, 128), "W4A8_AWQ": 4 + Fraction(16, 128), "W4A16_GPTQ": 4 + Fraction(16, 128),
    "W4A16": Fraction(4), "W8A16": Fraction(8), "W8A16_GPTQ": Fraction(8), "INT8": Fraction(8),
}
KV_ALGOS = ("FP8", "INT8", "NVFP4")  # mode.py KV_CACHE_QUANT_ALGO_LIST
HF_METHODS = ("fp8", "mxfp4", "mxfp8", "nvfp4", "compressed-tensors", "modelopt")
BLOCK_EXCLUDE = ("*kv_b_proj*", "*k_b_proj*", "*eh_proj")  # load_hf_quant_config's FP8_BLOCK_SCALES defaults


class QuantConfigError(ShapeError):
    """A checkpoint's quantization config that TensorRT-LLM would misread or refuse; the message lists every problem
    (a ShapeError: a target whose bytes cannot be known)."""


@dataclass(frozen=True)
class CheckpointQuant:
    algo: str  # a QuantAlgo name
    source: str  # the file it was read from
    kv_cache_algo: str | None = None
    group_size: int | None = None
    exclude: tuple[str, ...] = ()

    @property
    def bits(self) -> Fraction:
        return BITS[self.algo]

    def describe(self) -> str:
        g = f", group {self.group_size}" if self.group_size else ""
        kv = f", KV cache {self.kv_cache_algo}" if self.kv_cache_algo else ""
        return f"{self.algo}{g}{kv} ({self.source})"


def _str_list(v: Any, what: str, p: list[str]) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        p.append(f"{what}={v!r}: expected a list of module names (strings)")
        return ()
    return tuple(v)


def _algo(v: Any, key: str, allowed: tuple[str, ...] | dict[str, Fraction], p: list[str]) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or v not in allowed:
        hint = f" (TensorRT-LLM's QuantAlgo names are upper case: {v.upper()!r})" if (
            isinstance(v, str) and v.upper() in allowed) else ""
        p.append(f"{key}={v!r}: not one of {', '.join(allowed)}{hint}")
        return None
    return v


def _modelopt(q: Any, source: str) -> CheckpointQuant | None:
    p: list[str] = []
    if not isinstance(q, dict):
        raise QuantConfigError(f"{source}: no `quantization` object (ModelOpt writes quant_algo, "
                               "kv_cache_quant_algo and exclude_modules there); re-export the checkpoint")
    # _build_modelopt_quant_config reads each with .get (None when absent); ModelOpt writes all three when it
    # quantizes weights, and no exclude_modules for a KV-cache-only export
    for key in ("quant_algo", "kv_cache_quant_algo") + (("exclude_modules",) if q.get("quant_algo") else ()):
        if key not in q:
            p.append(f"quantization.{key} is missing (ModelOpt writes it, null when unused)")
    if q.get("quant_algo") == "MIXED_PRECISION":
        p.append("quantization.quant_algo='MIXED_PRECISION': per-layer quantization is not sized or checked by this "
                 "builder; use a checkpoint with one quant_algo")
        algo = None
    else:
        algo = _algo(q.get("quant_algo"), "quantization.quant_algo", BITS, p)
    kv = _algo(q.get("kv_cache_quant_algo"), "quantization.kv_cache_quant_algo", KV_ALGOS, p)
    exclude = _str_list(q.get("exclude_modules"), "quantization.exclude_modules", p)
    group = q.get("group_size")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool) or group <= 0):
        p.append(f"quantization.group_size={group!r}: expected a positive integer")
    if algo == "NVFP4" and group not in (None, 16):
        p.append(f"quantization.group_size={group!r}: TensorRT-LLM's NVFP4 takes 16")
    if p:
        raise QuantConfigError(f"{source}: " + "; ".join(p))
    if algo is None and kv is None:
        return None
    if algo == "FP8_BLOCK_SCALES" and group is None:
        group = 128
    return CheckpointQuant(algo or "KV_ONLY", source, kv, group, exclude)  # KV_ONLY: 16-bit weights


def _hf(qc: dict[str, Any], source: str) -> CheckpointQuant:
    p: list[str] = []
    method = qc.get("quant_method")
    exclude = (_str_list(qc.get("modules_to_not_convert"), "quantization_config.modules_to_not_convert", p)
               + _str_list(qc.get("ignored_layers"), "quantization_config.ignored_layers", p)
               + _str_list(qc.get("ignore"), "quantization_config.ignore", p))
    algo, group = None, None
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is None and qc.get("activation_scheme") != "static":
            p.append("quant_method 'fp8' without weight_block_size or activation_scheme 'static': TensorRT-LLM's "
                     "loader sets no quant_algo for it and would read the float8 weights without their scales")
        elif block is not None and (not isinstance(block, list) or block != [128, 128]):
            p.append(f"weight_block_size={block!r}: TensorRT-LLM's FP8_BLOCK_SCALES takes [128, 128] only")
        algo, group, exclude = "FP8_BLOCK_SCALES", 128, exclude + BLOCK_EXCLUDE
    elif method == "mxfp4":
        algo, group = "W4A16_MXFP4", 32
    elif method == "mxfp8":
        block = qc.get("weight_block_size", [1, 32])
        if block != [1, 32]:
            p.append(f"weight_block_size={block!r}: TensorRT-LLM's MXFP8 takes [1, 32] only")
        algo, group = "MXFP8", 32
    elif method == "nvfp4":
        if qc.get("group_size", 16) != 16:
            p.append(f"group_size={qc.get('group_size')!r}: TensorRT-LLM's NVFP4 takes 16 only")
        algo, group = "NVFP4", 16
    elif method == "compressed-tensors":
        algo = _compressed_tensors_algo(qc, p)
    else:
        p.append(f"quant_method={method!r}: TensorRT-LLM's loader reads {', '.join(HF_METHODS)}; use one of those "
                 "or the 16-bit checkpoint")
    if p:
        raise QuantConfigError(f"{source} quantization_config: " + "; ".join(p))
    assert algo is not None
    return CheckpointQuant(algo, source, None, group, exclude)


def _compressed_tensors_algo(qc: dict[str, Any], p: list[str]) -> str | None:
    """The weights' bits of an llm-compressor checkpoint (config_groups.*.weights.num_bits / type)."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        p.append("compressed-tensors without config_groups: nothing says how the weights are stored")
        return None
    kinds = set()
    for g in groups.values():
        w = (g or {}).get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            p.append("compressed-tensors config group without `weights`")
            return None
        kinds.add((w.get("num_bits"), w.get("type")))
    if len(kinds) != 1:
        p.append(f"compressed-tensors with several weight formats {sorted(map(str, kinds))}: not sized by this builder")
        return None
    bits, kind = kinds.pop()
    table: dict[tuple[Any, Any], str] = {(8, "float"): "FP8", (4, "float"): "NVFP4", (8, "int"): "W8A16",
                                          (4, "int"): "W4A16_GPTQ"}
    if (bits, kind) not in table:
        p.append(f"compressed-tensors weights num_bits={bits!r} type={kind!r}: not sized by this builder")
        return None
    return table[(bits, kind)]


def checkpoint_quant(config: dict[str, Any], modelopt: dict[str, Any] | None, where: str) -> CheckpointQuant | None:
    """The quantization TensorRT-LLM reads for a checkpoint whose config.json is `config` and whose
    hf_quant_config.json is `modelopt` (None: absent); None for a 16-bit checkpoint. QuantConfigError lists every
    problem."""
    if modelopt is not None:
        if not isinstance(modelopt, dict):
            raise QuantConfigError(f"{where}/{MODELOPT_FILE}: not a JSON object; re-export the checkpoint")
        return _modelopt(modelopt.get("quantization"), f"{where}/{MODELOPT_FILE}")
    qc = config.get("quantization_config")
    if qc is None:
        return None
    src = f"{where}/config.json"
    if not isinstance(qc, dict):
        raise QuantConfigError(f"{src}: quantization_config={qc!r} is not an object")
    if qc.get("quant_method") == "modelopt" or "quant_algo" in qc:  # an inline ModelOpt block, read as the file is
        return _modelopt(qc.get("quantization", qc), src)
    return _hf(qc, src)


def weight_bytes(params: int, *, vocab: int, hidden: int, tied: bool, dtype_bytes: int,
                 quant: CheckpointQuant | None, kv_b_params: int = 0) -> int:
    """Bytes of a target's weights: all `params` at `dtype_bytes` without quantization; else the embedding and an
    untied LM head (and with 128x128 blocks the MLA kv_b_proj, `kv_b_params`) at `dtype_bytes`, the rest at the
    algorithm's bits per weight (module docstring)."""
    if quant is None or quant.algo == "KV_ONLY":
        return params * dtype_bytes
    sixteen = vocab * hidden * (1 if tied else 2) + (kv_b_params if quant.algo == "FP8_BLOCK_SCALES" else 0)
    sixteen = min(sixteen, params)
    return sixteen * dtype_bytes + math.ceil((params - sixteen) * quant.bits / 8)


def kv_b_params(config: dict[str, Any]) -> int:
    """Parameters of every MLA kv_b_proj (kv_lora_rank x heads x (qk_nope_head_dim + v_head_dim)); 0 without MLA."""
    rank = config.get("kv_lora_rank")
    if not rank:
        return 0
    heads = int(config.get("num_attention_heads") or 0)
    per = int(config.get("qk_nope_head_dim") or 0) + int(config.get("v_head_dim") or 0)
    return int(rank) * heads * per * int(config.get("num_hidden_layers") or 0)


def build_quant(weights: str) -> CheckpointQuant | None:
    """What ModelOpt's export of `quantization.weights` (none / fp8 / nvfp4) writes: embedding and LM head excluded."""
    algo = {"fp8": "FP8", "nvfp4": "NVFP4"}.get(weights)
    return None if algo is None else CheckpointQuant(algo, "quantization.weights", None,
                                                      16 if algo == "NVFP4" else None, ("lm_head",))
