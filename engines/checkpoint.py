"""Load TRT-LLM checkpoints (config.json + rank{r}.safetensors) into the reference model.

Tensor names follow TensorRT-LLM's Llama layout (tensorrt_llm/models/llama/convert.py, models/eagle/weight.py;
written here by builders/convert): `transformer.vocab_embedding`, `transformer.layers.{i}.{input_layernorm,
attention.qkv, attention.dense, post_layernorm, mlp.fc (= HF gate_proj), mlp.gate (= HF up_proj), mlp.proj}`,
`transformer.ln_f`, `lm_head`; an `EagleForCausalLM` checkpoint adds `eagle_nets.{k}.drafter.*` and
`eagle_nets.{k}.lm_head` (num_eagle_layers identical copies of the head: copy 0 is used).

FP8 (quantization.quant_algo "FP8", as ModelOpt's TRT-LLM export writes it: modelopt/torch/export/
quant_utils.py, tensorrt_llm/quantization/layers.py FP8Linear): a quantized linear stores `weight` as
float8_e4m3fn plus per-tensor `weights_scaling_factor` (w = fp8 * scale) and `activation_scaling_factor` (the
input is quantized as fp8(x / scale)); kv_cache_quant_algo "FP8" adds `attention.kv_cache_scaling_factor`.
Modules matching `exclude_modules` stay 16-bit. Loading is strict: a missing tensor or an unused one is an error.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from core.hfconfig import llama_spec
from core.families import Traits, traits
from engines.errors import CheckpointError
from engines.heads import Eagle1Drafter, Eagle3Drafter
from engines.layers import Attention, DecoderLayer, LMHead, MLP, QKNorm, Rope, RopeConfig
from engines.linear import Linear
from engines.model import Llama
from engines.parallel import TPGroup

if TYPE_CHECKING:
    from engines.generic import GenericTarget

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}




@dataclass(frozen=True)
class Quant:
    fp8_weights: bool
    fp8_kv: bool
    exclude: tuple[str, ...]

    def excluded(self, module: str) -> bool:
        """ModelOpt writes exclude_modules as names or wildcard patterns (e.g. "lm_head", "*eagle*")."""
        return any(fnmatch.fnmatch(module, p) or module == p or module.startswith(p + ".") for p in self.exclude)


def read_config(ckpt: Path) -> dict[str, Any]:
    f = ckpt / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{f} not found: {ckpt} is not a TRT-LLM checkpoint dir (run the convert stage)")
    return json.loads(f.read_text())


def require(cfg: dict[str, Any], key: str, where: Path) -> Any:
    if key not in cfg:
        raise CheckpointError(f"{where}/config.json: missing key {key!r}; re-run the convert stage")
    return cfg[key]


def quant_of(cfg: dict[str, Any], where: Path) -> Quant:
    q = require(cfg, "quantization", where)
    algo, kv = q.get("quant_algo"), q.get("kv_cache_quant_algo")
    if algo not in (None, "FP8"):
        raise CheckpointError(
            f"{where}/config.json: quantization.quant_algo={algo!r}; the reference engine runs None or FP8"
        )
    if kv not in (None, "FP8"):
        raise CheckpointError(
            f"{where}/config.json: quantization.kv_cache_quant_algo={kv!r}; the reference engine runs None or FP8"
        )
    return Quant(algo == "FP8", kv == "FP8", tuple(q.get("exclude_modules") or ()))


class Tensors:
    """The tensors of one rank file, read on demand (unused copies such as eagle_nets.{k>0} are never loaded),
    tracking which were used so leftovers can be reported."""

    def __init__(self, path: Path, device: torch.device) -> None:
        if not path.is_file():
            raise CheckpointError(f"{path} not found; the checkpoint's mapping needs one file per rank")
        self.path = path
        self.device = device
        f = safe_open(str(path), "pt")
        self._file: Any = f  # None once closed
        self.names = set(f.keys())
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise CheckpointError(f"{self.path}: tensor {name!r} is missing; the checkpoint is incomplete (re-convert)")
        self.used.add(name)
        return self._file.get_tensor(name).to(self.device)

    def check_all_used(self, ignore_prefixes: tuple[str, ...]) -> None:
        left = sorted(k for k in self.names if k not in self.used and not k.startswith(ignore_prefixes))
        if left:
            raise CheckpointError(
                f"{self.path}: {len(left)} tensor(s) the engine does not know, e.g. {left[:4]}; the checkpoint layout "
                "does not match config.json (re-convert)"
            )

    def close(self) -> None:
        self._file = None


class Loader:
    def __init__(self, t: Tensors, dtype: torch.dtype, quant: Quant) -> None:
        self.t, self.dtype, self.quant = t, dtype, quant

    def vec(self, name: str) -> torch.Tensor:
        return self.t.get(name).to(self.dtype)

    def scale(self, name: str, rows: int = 1) -> torch.Tensor:
        """A float32 quantization scale: one value (or one per output row where `rows` allows), every one finite and
        positive; anything else would decode garbage silently, so it is refused naming the tensor."""
        s = self.t.get(name)
        if not s.is_floating_point() or s.dtype == torch.float8_e4m3fn:
            raise CheckpointError(f"{self.t.path}: {name} is {s.dtype}; a scale is float32 (re-export the checkpoint)")
        s = s.float()
        if s.numel() not in (1, rows):
            raise CheckpointError(f"{self.t.path}: {name} has shape {tuple(s.shape)}; expected one value"
                                  + (f" or one per output row ({rows})" if rows > 1 else "") + " (re-export)")
        bad = s[~(torch.isfinite(s) & (s > 0))]
        if bad.numel():
            raise CheckpointError(f"{self.t.path}: {name} holds {float(bad.flatten()[0])!r}; a quantization scale is "
                                  "finite and positive (re-calibrate or re-export the checkpoint)")
        return s

    def linear(self, module: str, bias: bool = False) -> Linear:
        w = self.t.get(f"{module}.weight")
        fp8 = self.quant.fp8_weights and not self.quant.excluded(module)
        act = None
        if w.dtype == torch.float8_e4m3fn:
            if not fp8:
                raise CheckpointError(
                    f"{self.t.path}: {module}.weight is FP8 but the config's quantization says this module is not "
                    "quantized (quant_algo / exclude_modules); fix config.json"
                )
            scale = self.scale(f"{module}.weights_scaling_factor", w.shape[0])
            # Per-tensor scale (shape [] or [1]); per-output-channel scales broadcast over rows.
            w = w.float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))
            act = self.scale(f"{module}.activation_scaling_factor").reshape(())
        elif fp8:
            raise CheckpointError(
                f"{self.t.path}: quant_algo is FP8 but {module}.weight is {w.dtype}; add {module!r} to "
                "quantization.exclude_modules or re-export the checkpoint"
            )
        b = self.vec(f"{module}.bias") if bias else None
        return Linear(w.to(self.dtype), b, act)


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    eps: float
    rope: RopeConfig
    attn_bias: bool
    mlp_bias: bool
    traits: Traits  # what the target computes beyond Llama (core/families.py)

    @classmethod
    def of(cls, cfg: dict[str, Any], where: Path) -> Dims:
        hidden, heads = require(cfg, "hidden_size", where), require(cfg, "num_attention_heads", where)
        head_dim = cfg.get("head_size") or hidden // heads
        return cls(
            hidden=hidden,
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            layers=require(cfg, "num_hidden_layers", where),
            vocab=require(cfg, "vocab_size", where),
            eps=float(require(cfg, "norm_epsilon", where)),
            rope=RopeConfig(head_dim, float(require(cfg, "rotary_base", where)), cfg.get("rotary_scaling"),
                            int(cfg.get("max_position_embeddings") or 2048)),
            attn_bias=bool(cfg.get("attn_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            traits=traits(cfg),
        )


def decoder_layer(ld: Loader, pre: str, d: Dims, group: TPGroup, *, input_norm: bool, kv_fp8: bool) -> DecoderLayer:
    heads = d.heads // group.size
    qkv = ld.linear(f"{pre}.attention.qkv", d.attn_bias or d.traits.qkv_bias)
    rows = qkv.weight.shape[0] // d.head_dim
    kv_heads = (rows - heads) // 2
    if kv_heads < 1 or heads + 2 * kv_heads != rows:
        raise CheckpointError(
            f"{ld.t.path}: {pre}.attention.qkv.weight has {qkv.weight.shape[0]} rows; expected (heads + 2 * kv_heads) "
            f"* head_size with {heads} local heads of size {d.head_dim}"
        )
    kv_scale = ld.scale(f"{pre}.attention.kv_cache_scaling_factor").reshape(()) if kv_fp8 else None
    qk_norm = None
    if d.traits.qk_norm:
        qk_norm = QKNorm(ld.vec(f"{pre}.attention.q_layernorm.weight"), ld.vec(f"{pre}.attention.k_layernorm.weight"),
                         heads, d.eps)
    dense = ld.linear(f"{pre}.attention.dense", d.attn_bias)
    attn = Attention(qkv, dense, heads, kv_heads, d.head_dim, group, kv_scale, qk_norm)
    mlp = MLP(
        ld.linear(f"{pre}.mlp.fc", d.mlp_bias), ld.linear(f"{pre}.mlp.gate", d.mlp_bias),
        ld.linear(f"{pre}.mlp.proj", d.mlp_bias), group,
    )
    norm = ld.vec(f"{pre}.input_layernorm.weight") if input_norm else None
    return DecoderLayer(norm, attn, ld.vec(f"{pre}.post_layernorm.weight"), mlp, d.eps)


def lm_head(ld: Loader, name: str, vocab: int, group: TPGroup) -> LMHead:
    lin = ld.linear(name)
    per = -(-vocab // group.size)
    if lin.weight.shape[0] != per:
        raise CheckpointError(
            f"{ld.t.path}: {name}.weight has {lin.weight.shape[0]} rows; expected ceil(vocab {vocab} / tp {group.size})"
            f" = {per}"
        )
    return LMHead(lin, vocab, group)


def load_target(ld: Loader, cfg: dict[str, Any], where: Path, group: TPGroup, device: torch.device) -> Llama:
    if cfg.get("use_parallel_embedding"):
        raise CheckpointError(f"{where}/config.json: use_parallel_embedding=true is not supported; convert without it")
    mapping = require(cfg, "mapping", where)
    if mapping.get("pp_size", 1) != 1:
        raise CheckpointError(f"{where}: pp_size={mapping['pp_size']}; the reference engine runs tp only (pp=1)")
    d = Dims.of(cfg, where)
    layers = [
        decoder_layer(ld, f"transformer.layers.{i}", d, group, input_norm=True, kv_fp8=ld.quant.fp8_kv)
        for i in range(d.layers)
    ]
    head = lm_head(ld, "lm_head", d.vocab, group)
    return Llama(
        embed=ld.vec("transformer.vocab_embedding.weight"),
        layers=layers,
        norm=ld.vec("transformer.ln_f.weight"),
        lm_head=head,
        rope=Rope(d.rope, device),
        eps=d.eps,
        kv_heads=layers[0].attn.kv_heads,
        head_dim=d.head_dim,
    )


def load_eagle1(ld: Loader, cfg: dict[str, Any], where: Path, group: TPGroup, device: torch.device) -> Eagle1Drafter:
    """Head copy 0 of an EagleForCausalLM checkpoint (TRT-LLM's drafter runs tp = world size)."""
    net = require(cfg, "eagle_net_config", where)
    d = Dims.of(net, where)
    pre = "eagle_nets.0"
    # The head's linears are FP8 only when the checkpoint quantized them (Loader.linear checks exclude_modules); an
    # FP8 KV cache covers the drafter's attention too (TensorRT-LLM gives every Attention a kv_cache_scaling_factor).
    layers = [
        decoder_layer(ld, f"{pre}.drafter.layers.{j}", d, group, input_norm=j > 0, kv_fp8=ld.quant.fp8_kv)
        for j in range(d.layers)
    ]
    fc = ld.linear(f"{pre}.drafter.fc", bias=f"{pre}.drafter.fc.bias" in ld.t)
    gather: TPGroup | None = None
    if fc.weight.shape[0] != d.hidden:
        if fc.weight.shape[0] * group.size != d.hidden:
            raise CheckpointError(
                f"{ld.t.path}: {pre}.drafter.fc.weight has {fc.weight.shape[0]} rows for hidden {d.hidden}"
            )
        gather = group  # column-split fc (tensorrt_llm LLaMAModel fc_after_embed: ColumnLinear, gather_output)
    return Eagle1Drafter(
        embed=ld.vec(f"{pre}.drafter.vocab_embedding.weight"),
        fc=fc,
        fc_gather=gather,
        layers=layers,
        lm_head=lm_head(ld, f"{pre}.lm_head", d.vocab, group),
        rope=Rope(d.rope, device),
        kv_heads=layers[0].attn.kv_heads,
        head_dim=d.head_dim,
    )


def load_eagle3(
    head_dir: Path, target: Llama | GenericTarget, n_target_layers: int, dtype: torch.dtype, device: torch.device
) -> Eagle3Drafter:
    """A normalized EAGLE-3 head dir (HF names: midlayer.*, fc, norm, lm_head, d2t), replicated on every rank."""
    spec = llama_spec(head_dir, require_arch=False)
    raw = spec.raw
    where = head_dir / "config.json"
    if "eagle_aux_hidden_state_layer_ids" not in raw:
        raise CheckpointError(f"{where}: missing eagle_aux_hidden_state_layer_ids (the target layers to capture)")
    capture = tuple(int(i) for i in raw["eagle_aux_hidden_state_layer_ids"])
    bad = [i for i in capture if not 0 <= i <= n_target_layers]
    if bad:
        raise CheckpointError(
            f"{where}: eagle_aux_hidden_state_layer_ids {list(capture)} has ids {bad} outside 0..{n_target_layers} "
            "(id j = input of target layer j)"
        )
    t = Tensors(head_dir / "model.safetensors", device)
    ld = Loader(t, dtype, Quant(False, False, ()))
    one = TPGroup(0, 1)
    hd = spec.head_dim
    mid = "midlayer" if "midlayer.self_attn.q_proj.weight" in t else "layers.0"  # both spellings exist upstream
    q, k, v = (ld.vec(f"{mid}.self_attn.{n}_proj.weight") for n in "qkv")
    attn = Attention(
        Linear(torch.cat([q, k, v], 0)), Linear(ld.vec(f"{mid}.self_attn.o_proj.weight")),
        spec.num_attention_heads, spec.num_key_value_heads, hd, one,
    )
    fc, up, down = (Linear(ld.vec(f"{mid}.mlp.{n}_proj.weight")) for n in ("gate", "up", "down"))
    mlp = MLP(fc, up, down, one)
    d2t = t.get("d2t").long() if "d2t" in t else None
    if "t2d" in t:
        t.get("t2d")  # the inverse map is not needed for drafting
    lm = ld.vec("lm_head.weight")
    if d2t is None and lm.shape[0] != target.lm_head.vocab_size:
        raise CheckpointError(f"{head_dir}: lm_head has {lm.shape[0]} rows but no d2t maps them to the target vocab")
    embed = ld.vec("embed_tokens.weight") if "embed_tokens.weight" in t else target.embed
    drafter = Eagle3Drafter(
        embed=embed,
        fc=Linear(ld.vec("fc.weight"), ld.vec("fc.bias") if "fc.bias" in t else None),
        input_norm=ld.vec(f"{mid}.input_layernorm.weight"),
        hidden_norm=ld.vec(f"{mid}.hidden_norm.weight"),
        attn=attn,
        post_norm=ld.vec(f"{mid}.post_attention_layernorm.weight"),
        mlp=mlp,
        norm=ld.vec("norm.weight"),
        lm_head=Linear(lm),
        d2t=d2t,
        rope=Rope(RopeConfig(hd, spec.rope_theta, spec.rope_scaling, spec.max_position_embeddings), device),
        eps=spec.rms_norm_eps,
        kv_heads=spec.num_key_value_heads,
        head_dim=hd,
        capture=capture,
    )
    t.check_all_used(())
    return drafter


def rank_file(ckpt: Path, rank: int) -> Path:
    return ckpt / f"rank{rank}.safetensors"
