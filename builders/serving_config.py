"""`serving:` of the build config: how TensorRT-LLM's LLM API serves a large model (attention data parallelism, MoE
expert parallelism, the MoE backend, CUDA graphs) and a checked pass-through for further LLM API options.

Every option written is a row of the contract ledger (ledger/llmapi.py, cited to tensorrt_llm/llmapi/
llm_args.py); the pass-through takes only names the ledger knows for the config's trtllm_version, and never one the
build writes itself (that value has its own field). builders/capacity.py sizes weights and KV per rank with these
fields; builders/engine/llmapi.py writes them (`serving_options`).

Upstream's DeepSeek-V3/R1 recipes (examples/models/core/deepseek_v3/README.md, trtllm-serve: `enable_attention_dp:
true` with `--tp_size 8 --ep_size 8`; docs/source/deployment-guide/deployment-guide-for-deepseek-r1-on-trtllm.md:
`moe_config.backend` CUTLASS on H100/H200 for FP8, `cuda_graph_config` {enable_padding, max_batch_size}) use these
for MTP; NVIDIA's published EAGLE-3 recipe for DeepSeek-V3 was not found, so the same fields are offered for EAGLE-3.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from core.trtllm_versions import TrtllmVersion

# moe_config.backend values the DeepSeek-R1 deployment guide's "MoE Backend Support Matrix" names
MOE_BACKENDS = ("CUTLASS", "TRTLLM", "DEEPGEMM", "WIDEEP")


class ServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)

    enable_attention_dp: bool = Field(
        default=False,
        description="Attention data parallelism (LLM API `enable_attention_dp`): each of the parallel.tp ranks runs "
        "attention for its own requests with the whole attention weights and its own KV cache, and the experts are "
        "split over the ranks. engine.max_batch_size is then per rank. engine.backend pytorch, trtllm_version 1.4.")
    moe_expert_parallel_size: int | None = Field(
        default=None, ge=1, le=64,
        description="MoE expert parallelism (LLM API `moe_expert_parallel_size`, trtllm-serve --ep_size): routed "
        "experts split over this many ranks; must divide parallel.tp (the rest is MoE tensor parallelism). Unset: "
        "TensorRT-LLM's default. MoE targets only; engine.backend pytorch, trtllm_version 1.4.")
    moe_backend: Literal["CUTLASS", "TRTLLM", "DEEPGEMM", "WIDEEP"] | None = Field(
        default=None,
        description="LLM API `moe_config.backend` (CUTLASS: FP8 on H100/H200; TRTLLM / CUTLASS: NVFP4 on B200; "
        "DEEPGEMM: FP8 on B200; WIDEEP: wide expert parallelism; the DeepSeek-R1 deployment guide). Unset: "
        "TensorRT-LLM's default (CUTLASS). MoE targets only.")
    cuda_graph_max_batch_size: int | None = Field(
        default=None, ge=1, le=1 << 16,
        description="LLM API `cuda_graph_config` {enable_padding: true, max_batch_size: N}: capture CUDA graphs up to "
        "N sequences per step, padding smaller batches. Unset: no cuda_graph_config is written (TensorRT-LLM's "
        "default).")
    extra_llm_api_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Further LLM API options merged into the written options (e.g. {print_iter_log: true, "
        "stream_interval: 10}). Each (dotted) name must be one the contract ledger knows for trtllm_version "
        "(docs/contracts.md, llmapi.option); names the build writes itself are refused naming their field.")

    def options(self) -> dict[str, Any]:
        """The LLM API options these fields write (pure; the pass-through is merged by `merged`)."""
        out: dict[str, Any] = {}
        if self.enable_attention_dp:
            out["enable_attention_dp"] = True
        if self.moe_expert_parallel_size is not None:
            out["moe_expert_parallel_size"] = self.moe_expert_parallel_size
        if self.moe_backend is not None:
            out["moe_config"] = {"backend": self.moe_backend}
        if self.cuda_graph_max_batch_size is not None:
            out["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": self.cuda_graph_max_batch_size}
        return out

    def is_set(self) -> list[str]:
        return [f"serving.{k}" for k, v in self.model_dump().items() if v not in (None, False, {})]


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, mapping into mapping (neither changed)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _Cfg(Protocol):
    trtllm_version: str
    engine: Any
    parallel: Any
    serving: ServingConfig

    @property
    def version(self) -> TrtllmVersion: ...  # the entry trtllm_version names


# Names the build writes from its own fields: a pass-through naming one is refused with the field to set instead.
OWNED = {
    "tensor_parallel_size": "parallel.tp", "pipeline_parallel_size": "parallel.pp",
    "max_batch_size": "engine.max_batch_size", "max_num_tokens": "engine.max_num_tokens",
    "max_seq_len": "engine.max_seq_len", "max_input_len": "engine.max_input_len", "dtype": "target.dtype",
    "kv_cache_config.dtype": "quantization.kv_cache",
    "kv_cache_config.free_gpu_memory_fraction": "triton.kv_cache_free_gpu_mem_fraction",
    "kv_cache_config.enable_block_reuse": "(the build: draft trees write KV for rejected tokens)",
    "speculative_config": "draft / tree", "enable_attention_dp": "serving.enable_attention_dp",
    "moe_expert_parallel_size": "serving.moe_expert_parallel_size", "moe_config.backend": "serving.moe_backend",
    "cuda_graph_config.max_batch_size": "serving.cuda_graph_max_batch_size",
    "cuda_graph_config.enable_padding": "serving.cuda_graph_max_batch_size",
    "enable_iter_perf_stats": "(the build: the metrics bridge reads it)",
}


def _flat(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out.append(prefix + str(k))
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
    return out


def owned_problems(extra: dict[str, Any]) -> list[str]:
    """Pass-through names the build writes from its own fields."""
    p = []
    for name in sorted(_flat(extra)):
        owner = OWNED.get(name) or next((OWNED[o] for o in OWNED if name.startswith(o + ".")), None)
        if owner is not None:
            p.append(f"serving.extra_llm_api_options.{name}: the build writes it from {owner}; set that instead and "
                     "remove it here")
    return p


def unknown_problems(extra: dict[str, Any], known: set[str], version_name: str) -> list[str]:
    """Pass-through names that are not LLM API options the contract ledger knows for the version (`known`: its
    llmapi.option rows, ledger; build.py passes them, so this module does not import the ledger)."""
    return [f"serving.extra_llm_api_options.{name}: not an LLM API option the contract ledger knows for "
            f"{version_name} (docs/contracts.md, llmapi.option); check the name against tensorrt_llm/llmapi/"
            "llm_args.py of your release, add its ledger row citing it, or remove it"
            for name in sorted(_flat(extra)) if name not in OWNED and name not in known
            and not any(k.startswith(name + ".") for k in known)]


def serving_problems(cfg: _Cfg) -> list[str]:
    """The serving fields this config cannot take (each names field, value and fix); the pass-through's names are
    checked against the ledger by build.py (`unknown_problems`)."""

    s, v = cfg.serving, cfg.version
    if not s.is_set():
        return []
    kind = cfg.engine.kind
    if kind.engine_flow or v.triton_layout != "llmapi":
        return [f"{', '.join(s.is_set())}: LLM API options of TensorRT-LLM's current line; engine.backend="
                f"{cfg.engine.backend} with trtllm_version '{v.key}' writes none. Set engine.backend pytorch and "
                "trtllm_version '1.4', or remove them"]
    p: list[str] = []
    ep, tp = s.moe_expert_parallel_size, cfg.parallel.tp
    if ep is not None and tp % ep:
        p.append(f"serving.moe_expert_parallel_size={ep} does not divide parallel.tp={tp}: the experts' ranks are "
                 f"moe_expert_parallel_size x moe_tensor_parallel_size = tp; set a divisor of {tp}")
    p += owned_problems(s.extra_llm_api_options)
    return p
