"""EAGLE-3 head trainer (head: eagle3 in training/train_head.py; training/eagle3_*.py) on a tiny 4-layer
target and real ShareGPT conversations.

Recipe checked against SafeAILab/EAGLE eagle/traineagle3/cnets.py (scandata vocabulary, d2t/t2d, midlayer,
training-time-test attention, position mask) and main.py (0.8**k step weights); the export is checked by
builders/convert/eagle3.py (through builders/build.py) and the reference engine (engines/heads.py Eagle3Drafter).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders.config import ConfigError
from training import data as tdata
from training.config import TrainHeadConfig, load_train_config
from training.eagle3_loop import Example3, collate3, eagle3_loss, plan3
from training.eagle3_train import examples3_of, setup3, train3
from training.eagle3_vocab import VocabError, answer_token_counts, build_draft_vocab
from training.features import FeatureSpec, build_features, sequence_features
from training.runner import TrainError, cached_features, make_samples
from testkit import tiny_models as tm

REPO = Path(__file__).resolve().parent.parent
LAYER_IDS = [1, 2, 3]  # the 4-layer target: inputs of layers 1..3 (SafeAILab's [2, L//2, L-3] needs L >= 5)
SPEC3 = FeatureSpec(tuple(LAYER_IDS), torch.float16)


def tiny_cfg3(
    tmp: Path, target: Path, *, e3: dict | None = None, data: dict | None = None, **train_over
) -> TrainHeadConfig:
    raw = yaml.safe_load((REPO / "configs/train/smollm2-eagle3.yaml").read_text())
    raw.update(target=str(target), work_dir=str(tmp / "work"), output_dir=str(tmp / "head"))
    raw["data"].update(dict(num_conversations=10, num_eval=2, max_prompt_tokens=48, max_seq_len=64, shard_size=4,
                            max_new_tokens=6, generate_batch_size=4), **(data or {}))
    raw["train"].update(dict(epochs=3, batch_size=4, lr=2e-3, warmup_steps=2, checkpoint_every=2, eval_every=100,
                             p_loss_positions=0), **train_over)
    raw["compute"].update(device="cpu", threads=2)
    raw["eagle3"].update(dict(draft_vocab_size=32, layer_ids=LAYER_IDS, chain_depth=3), **(e3 or {}))
    return TrainHeadConfig.model_validate(raw)


def _load(target: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        target
    )


@pytest.fixture(scope="module")
def target4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tm.make_target(tmp_path_factory.mktemp("t4") / "target", layers=4)


@pytest.fixture(scope="module")
def run3(target4: Path, tmp_path_factory: pytest.TempPathFactory):
    """10 real ShareGPT conversations (ShareGPT answers), data and EAGLE-3 feature shards built once."""
    tmp = tmp_path_factory.mktemp("train3")
    cfg = tiny_cfg3(tmp, target4)
    model, tok = _load(target4)
    work = Path(cfg.work_dir)
    data = tdata.build_data(model, tok, cfg.data, work)
    feats = build_features(model, data, work, SPEC3, cfg.features.batch_tokens)
    return cfg, model, make_samples(data, feats, SPEC3)


def materialize(samples: list) -> list[Example3]:
    return examples3_of(samples, cached_features)


def fresh(cfg: TrainHeadConfig, model, target: Path, train_set: list):
    return setup3(cfg, model, json.loads((target / "config.json").read_text()), train_set)


# ---- config ------------------------------------------------------------------------------------------------------


def test_config_head_kinds_and_cross_checks(tmp_path: Path) -> None:
    assert load_train_config(REPO / "configs/train/smollm2-eagle.yaml").head == "eagle"
    cfg = load_train_config(REPO / "configs/train/smollm2-eagle3.yaml")
    assert (cfg.head, cfg.eagle3.draft_vocab_size, cfg.eagle3.layer_ids) == ("eagle3", 8192, [2, 15, 27])
    assert cfg.output_dir == str(REPO / "heads/smollm2-eagle3")
    sd = load_train_config(REPO / "configs/train/smollm2-eagle3-sd.yaml")  # the self-distillation experiment
    assert (sd.data.responses, sd.eagle3.draft_vocab_size, sd.data.num_conversations) == ("regenerate", 4096, 512)
    raw = yaml.safe_load((REPO / "configs/train/smollm2-eagle3.yaml").read_text())
    raw["train"].update(v_weight=1.0, noise_std=0.2)
    raw["eagle3"]["layer_ids"] = [2, 2, 27]
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_train_config(f)
    assert "eagle3.layer_ids=[2, 2, 27] must be distinct ids >= 0" in str(e.value)
    raw["eagle3"]["layer_ids"] = [2, 15, 27]
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_train_config(f)
    assert "train.v_weight=1.0: EAGLE-3 has no feature-regression loss" in str(e.value)
    assert "train.noise_std=0.2: EAGLE-3 adds no feature noise" in str(e.value)
    del raw["eagle3"]
    raw["train"].update(v_weight=0.0, noise_std=0.0)
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="head=eagle3 needs an `eagle3:` section"):
        load_train_config(f)
    with pytest.raises(ConfigError, match="an `eagle3:` section is only used with head=eagle3"):
        load_train_config(REPO / "configs/train/smollm2-eagle3.yaml", ["head=eagle"])


# ---- draft vocabulary ----------------------------------------------------------------------------------------------


def test_draft_vocab_top_tokens_ties_and_maps() -> None:
    ex = [
        {
            "input_ids": torch.tensor([5, 9, 9, 3, 3, 7, 1, 1]),
            "loss_mask": torch.tensor([0, 1, 1, 1, 1, 1, 1, 1]).bool(),
        }
    ]
    counts = answer_token_counts(ex, 12)
    assert counts.tolist() == [0, 2, 0, 2, 0, 0, 0, 1, 0, 2, 0, 0]  # token 5 is outside the answer
    dv = build_draft_vocab(counts, 3)  # 1, 3, 9 (count 2) beat 7 (count 1); ties keep all three
    assert dv.draft_ids.tolist() == [1, 3, 9] and dv.d2t.tolist() == [1, 2, 7]
    assert dv.t2d.nonzero().flatten().tolist() == [1, 3, 9]
    assert dv.coverage == pytest.approx(6 / 7) and (dv.counted, dv.distinct) == (7, 4)
    assert build_draft_vocab(torch.tensor([0, 3, 3, 3, 1]), 2).draft_ids.tolist() == [1, 2]  # tie: smaller id
    with pytest.raises(VocabError, match=r"draft_vocab_size=5 but the training answers hold only 4 distinct tokens"):
        build_draft_vocab(counts, 5)


def test_draft_vocab_of_real_answers_is_consistent(run3) -> None:
    cfg, model, examples = run3
    train_set = examples[:-2]
    counts = answer_token_counts([{"input_ids": e.input_ids, "loss_mask": e.loss_mask} for e in train_set], 320)
    dv = build_draft_vocab(counts, 32)
    target_ids = torch.arange(32) + dv.d2t
    assert torch.equal(target_ids, dv.draft_ids) and bool(dv.t2d[target_ids].all()) and int(dv.t2d.sum()) == 32
    assert bool((dv.d2t >= 0).all()) and bool((dv.d2t[1:] >= dv.d2t[:-1]).all())  # ascending ids: monotone offsets
    top = torch.sort(counts, descending=True, stable=True).indices[:10]
    assert bool(dv.t2d[top].all())  # the most frequent answer tokens are in
    assert counts[dv.t2d].min() >= counts[~dv.t2d].max()  # nothing outside is more frequent than anything inside
    head, lm_sub, record = fresh(cfg, model, Path(cfg.target), train_set)
    assert torch.equal(head.d2t, dv.d2t) and torch.equal(head.t2d, dv.t2d)
    assert record["coverage"] == pytest.approx(dv.coverage) and 0.5 < dv.coverage < 1.0
    torch.testing.assert_close(lm_sub, model.get_output_embeddings().weight[dv.draft_ids])
    torch.testing.assert_close(head.lm_head.weight, lm_sub)  # lm_head_init: target


# ---- features and TTT ------------------------------------------------------------------------------------------------


def test_features_are_layer_inputs_last_hidden_and_greedy(run3) -> None:
    _, model, examples = run3
    e = materialize(examples[:1])[0]
    with torch.no_grad():
        out = model(input_ids=e.input_ids.long()[None], output_hidden_states=True)
    want = torch.cat([out.hidden_states[j][0] for j in LAYER_IDS], -1)  # HF: hidden_states[j] = input of layer j
    f = sequence_features(model, [e.input_ids], SPEC3, 4096)[0]
    torch.testing.assert_close(f["aux"], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        f["hidden"] @ model.get_output_embeddings().weight.T, out.logits[0], rtol=1e-4, atol=1e-4
    )
    assert torch.equal(f["greedy"], out.logits[0].argmax(-1))
    torch.testing.assert_close(e.aux.float(), want, rtol=2e-3, atol=2e-3)  # cached as float16
    assert e.aux.dtype == torch.float16 and e.greedy.dtype == torch.int32


def test_ttt_unroll_equals_sequential_chain_drafting(run3) -> None:
    """TTT step k at index t == drafting from root t one step at a time with a plain KV cache (true context keys
    <= t, then the root's own chain keys), teacher tokens, rope positions t..t+k."""
    cfg, model, examples = run3
    head, _, _ = fresh(cfg, model, Path(cfg.target), examples[:-2])
    head.eval()
    steps = 3
    batch = collate3(materialize(examples[:1]), steps)
    with torch.no_grad():
        outs = head.unroll(batch.aux, steps, lambda k, _p: batch.at("tokens", k))
        mid = head.midlayer
        attn = mid.self_attn

        def kv(feats: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor):
            h2 = torch.cat([mid.input_layernorm(head.embed_tokens(ids)), mid.hidden_norm(feats)], -1)
            cos, sin = head.rotary(h2, pos)
            return attn.qkv(h2, cos, sin)

        L = batch.length
        f0 = head.fc(batch.aux)
        _, k0, v0 = kv(f0, batch.tokens[:, :L], torch.arange(L)[None])
        for t in (0, 5, L - 4):
            feats, keys, vals = f0[:, t : t + 1], k0[:, :, : t + 1], v0[:, :, : t + 1]
            for k in range(steps):
                q, kk, vv = kv(feats, batch.tokens[:, t + k : t + k + 1], torch.tensor([[t + k]]))
                if k > 0:
                    keys, vals = torch.cat([keys, kk], 2), torch.cat([vals, vv], 2)
                o = F.scaled_dot_product_attention(q, keys, vals)  # one query: sees every cached key
                o = attn.o_proj(o.transpose(1, 2).reshape(1, 1, -1))
                feats = mid.finish(feats, o)
                torch.testing.assert_close(feats[0, 0], outs[k][0, t], rtol=1e-5, atol=1e-5)


def test_loss_weights_and_position_mask(run3) -> None:
    cfg, model, examples = run3
    head, lm_sub, _ = fresh(cfg, model, Path(cfg.target), examples[:-2])
    part = materialize(examples[:2])
    batch = collate3(part, 3)
    plans = plan3([e.loss_mask for e in part], 3, 0, None)
    with torch.no_grad():
        loss, m = eagle3_loss(head, lm_sub, batch, 3, 0.8, cfg.train, plans, [p.n_ce for p in plans])
        outs = head.unroll(batch.aux, 3, lambda k, _p: batch.at("tokens", k))
        mask = batch.at("lmask", 1)  # step 1 by hand
        greedy = batch.at("greedy_next", 1)[mask]
        p = (batch.at("hidden_next", 1)[mask] @ lm_sub.T).softmax(-1)
        logp = head.logits(outs[1][mask]).log_softmax(-1)
        keep = head.t2d[greedy]
        ce1 = -(p * logp).sum(-1)[keep].sum() / mask.sum()
    assert 0 < keep.sum() < mask.sum()  # some greedy tokens fall outside the 32-token draft vocabulary
    assert m["ploss_1"] == pytest.approx(ce1.item(), rel=1e-5) and m["tokens_1"] == int(mask.sum())
    # Every step predicts the same answer positions (step k from roots k positions earlier, cnets shifts loss_mask).
    assert m["tokens_0"] == m["tokens_1"] == m["tokens_2"] == int(batch.at("lmask", 0).sum())
    assert m["loss"] == pytest.approx(m["ploss_0"] + 0.8 * m["ploss_1"] + 0.64 * m["ploss_2"], rel=1e-5)


# ---- training ------------------------------------------------------------------------------------------------------


def test_loss_decreases(run3, tmp_path: Path) -> None:
    cfg, model, examples = run3
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": 6})})
    head, lm_sub, _ = fresh(cfg, model, Path(cfg.target), examples[:-2])
    log = [r for r in train3(cfg, head, lm_sub, examples[:-2], examples[-2:], tmp_path / "ckpt") if "loss" in r]
    assert len(log) == 6 * 2  # 8 training conversations / batch 4 * 6 epochs
    first, last = sum(r["loss"] for r in log[:2]), sum(r["loss"] for r in log[-2:])  # same batches (one epoch)
    assert last < 0.8 * first, (first, last)
    assert all(set(r) >= {f"acc_{k}" for k in range(3)} | {f"ploss_{k}" for k in range(3)} for r in log)


def test_resume_equals_uninterrupted_run_bitwise(run3, tmp_path: Path) -> None:
    cfg, model, examples = run3
    tr, ev = examples[:-2], examples[-2:]
    straight, lm_sub, _ = fresh(cfg, model, Path(cfg.target), tr)
    full_log = train3(cfg, straight, lm_sub, tr, ev, tmp_path / "a")
    interrupted, _, _ = fresh(cfg, model, Path(cfg.target), tr)
    train3(cfg, interrupted, lm_sub, tr, ev, tmp_path / "b", stop_at=3)  # checkpoint at step 3
    assert sorted(p.name for p in (tmp_path / "b").glob("*.pt")) == ["step-0000002.pt", "step-0000003.pt"]
    resumed, _, _ = fresh(cfg, model, Path(cfg.target), tr)  # a new process: fresh init, then the checkpoint
    log = train3(cfg, resumed, lm_sub, tr, ev, tmp_path / "b")
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 7)) and log == full_log
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k
    live = [json.loads(x) for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert live == json.loads(json.dumps(log))
    other = cfg.model_copy(update={"eagle3": cfg.eagle3.model_copy(update={"ttt_steps": 2})})
    with pytest.raises(TrainError, match="different data/train config"):
        train3(other, fresh(other, model, Path(cfg.target), tr)[0], lm_sub, tr, ev, tmp_path / "b")


# ---- output: converter via build.py, reference engine ------------------------------------------------------------


def build_and_generate(head_dir: Path, target: Path, out: Path, prompts: list[list[int]], max_new: int):
    """builders/build.py (draft.type eagle3, reference engine) -> (speculative results, target-only results)."""
    from builders import build
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    data = {
        "name": "tiny-eagle3", "trtllm_version": "1.1", "output_dir": str(out / "build"),
        "target": {"model": str(target), "dtype": "float32"},
        "draft": {"type": "eagle3", "model": str(head_dir)},
        "tree": {"choices": "chain-3"},
        "engine": {"backend": "reference", "max_batch_size": 4, "max_input_len": 96, "max_seq_len": 160},
    }
    (out / "build.yaml").write_text(yaml.safe_dump(data))
    assert build.main([str(out / "build.yaml"), "--only", "checkpoint", "--only", "engine"]) == 0
    eng = ReferenceEngine.from_build(out / "build")
    reqs = [GenerationRequest(prompt_ids=p, max_new_tokens=max_new, sampling=SamplingParams(), stop_token_ids=[])
            for p in prompts]
    return eng.generate(reqs), eng.generate(reqs, speculative=False)


def test_cli_output_converts_via_build_and_is_lossless(target4: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    from training import train_head

    cfg = tiny_cfg3(tmp_path, target4, epochs=1)
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert train_head.main([str(cfg_file)]) == 0
    head_dir = Path(cfg.output_dir)
    assert sorted(p.name for p in head_dir.iterdir()) == ["config.json", "model.safetensors", "recipe.yaml",
                                                          "train_log.jsonl"]
    hcfg = json.loads((head_dir / "config.json").read_text())
    assert hcfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (hcfg["num_hidden_layers"], hcfg["draft_vocab_size"], hcfg["target_hidden_size"], hcfg["bias"]) == (
        1,
        32,
        64,
        False,
    )
    assert hcfg["eagle_aux_hidden_state_layer_ids"] == LAYER_IDS and hcfg["torch_dtype"] == "float16"
    with safe_open(str(head_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("fc.weight").shape == (64, 3 * 64) and f.get_tensor("fc.weight").dtype == torch.float16
        assert f.get_tensor("lm_head.weight").shape == (32, 64)
        assert (f.get_tensor("d2t").dtype, f.get_tensor("t2d").dtype) == (torch.int64, torch.bool)
    mid = {f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    mid |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"} | {
        f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")
    }
    assert keys == mid | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    first = json.loads((head_dir / "train_log.jsonl").read_text().splitlines()[0])
    assert first["draft_vocab_size"] == 32 and 0 < first["coverage"] < 1

    _, tok = _load(target4)
    prompts = [
        tdata.prompt_ids(tok, [{"role": "user", "content": t}])
        for t in ("Hello world!", "What is the capital of France?")
    ]
    spec, plain = build_and_generate(head_dir, target4, tmp_path, prompts, 16)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]  # lossless with the trained head
    assert all(r.stats.tau >= 1.0 for r in spec)


@pytest.mark.slow
def test_self_distilled_head_accepts_drafts(target4: Path, tmp_path: Path) -> None:
    """Trained on the tiny target's own greedy answers, the head's drafts are accepted by the reference engine on
    those prompts (tau > 1), and its offline chain estimate agrees that it drafts better than chance."""
    from training import train_head

    cfg = tiny_cfg3(tmp_path, target4, data=dict(responses="regenerate", max_new_tokens=24), epochs=40, lr=5e-3,
                    warmup_steps=4, checkpoint_every=1000, eval_every=1000, e3=dict(draft_vocab_size=16))
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert train_head.main([str(cfg_file)]) == 0
    log = [json.loads(x) for x in (Path(cfg.output_dir) / "train_log.jsonl").read_text().splitlines()]
    final = [r for r in log if "eval_chain_tau" in r][-1]
    model, tok = _load(target4)
    convs = tdata.select_conversations(tok, cfg.data)[:4]  # training conversations
    prompts = [tdata.prompt_ids(tok, c.messages[:1]) for c in convs]
    spec, plain = build_and_generate(Path(cfg.output_dir), target4, tmp_path, prompts, 24)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    acc = sum(r.stats.accepted_draft_tokens for r in spec)
    fwd = sum(r.stats.target_forwards for r in spec)
    tau = (acc + fwd) / fwd
    print(f"self-distilled tiny EAGLE-3 head: engine tau {tau:.3f}, offline eval {final}")
    assert tau > 1.2, (tau, final)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
def test_cuda_bf16_self_distilled_eagle3_run_trains_and_converts_losslessly(target4: Path, tmp_path: Path) -> None:
    """compute.device cuda, precision bfloat16: answers, features and training-time test on the GPU; the loss falls,
    and the export builds and decodes losslessly in the reference engine on the CPU."""
    from training import train_head

    cfg = tiny_cfg3(tmp_path, target4, data=dict(responses="regenerate", max_new_tokens=24), epochs=12, lr=5e-3,
                    warmup_steps=2, checkpoint_every=1000, eval_every=1000, e3=dict(draft_vocab_size=16))
    raw = cfg.model_dump(mode="json")
    raw["compute"].update(device="cuda", precision="bfloat16", threads=0)
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    assert train_head.main([str(cfg_file)]) == 0
    key = json.loads((Path(cfg.work_dir) / "data/key.json").read_text())
    assert key["target_dtype"] == "torch.bfloat16"
    log = [json.loads(x) for x in (Path(cfg.output_dir) / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 24 and all(map(math.isfinite, losses))
    assert sum(losses[-2:]) < 0.8 * sum(losses[:2]), losses
    _, tok = _load(target4)
    prompts = [tdata.prompt_ids(tok, [{"role": "user", "content": t}]) for t in ("Hello world!", "Name a colour.")]
    spec, plain = build_and_generate(Path(cfg.output_dir), target4, tmp_path, prompts, 16)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
