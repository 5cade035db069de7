"""Large models as their authors publish them, planned per GPU: KV per rank as TensorRT-LLM sizes it (MLA's latent
whole on every rank, GQA heads / tp unless attention data parallelism, the DSA indexer's FP8 keys and scales), the
serving fields (attention DP, expert parallelism, MoE backend, CUDA graphs, the checked pass-through) in the written
options and the ledger, the tree kinds each family is served with, and `--dry-run`'s plan: per-GPU arithmetic, the
sequences that fit, every problem at once (the memory refusal and the missing weights together)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from builders import build, capacity
from builders.config import ConfigError, load_config
from builders.engine import llmapi
from ledger import table as ledger
from builders.plan import tree_terms
from core.families import BY_NAME
from core.shapes import shape_of_config
from testkit.tiny_families import TINY, family_config, make_family_target, make_mimic_eagle3_head
from testkit.tiny_models import make_tokenizer

DEEPSEEK_V3 = Path(__file__).parent / "fixtures" / "configs" / "deepseek-v3.json"  # deepseek-ai/DeepSeek-V3's keys
FAMILY = {tiny: name for name, tiny in TINY.items()}
GIB = 1 << 30


def _config_dir(path: Path, cfg: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _tiny_config(tmp: Path, family: str) -> Path:
    row = BY_NAME[FAMILY[family]]
    return _config_dir(tmp / family, {**family_config(family), "architectures": [row.name],
                                      "model_type": row.model_type})


def _yaml(tmp: Path, name: str, target: Path, head: Path, tree: dict[str, Any], *, backend: str = "pytorch",
          tp: int = 1, version: str = "1.4", engine: dict[str, Any] | None = None, **sections: Any) -> Path:
    data: dict[str, Any] = {
        "name": name, "trtllm_version": version, "output_dir": str(tmp / f"out-{name}"),
        "target": {"model": str(target), "dtype": "float32" if backend == "reference" else "bfloat16"},
        "draft": {"type": "eagle3", "model": str(head)}, "tree": tree, "parallel": {"tp": tp},
        "engine": {"backend": backend, "max_batch_size": 4, "max_input_len": 32, "max_seq_len": 64, **(engine or {})},
        **sections}
    if backend == "reference":
        data["engine"]["device"] = "cpu"
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


CHAIN = {"choices": "chain-3"}
DYNAMIC = {"dynamic": {"top_k": 2, "depth": 3, "total_draft_tokens": 6}}


@pytest.mark.parametrize(("case", "tp", "adp", "per_rank"), [
    ("deepseek_v3", 8, False, 61 * (512 + 64) * 2),  # MLA: the whole latent on every rank, kv_factor 1
    ("deepseek_v3", 8, True, 61 * (512 + 64) * 2),
    ("deepseek_v32", 8, False, 61 * (512 + 64 + 128 + 128 // 128 * 4) * 2),  # + indexer FP8 keys + fp32 scales
    ("qwen3", 2, False, 3 * 2 * 2 * 16 * 2 // 2),  # GQA: 2 kv heads x 16 per layer, K and V, / tp
    ("qwen3", 2, True, 3 * 2 * 2 * 16 * 2),  # attention DP: every rank keeps its sequences' whole heads
])
def test_kv_per_rank_is_what_upstream_sizes(case: str, tp: int, adp: bool, per_rank: int, tmp_path: Path,
                                             eagle3_head: Path) -> None:
    if case.startswith("deepseek"):
        cfg = json.loads(DEEPSEEK_V3.read_text())
        if case == "deepseek_v32":
            cfg.update(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", index_head_dim=128,
                       index_n_heads=64, index_topk=2048)
        target = _config_dir(tmp_path / case, cfg)
    else:
        target = _tiny_config(tmp_path, case)
    serving = {"serving": {"enable_attention_dp": True}} if adp else {}
    conf = load_config(_yaml(tmp_path, "kv", target, eagle3_head, CHAIN, tp=tp,
                             engine={"memory_budget_gib": 1e5}, **serving))
    spec = shape_of_config(json.loads((target / "config.json").read_text()), "x")
    assert capacity.rank_memory(conf, spec).per_token == per_rank


def _sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A bf16 safetensors file of these shapes whose data is a hole (no disk used): the preflight reads headers."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


def _deepseek_v3_with_head(tmp: Path) -> tuple[Path, Path]:
    """The published DeepSeek-V3 config.json with a tokenizer (no weights yet) and an EAGLE-3 head of its shapes."""
    from builders.convert.llama import llama_spec
    from builders.convert.shapes import eagle3_head_shapes
    from core.families import eagle3_head_config

    cfg = json.loads(DEEPSEEK_V3.read_text())
    target = _config_dir(tmp / "DeepSeek-V3", cfg)
    make_tokenizer(target)
    head = _config_dir(tmp / "eagle3", {**eagle3_head_config(cfg), "architectures": ["LlamaForCausalLMEagle3"],
                                        "num_hidden_layers": 1, "draft_vocab_size": 32000,
                                        "target_hidden_size": cfg["hidden_size"],
                                        "eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    spec_of = lambda d: llama_spec(d, require_arch=False)  # noqa: E731
    required, optional = eagle3_head_shapes(spec_of(head), spec_of(target), "midlayer", 3, cfg["hidden_size"], 32000)
    _sparse_safetensors(head / "model.safetensors",
                        {**required, **{k: v for k, v in optional.items() if k in ("lm_head.weight", "d2t")}})
    return target, head


def test_deepseek_v3_plan_per_gpu_with_attention_dp(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """tp 8 with attention DP on the PyTorch backend of 1.4, sized in bf16 (the published checkpoint's FP8 block
    weights are sized by their quantization_config once the build reads it): the plan shows each GPU's weights (the
    non-expert part whole, the routed experts / 8), the MLA KV of a sequence whole on every rank, the logits, the
    sequences that fit, the files and the container command; without weights the build is refused after the plan."""
    target, head = _deepseek_v3_with_head(tmp_path)
    serving = {"serving": {"enable_attention_dp": True, "moe_expert_parallel_size": 8, "moe_backend": "CUTLASS",
                           "cuda_graph_max_batch_size": 8}}
    engine = {"backend": "pytorch", "max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 4096}
    data = yaml.safe_load(_yaml(tmp_path, "dsv3", target, head, CHAIN, tp=8, **serving).read_text())
    data["engine"] = {**engine, "memory_budget_gib": 200}
    cfg_path = tmp_path / "dsv3.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    assert build.main([str(cfg_path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    spec = shape_of_config(json.loads(DEEPSEEK_V3.read_text()), "x")
    weights = (spec.params - spec.expert_params) * 2 + spec.expert_params * 2 // 8
    kv = 4096 * 61 * 576 * 2
    logits = max(8 * 4, 1024) * spec.vocab_size * 4
    fit = int((200 * GIB - weights - logits) * 0.9) // kv
    assert f"weights  {weights / GIB:,.2f} GiB" in out and f"KV cache {kv / GIB:,.2f} GiB" in out, out
    assert "70,272 bytes/token per rank, whole on every rank" in out, out
    assert f"logits   {logits / GIB:,.2f} GiB" in out and f"total    {(weights + kv + logits) / GIB:,.2f} GiB" in out
    assert f"that fit: {fit} per rank x 8 ranks = {fit * 8}" in out, out
    assert "speculative_config: max_draft_len=3 (drafting steps) (a chain)" in out, out
    assert "llm_api_options.yaml" in out and "config.resolved.yaml" in out, out
    assert "docker run -d --gpus 8 --shm-size 2g" in out and f"-v {tmp_path}:/build" in out, out
    assert "serve /build/out-dsv3" in out, out
    # refused after the plan: only the missing weights (the head, the tokenizer and the capacity pass)
    assert "1 problem(s)" in err and "no weights (model.safetensors" in err, err
    # on an H200's 141 GiB the bf16 sizing does not fit: the refusal comes with every other problem, not instead
    data["engine"]["memory_budget_gib"] = 141
    cfg_path.write_text(yaml.safe_dump(data))
    assert build.main([str(cfg_path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "DOES NOT FIT" in out and "2 problem(s)" in err, err
    assert f"weights {weights / GIB:,.2f} GiB" in err and "no weights (model.safetensors" in err, err
    # the weights arrive: the plan passes
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    data["engine"]["memory_budget_gib"] = 200
    cfg_path.write_text(yaml.safe_dump(data))
    assert build.main([str(cfg_path), "--dry-run"]) == 0, capsys.readouterr().err


CHAIN_ONLY = {"deepseek_v3": "multi-head latent attention", "deepseek_v32": "multi-head latent attention",
              "glm_moe_dsa": "multi-head latent attention", "gpt_oss": "sliding-window attention",
              "laguna": "sliding-window attention", "qwen3_next": "recurrent layers", "nemotron_h": "recurrent layers"}


@pytest.mark.parametrize("family", [*CHAIN_ONLY, "qwen3_moe", "glm4_moe", "seed_oss", "apertus"])
def test_dynamic_trees_only_where_the_pytorch_backend_serves_them(family: str, tmp_path: Path,
                                                                   eagle3_head: Path) -> None:
    target = _tiny_config(tmp_path, family)
    path = _yaml(tmp_path, "dyn", target, eagle3_head, DYNAMIC, engine={"memory_budget_gib": 1e4})
    data = yaml.safe_load(path.read_text())
    if family in CHAIN_ONLY:
        with pytest.raises(ConfigError) as e:
            load_config(path)
        text = str(e.value)
        assert f"tree.dynamic (top_k 2) for TensorRT-LLM's PyTorch backend: {FAMILY[family]}" in text, text
        assert CHAIN_ONLY[family] in text and "Use a chain: tree.choices: chain-3" in text, text
        if "attention" in CHAIN_ONLY[family]:
            assert "PR #13081" in text, text
    else:
        conf = load_config(path)
        spec = llmapi.speculative_config(conf, Path("head"), [0, 1, 2], 3, FAMILY[family])
        assert (spec["use_dynamic_tree"], spec["dynamic_tree_max_topK"], spec["max_total_draft_tokens"]) == (True, 2, 6)
        # the plan speaks the written terms: drafting steps and the tree's size, not the engine flow's max_draft_len
        terms = tree_terms(conf)
        assert "max_draft_len=3 (drafting steps), max_total_draft_tokens=6, dynamic_tree_max_topK=2" in terms, terms
        assert "num_eagle_layers" not in terms and "max_draft_len=6" not in terms, terms
    # top_k 1 is a chain on every row: accepted, written without the tree worker's keys
    data["tree"] = {"dynamic": {"top_k": 1, "depth": 3, "total_draft_tokens": 3}}
    path.write_text(yaml.safe_dump(data))
    spec = llmapi.speculative_config(load_config(path), Path("head"), [0, 1, 2], 3, FAMILY[family])
    assert spec["max_draft_len"] == 3 and not {"use_dynamic_tree", "dynamic_tree_max_topK",
                                               "max_total_draft_tokens"} & set(spec), spec


def test_the_reference_engine_warns_what_the_pytorch_backend_would_refuse(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    target = make_family_target(tmp_path / "target", "deepseek_v3")
    head = make_mimic_eagle3_head(tmp_path / "head", target)
    assert build.main([str(_yaml(tmp_path, "ref", target, head, DYNAMIC, backend="reference")), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "warning: engine.backend pytorch would refuse this config: tree.dynamic (top_k 2)" in err, err
    assert "multi-head latent attention" in err and "chain-3" in err, err
    assert build.main([str(_yaml(tmp_path, "refc", target, head, CHAIN, backend="reference")), "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_serving_fields_are_written_and_every_name_is_a_ledger_row(tmp_path: Path, eagle3_head: Path) -> None:
    target = _tiny_config(tmp_path, "deepseek_v3")
    extra = {"print_iter_log": True, "cuda_graph_config": {"batch_sizes": [1, 2, 4]},
             "moe_config": {"use_low_precision_moe_combine": True}}
    serving = {"enable_attention_dp": True, "moe_expert_parallel_size": 2, "moe_backend": "DEEPGEMM",
               "cuda_graph_max_batch_size": 4, "extra_llm_api_options": extra}
    cfg = load_config(_yaml(tmp_path, "srv", target, eagle3_head, CHAIN, tp=2, serving=serving))
    opts = llmapi.llm_api_options(cfg, Path("head"), [0, 1, 2], 3, "DeepseekV3ForCausalLM")
    assert opts["enable_attention_dp"] is True and opts["moe_expert_parallel_size"] == 2
    assert opts["moe_config"] == {"backend": "DEEPGEMM", "use_low_precision_moe_combine": True}
    assert opts["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 4, "batch_sizes": [1, 2, 4]}
    assert opts["print_iter_log"] is True and opts["tensor_parallel_size"] == 2
    flags = ledger.flags_of(attention_dp=True, ep=True, moe_backend=True, cuda_graph=True)
    assert ledger.check("llmapi.option", "1.4", ledger.flat_keys(opts), flags) == []
    # a required serving row that goes missing is named
    del opts["enable_attention_dp"]
    (p,) = ledger.check("llmapi.option", "1.4", ledger.flat_keys(opts), flags)
    assert "required 'enable_attention_dp' is missing" in p, p


def test_serving_refusals_are_named_all_at_once(tmp_path: Path, eagle3_head: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    moe = _tiny_config(tmp_path, "deepseek_v3")
    extra = {"print_iter_log": True, "max_batch_size": 4, "moe_config": {"backend": "CUTLASS"}}
    path = _yaml(tmp_path, "bad", moe, eagle3_head, CHAIN, tp=4,
                 serving={"moe_expert_parallel_size": 3, "extra_llm_api_options": extra})
    with pytest.raises(ConfigError) as e:
        load_config(path)
    text = str(e.value)
    assert "serving.moe_expert_parallel_size=3 does not divide parallel.tp=4" in text, text
    assert "serving.extra_llm_api_options.max_batch_size: the build writes it from engine.max_batch_size" in text
    assert "serving.extra_llm_api_options.moe_config.backend: the build writes it from serving.moe_backend" in text
    assert "print_iter_log" not in text and "3 problem(s)" in text, text
    # names the ledger does not know for the version: refused by the build (and --dry-run) with the fix
    path = _yaml(tmp_path, "unknown", moe, eagle3_head, CHAIN, tp=2,
                 serving={"extra_llm_api_options": {"print_iter_log": True, "no_such_option": 1,
                                                    "kv_cache_config": {"no_such_key": 2}}})
    assert build.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    for name in ("no_such_option", "kv_cache_config.no_such_key"):
        assert (f"serving.extra_llm_api_options.{name}: not an LLM API option the contract ledger knows for "
                "TensorRT-LLM 1.4") in err and "add its ledger row citing it, or remove it" in err, err
    assert "print_iter_log" not in err and "extra_llm_api_options.kv_cache_config:" not in err, err
    dense = _tiny_config(tmp_path, "qwen3")
    with pytest.raises(ConfigError) as e:
        load_config(_yaml(tmp_path, "dense", dense, eagle3_head, CHAIN, tp=2,
                          serving={"moe_expert_parallel_size": 2, "moe_backend": "CUTLASS"}))
    assert "serving.moe_expert_parallel_size: Qwen3ForCausalLM has no routed experts; remove it" in str(e.value)
    assert "serving.moe_backend: Qwen3ForCausalLM has no routed experts" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(_yaml(tmp_path, "flow", dense, eagle3_head, {"choices": "chain-3"}, backend="reference",
                          version="1.2", serving={"enable_attention_dp": True}))
    assert ("serving.enable_attention_dp: LLM API options of TensorRT-LLM's current line; engine.backend=reference "
            "with trtllm_version '1.2' writes none") in str(e.value), str(e.value)


def test_every_row_states_its_capabilities_with_the_line_read() -> None:
    """Each family row: where its decoder writes EAGLE-3's features (a commit), the trees the PyTorch backend serves,
    its KV per rank and NVIDIA's support-matrix cell; the tables in docs/contracts.md and bring-your-own-model.md
    render them (tests/test_families.py checks the committed docs are regenerated)."""
    from builders.trtllm import architectures
    from core import capabilities
    from core.families import FAMILIES

    assert capabilities.unverified_capture(FAMILIES) == []
    for f in FAMILIES:
        assert "maybe_capture_hidden_states" in capabilities.capture_of(f) and "commit" in capabilities.capture_of(f)
        chain = f.attention in ("mla", "compressed", "hybrid-linear", "hybrid-mamba") or f.model_type in (
            "gpt_oss", "laguna")
        assert (capabilities.trees_of(f) == "chain") == chain, f.name
    assert capabilities.matrix_status(BY_NAME["DeepseekV3ForCausalLM"]) == "EAGLE-3 one-model: No"
    assert capabilities.matrix_status(BY_NAME["Qwen3MoeForCausalLM"]) == "EAGLE-3 one-model: Yes"
    table = "\n".join(architectures.capability_table())
    assert "PR #13081" in table and "PR #15842" in table and "PR #9893" in table and "d2a5560a" in table
    guide = "\n".join(architectures.guide_table())
    assert "| chain | kv_lora_rank + qk_rope_head_dim per layer, whole on every rank | EAGLE-3 one-model: No |" in guide


def test_k_exaone_is_refused_for_eagle3_with_the_reason() -> None:
    """ExaoneMoEForCausalLM derives from SpecDecOneEngineForCausalLM, but its model's forward never hands the layers
    spec_metadata and no layer captures, so EAGLE-3's features would never be written."""
    from builders.trtllm import architectures

    assert "ExaoneMoEForCausalLM" not in BY_NAME
    for backend in ("pytorch", "reference"):
        [p] = architectures.problems("ExaoneMoEForCausalLM", version="1.4", backend=backend, draft_type="eagle3",
                                     where="t")
        assert "does not run EAGLE-3 there" in p and "ExaoneMoeModel.forward calls its decoder layers without " \
            "spec_metadata" in p and "0d30bf12" in p and "its speculative path is MTP" in p, p


def test_published_deepseek_v3_fp8_blocks_plan_within_an_h200(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    """The published DeepSeek-V3 config.json as its authors ship it (quantization_config: fp8, 128x128 weight blocks),
    tp 8 with attention DP on 1.4: sized at its FP8 bytes (embedding, LM head and MLA kv_b_proj at 16 bit, the rest one
    byte per weight plus a float32 scale per 128x128 block), the plan fits an H200's 141 GiB per GPU."""
    from core.quant import checkpoint_quant, kv_b_params
    from core.quant import weight_bytes as quant_bytes

    target, head = _deepseek_v3_with_head(tmp_path)
    published = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    cfg = {**json.loads(DEEPSEEK_V3.read_text()), "quantization_config": published}
    (target / "config.json").write_text(json.dumps(cfg))
    serving = {"serving": {"enable_attention_dp": True, "moe_expert_parallel_size": 8}}
    data = yaml.safe_load(_yaml(tmp_path, "dsv3", target, head, CHAIN, tp=8, **serving).read_text())
    data["engine"] = {"backend": "pytorch", "max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 4096,
                      "memory_budget_gib": 141}
    cfg_path = tmp_path / "dsv3.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))  # the weights are there
    assert build.main([str(cfg_path), "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    spec = shape_of_config(cfg, "x")
    quant = checkpoint_quant(cfg, None, "x")
    assert quant is not None and quant.algo == "FP8_BLOCK_SCALES"

    def fp8(params: int) -> int:
        return quant_bytes(params, vocab=spec.vocab_size, hidden=spec.hidden_size, tied=False, dtype_bytes=2,
                           quant=quant, kv_b_params=kv_b_params(cfg))

    total, dense = fp8(spec.params), fp8(spec.params - spec.expert_params)
    weights = dense + (total - dense) // 8
    assert spec.params <= total < spec.params * 1.02  # about one byte per weight, not two
    assert f"weights  {weights / GIB:,.2f} GiB" in out and "as published: FP8_BLOCK_SCALES" in out, out
    assert weights < 100 * GIB and ": fits" in out and "DOES NOT FIT" not in out, out
    assert "70,272 bytes/token per rank, whole on every rank" in out, out
