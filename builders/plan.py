"""What `build.py --dry-run` prints beyond the stages: per GPU, weights + KV + state + logits against
engine.memory_budget_gib (builders/capacity.py `rank_memory`), how many sequences of max_seq_len fit, the tree limits
in the terms the chosen line writes, the files the build writes and the container command that serves it. Pure: it
reads the target's config.json only, so a plan can be made before the weights are downloaded."""

from __future__ import annotations

from pathlib import Path

from builders import capacity
from builders.config import BuildConfig
from builders.published import weights_label
from builders.versions import CPU_IMAGE, CURRENT_GPU_IMAGE, GPU_IMAGE
from core.quant import QuantConfigError
from core.shapes import ShapeError
from core.trees import DynamicTree


def tree_terms(cfg: BuildConfig) -> str:
    """The tree limits as the chosen line and backend write them."""
    lim, v, e = cfg.limits(), cfg.version, cfg.engine.kind
    tree = cfg.draft_tree
    if e.llmapi_model or (e.reference_engine and v.triton_layout == "llmapi"):
        head = f"speculative_config: max_draft_len={lim.num_eagle_layers} (drafting steps)"
        if isinstance(tree, DynamicTree) and tree.top_k > 1:
            return (f"{head}, max_total_draft_tokens={lim.max_draft_len}, dynamic_tree_max_topK={tree.top_k}; "
                    f"max_num_tokens={lim.max_num_tokens}")
        static = cfg.static_tree()
        if static is not None and not static.is_chain():
            return f"{head}, max_total_draft_tokens={lim.max_draft_len} (eagle_choices); " \
                   f"max_num_tokens={lim.max_num_tokens}"
        return f"{head} (a chain); max_num_tokens={lim.max_num_tokens}"
    return (f"max_draft_len={lim.max_draft_len} num_eagle_layers={lim.num_eagle_layers} "
            f"max_non_leaves_per_layer={lim.max_non_leaves_per_layer} max_num_tokens={lim.max_num_tokens}")


def _gib(n: int) -> str:
    return f"{n / capacity.GIB:,.2f} GiB"


def memory_lines(cfg: BuildConfig) -> list[str]:
    """Per GPU (rank) at the engine limits; a target that cannot be sized says why."""
    try:
        spec = capacity.target_shape_of(cfg)
        m, label = (capacity.rank_memory(cfg, spec), weights_label(cfg)) if spec is not None else (None, "")
    except ShapeError as err:
        return [f"  memory per GPU: cannot size the target ({err})"]
    except QuantConfigError as err:
        return [f"  memory per GPU: cannot size the target's quantized weights ({err})"]
    if spec is None or m is None:
        return ["  memory per GPU: target config.json unreadable or outside the family table (see the problems)"]
    e, tp = cfg.engine, cfg.parallel.tp
    adp = capacity.attention_dp(cfg)
    layout = ("attention data parallel: non-expert weights whole on every rank, routed experts / tp, each rank's own "
              "sequences" if adp else f"tensor parallel over {tp}")
    ranks = capacity.kv_ranks(cfg, spec)
    fits = "fits" if m.need <= m.budget else "DOES NOT FIT"
    seqs = m.sequences()
    total = f"{seqs} per rank x {tp} ranks = {seqs * tp}" if adp else f"{seqs}"
    out = [f"  memory per GPU ({layout}; budget engine.memory_budget_gib={e.memory_budget_gib:g} = {_gib(m.budget)}):",
           f"    weights  {_gib(m.weights)}  ({spec.params:,} parameters, {spec.expert_params:,} of them routed "
           f"experts, {label})",
           f"    KV cache {_gib(m.kv)}  ({m.kv_what}: {m.per_token:,} bytes/token per rank, "
           + ("whole on every rank" if ranks == 1 else f"split over {ranks} ranks") + ")",
           f"    state    {_gib(m.state)}",
           f"    logits   {_gib(m.logits)}  (max_num_tokens {cfg.limits().max_num_tokens} x vocab {spec.vocab_size} "
           "x 4 bytes)",
           f"    total    {_gib(m.need)} of {_gib(m.budget)}: {fits}"]
    if not e.kind.reference_engine:
        out.append(f"    sequences of max_seq_len={e.max_seq_len} that fit: {total} (KV pool = "
                   f"kv_cache_free_gpu_mem_fraction {m.pool_fraction:g} x what weights and logits leave)")
    return out


def container_command(cfg: BuildConfig) -> list[str]:
    """`docker run` serving this build with the image docker/ builds for its line (docs/deploy.md) (pure)."""
    build = Path(cfg.output_dir)
    e, v = cfg.engine.kind, cfg.version
    if e.reference_engine and cfg.engine.device == "cpu":
        image, gpus = CPU_IMAGE, []
    else:
        image = CURRENT_GPU_IMAGE if v.triton_layout == "llmapi" else GPU_IMAGE
        gpus = ["--gpus", str(cfg.parallel.tp * cfg.parallel.pp)]
    return ["docker", "run", "-d", *gpus, "--shm-size", "2g", "--ulimit", "memlock=-1", "-p",
            "127.0.0.1:8000-8002:8000-8002", "-v", f"{build.parent}:/build", image, "serve", f"/build/{build.name}"]


def plan_lines(cfg: BuildConfig) -> list[str]:
    out = [f"  tree ({cfg.version.name}): {tree_terms(cfg)}"]
    out += memory_lines(cfg)
    out.append(f"  writes   {Path(cfg.output_dir) / 'config.resolved.yaml'} and the stage outputs below")
    out.append(f"  serve    {' '.join(container_command(cfg))}")
    return out
