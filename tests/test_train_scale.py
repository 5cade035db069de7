"""Head training at scale: devices and precision, length-bucketed and self-distilled features, torchrun/DDP
(two gloo processes on the CPU), resume under another rank count, the transformers-4 keys of exported heads, and
the CUDA path (marked; skipped without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from training import data as tdata
from training.compute import ComputeError, resolve_compute
from training.config import TrainHeadConfig
from training.features import FeatureSpec, bucket_batches, sequence_features
from training.generate import regenerate_with_features

REPO = Path(__file__).resolve().parent.parent
SPEC = FeatureSpec(None, torch.float32)


def _load(target: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        target
    )


def _prompts(tok, n: int) -> list[list[int]]:
    texts = ["Hello world!", "What is the capital of France? Paris", "0123", "Tell me a story about a cat.",
             "Write a haiku.", "Why is the sky blue? Explain it to a child in detail, please."]
    return [tdata.prompt_ids(tok, [{"role": "user", "content": t}]) for t in texts[:n]]


# ---- length-bucketed and self-distilled features -----------------------------------------------------------------


def test_bucket_batches_respect_the_token_budget_and_sort_by_length() -> None:
    lengths = [5, 40, 7, 12, 33, 100, 8]
    batches = bucket_batches(lengths, batch_tokens=48)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [5]  # longer than the budget: alone, first
    for b in batches:
        assert len(b) == 1 or len(b) * lengths[b[0]] <= 48
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
    assert batches == [[5], [1], [4], [3, 6, 2, 0]]


def test_bucketed_features_equal_one_sequence_at_a_time(tiny_target: Path) -> None:
    model, tok = _load(tiny_target)
    seqs = [torch.tensor(p) for p in _prompts(tok, 6)]
    spec3 = FeatureSpec((1,), torch.float32)
    alone = [sequence_features(model, [s], spec3, 1)[0] for s in seqs]
    together = sequence_features(model, seqs, spec3, 4096)  # one padded batch
    for a, b in zip(alone, together):
        for k in ("hidden", "aux"):
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-4)
        assert torch.equal(a["greedy"], b["greedy"])
    full = model(input_ids=seqs[0][None]).logits[0]
    assert torch.equal(alone[0]["greedy"], full.argmax(-1))


def test_self_distilled_features_equal_a_separate_forward(tiny_target: Path) -> None:
    """The features kept while decoding are the target's features of prompt + answer (what features.py computes)."""
    model, tok = _load(tiny_target)
    prompts = _prompts(tok, 5)
    spec3 = FeatureSpec((0, 1), torch.float32)
    got = regenerate_with_features(model, prompts, 7, {tok.eos_token_id}, tok.pad_token_id, 3, spec3)
    for p, (answer, feats) in zip(prompts, got):
        seq = torch.tensor(p + answer)
        ref = sequence_features(model, [seq], spec3, 4096)[0]
        assert feats is not None and len(feats["hidden"]) == len(seq)
        for k in ("hidden", "aux"):
            torch.testing.assert_close(feats[k], ref[k], rtol=1e-4, atol=1e-4)
        assert torch.equal(feats["greedy"], ref["greedy"])


def test_reserved_kv_layer_writes_in_place_and_refuses_to_overflow() -> None:
    """The batch cache of self-distillation grows inside buffers reserved for the whole answer (no copy per step)."""
    from training.generate import _reserved_layer_class

    keys, values = torch.zeros(2, 1, 4, 3), torch.zeros(2, 1, 4, 3)
    layer = _reserved_layer_class()(keys, values, 2)
    assert layer.get_seq_length() == 2
    k, v = layer.update(torch.ones(2, 1, 1, 3), 2 * torch.ones(2, 1, 1, 3))
    assert k.shape == (2, 1, 3, 3) and k.data_ptr() == keys.data_ptr()  # a view of the reserved buffer
    assert torch.equal(keys[:, :, 2], torch.ones(2, 1, 3)) and torch.equal(values[:, :, 2], 2 * torch.ones(2, 1, 3))
    layer.update(torch.ones(2, 1, 1, 3), torch.ones(2, 1, 1, 3))
    with pytest.raises(RuntimeError, match="reserved KV cache of 4 positions is full \\(needs 5\\)"):
        layer.update(torch.ones(2, 1, 1, 3), torch.ones(2, 1, 1, 3))


# ---- torchrun / DDP on the CPU (gloo) -------------------------------------------------------------------------------

# Two gloo ranks vs one process after the same 6 steps: the sums over positions run in another order and padding
# differs, so weights match up to float32 rounding amplified by Adam (measured max |diff| 1.9e-5; bound 1e-4, below
# the 2e-3 of one step's update). Adam's update hides a wrong gradient SCALE, so its first moment (the running mean
# of the gradients) is compared too, relative to its largest entry.
DDP_ATOL = 1e-4
GRAD_RTOL = 1e-3


def scale_cfg(tmp: Path, target: Path, name: str, **data_over) -> Path:
    """A tiny-target config file: 7 training + 2 held-out conversations, batch 3 (the last batch of an epoch holds
    one example, so the second rank gets none), loss-position subsets and feature noise on."""
    raw = yaml.safe_load((REPO / "configs/train/smollm2-eagle-sd4k.yaml").read_text())
    raw.update(target=str(target), work_dir=str(tmp / name / "work"), output_dir=str(tmp / name / "head"))
    raw["data"].update(dict(num_conversations=9, num_eval=2, responses="dataset", max_prompt_tokens=48,
                            max_seq_len=64, shard_size=4, max_new_tokens=6, generate_batch_size=4), **data_over)
    raw["train"].update(epochs=2, batch_size=3, lr=2e-3, warmup_steps=2, checkpoint_every=1, eval_every=100,
                        p_loss_positions=3)
    raw["compute"].update(device="cpu", threads=1, precision="float32")
    TrainHeadConfig.model_validate(raw)
    f = tmp / f"{name}.yaml"
    f.write_text(yaml.safe_dump(raw))
    return f


def share_data(src: Path, dst: Path) -> None:
    """dst's run reads src's cached data and feature shards (the same slice), so runs differ only in ranks."""
    (dst / "work").mkdir(parents=True, exist_ok=True)
    for sub in ("data", "features"):
        (dst / "work" / sub).symlink_to(src / "work" / sub)


def train_cli(cfg: Path, ranks: int, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    if ranks == 1:
        argv = [sys.executable, str(REPO / "training/train_head.py"), str(cfg), *extra]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                str(REPO / "training/train_head.py"), str(cfg), *extra]
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def checkpoint(cfg: Path, step: int) -> dict:
    work = Path(yaml.safe_load(cfg.read_text())["work_dir"])
    return torch.load(work / "checkpoints" / f"step-{step:07d}.pt", weights_only=True)


def head_at(cfg: Path, step: int) -> dict[str, torch.Tensor]:
    return checkpoint(cfg, step)["head"]


def grad_mean_diff(a: Path, b: Path, step: int) -> float:
    """max |exp_avg_a - exp_avg_b| / max |exp_avg_a| over the optimizer's parameters."""
    sa, sb = checkpoint(a, step)["optim"]["state"], checkpoint(b, step)["optim"]["state"]
    diff = max((sa[i]["exp_avg"] - sb[i]["exp_avg"]).abs().max().item() for i in sa)
    return diff / max(sa[i]["exp_avg"].abs().max().item() for i in sa)


def initial_head(target: Path) -> dict[str, torch.Tensor]:
    from training.model import head_from_target

    model, _ = _load(target)
    tcfg = json.loads((target / "config.json").read_text())
    return head_from_target(tcfg, model.get_input_embeddings().weight.detach(), seed=0).state_dict()


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def mean_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Mean |a - b| over every trained parameter (the frozen embedding excluded)."""
    keys = [k for k in a if k != "embed_tokens.weight"]
    return sum((a[k].float() - b[k].float()).abs().sum().item() for k in keys) / sum(a[k].numel() for k in keys)


@pytest.fixture(scope="module")
def one_process(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("ddp")
    cfg = scale_cfg(tmp, tiny_target, "one")
    train_cli(cfg, 1)
    return tmp, cfg


def test_two_gloo_ranks_train_the_same_head_as_one_process(one_process, tiny_target: Path) -> None:
    tmp, one = one_process
    two = scale_cfg(tmp, tiny_target, "two")
    share_data(tmp / "one", tmp / "two")
    out = train_cli(two, 2)
    assert "2 rank(s)" in out.stdout
    total = 2 * 3  # 7 training conversations / batch 3 -> 3 steps per epoch, 2 epochs
    before, last = (
        max_diff(head_at(one, total - 1), head_at(two, total - 1)),
        max_diff(head_at(one, total), head_at(two, total)),
    )
    assert before < DDP_ATOL and last < DDP_ATOL, (before, last)
    assert grad_mean_diff(one, two, total) < GRAD_RTOL
    moved = max_diff(head_at(one, total), initial_head(tiny_target))
    # the heads really trained (not a comparison of two initial heads): Adam moves a parameter by at most about lr
    # per step (6 steps at 2e-3, 2 of them warm-up), so the largest move is well above 10x the tolerance
    assert moved > 10 * DDP_ATOL, moved
    log1 = [json.loads(x) for x in (tmp / "one/head/train_log.jsonl").read_text().splitlines()]
    log2 = [json.loads(x) for x in (tmp / "two/head/train_log.jsonl").read_text().splitlines()]
    for a, b in zip(log1, log2):
        if "loss" in a:  # the logged metrics are global sums over ranks: the same numbers
            assert (a["tokens"], a["ce_tokens"]) == (b["tokens"], b["ce_tokens"])
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)


def test_resume_under_another_rank_count(one_process, tiny_target: Path) -> None:
    """3 steps on 2 ranks, the rest in one process (and the other way round) == one uninterrupted process."""
    tmp, one = one_process
    total = 6
    for name, (before, after) in {"two-then-one": (2, 1), "one-then-two": (1, 2)}.items():
        cfg = scale_cfg(tmp, tiny_target, name)
        share_data(tmp / "one", tmp / name)
        out = train_cli(cfg, before, "--stop-at-step", "3")
        assert "stopped after step 3" in out.stdout and not (tmp / name / "head").exists()
        train_cli(cfg, after)
        assert max_diff(head_at(one, total), head_at(cfg, total)) < DDP_ATOL, name
        assert grad_mean_diff(one, cfg, total) < GRAD_RTOL, name
        steps = [json.loads(x)["step"] for x in (tmp / name / "head/train_log.jsonl").read_text().splitlines()
                 if "loss" in json.loads(x)]
        assert steps == list(range(1, total + 1))


# ---- devices and precision ------------------------------------------------------------------------------------------


def test_compute_resolution_and_refusals() -> None:
    from training.compute import cpu_has_native_bf16, usable_cores
    from training.config import ComputeConfig

    base = dict(device="cpu", precision="auto", tf32=True, threads=0, target_device_map="none")
    c = resolve_compute(ComputeConfig(**base), local_rank=1, local_world=2)
    assert c.device == torch.device("cpu") and c.bf16 == cpu_has_native_bf16()
    assert c.threads == max(1, usable_cores() // 2)  # all cores, shared by the ranks of this machine
    c = resolve_compute(ComputeConfig(**dict(base, precision="bfloat16", threads=3)))
    assert (c.bf16, c.target_dtype, c.threads) == (True, torch.bfloat16, 3)
    with c.autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16  # CPU bf16 autocast
    with pytest.raises(ComputeError, match="target_device_map=auto spreads the target over GPUs, but this run is on "
                                           "the CPU; set compute.target_device_map: none"):
        resolve_compute(ComputeConfig(**dict(base, target_device_map="auto")))
    if not torch.cuda.is_available():
        with pytest.raises(ComputeError, match="compute.device=cuda but torch sees no CUDA device"):
            resolve_compute(ComputeConfig(**dict(base, device="cuda")))


def convert_and_decode(target: Path, head_dir: Path, tmp: Path) -> None:
    """The exported head through the EAGLE converter and the reference engine: EAGLE output == target-only."""
    from builders.convert.eagle import convert_eagle
    from core.trees import DraftTree, preset
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    tree = DraftTree.from_choices(preset("topk-2-3"))
    convert_eagle(target, head_dir, tmp / "ckpt", dtype="float32", max_draft_len=tree.size,
                  num_eagle_layers=tree.depth, max_non_leaves_per_layer=tree.max_non_leaves_per_layer)
    eng = ReferenceEngine.from_checkpoint(tmp / "ckpt", tree=tree, dtype="float32", device="cpu")
    _, tok = _load(target)
    req = GenerationRequest(prompt_ids=_prompts(tok, 1)[0], max_new_tokens=12, sampling=SamplingParams(),
                            stop_token_ids=[])
    assert eng.generate([req])[0].output_ids == eng.generate([req], speculative=False)[0].output_ids


def test_cpu_bf16_self_distilled_run_trains_and_exports(tiny_target: Path, tmp_path: Path) -> None:
    """precision bfloat16 on the CPU: bf16 target (answers and features), head under bf16 autocast; the loss falls
    and the export converts and decodes losslessly."""
    cfg = scale_cfg(tmp_path, tiny_target, "bf16", responses="regenerate")
    raw = yaml.safe_load(cfg.read_text())
    raw["compute"]["precision"] = "bfloat16"
    raw["train"].update(epochs=6, p_loss_positions=0, noise_std=0.0)
    cfg.write_text(yaml.safe_dump(raw))
    out = train_cli(cfg, 1)
    assert "cpu, bf16 (target weights bf16, head under autocast)" in out.stdout
    work = Path(raw["work_dir"])
    assert json.loads((work / "data/key.json").read_text())["target_dtype"] == "torch.bfloat16"
    shard = torch.load(work / "features/shard-00000.pt", weights_only=True)
    assert shard["hidden"].dtype == torch.bfloat16 and shard["spec"]["kind"] == "eagle"
    log = [json.loads(x) for x in (Path(raw["output_dir"]) / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 18 and all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses  # the same 3 batches' worth: last epoch vs first
    convert_and_decode(tiny_target, Path(raw["output_dir"]), tmp_path)


def test_online_features_train_the_same_head_as_cached_shards(one_process, tiny_target: Path) -> None:
    """features.storage online (computed in every step, never stored) == cached shards, up to float rounding."""
    tmp, one = one_process
    cfg = scale_cfg(tmp, tiny_target, "online")
    raw = yaml.safe_load(cfg.read_text())
    raw["features"]["storage"] = "online"
    raw["features"]["dtype"] = "float16"
    cfg.write_text(yaml.safe_dump(raw))
    train_cli(cfg, 1)
    assert not (tmp / "online/work/features").exists()
    # the cached run trained on bf16-rounded features; the online one on float32: close, not equal
    # Adam moves a parameter by about lr per step whatever its gradient's size, so a parameter whose gradient is near
    # zero can step the other way under rounding: compare the mean difference with the mean distance trained.
    trained, apart = mean_diff(head_at(one, 6), initial_head(tiny_target)), mean_diff(head_at(one, 6), head_at(cfg, 6))
    assert apart < 0.02 * trained, (apart, trained)


# ---- the transformers-4 keys of exported heads ----------------------------------------------------------------------


def test_exported_configs_carry_rope_theta_and_torch_dtype() -> None:
    """transformers-4 readers (TensorRT-LLM 1.1 converters, SafeAILab EAGLE) read top-level `rope_theta`
    (default 10000) and `rope_scaling`; transformers 5 writes only `rope_parameters`."""
    from training.eagle3_model import eagle3_config_dict
    from training.model import head_config_dict

    tf5 = {"hidden_size": 64, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "dtype": "bfloat16"}
    assert head_config_dict(tf5, bias=True)["rope_theta"] == 500000.0
    assert "rope_scaling" not in head_config_dict(tf5, bias=True)
    llama3 = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = eagle3_config_dict(dict(tf5, rope_parameters=llama3), 32, [1, 2])
    assert cfg["rope_theta"] == 500000.0
    assert cfg["rope_scaling"] == {k: v for k, v in llama3.items() if k != "rope_theta"}
    tf4 = {"hidden_size": 64, "rope_theta": 1e6}  # a transformers-4 target config passes through unchanged
    assert head_config_dict(tf4, bias=False)["rope_theta"] == 1e6
    for head in ("smollm2-eagle", "smollm2-eagle3"):
        c = json.loads((REPO / "heads" / head / "config.json").read_text())
        assert c["rope_theta"] == c["rope_parameters"]["rope_theta"] == 100000.0, head
        assert c["torch_dtype"] == c["dtype"] == "float16", head


# ---- CUDA (skipped without a GPU) -----------------------------------------------------------------------------------

NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False (CPU-only torch or no device)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_cuda_bf16_run_trains_exports_and_matches_online(tiny_target: Path, tmp_path: Path) -> None:
    """compute.device cuda, precision bfloat16, TF32: answers, features and training on the GPU; the export
    converts and decodes losslessly on the CPU."""
    cfg = scale_cfg(tmp_path, tiny_target, "cuda", responses="regenerate")
    raw = yaml.safe_load(cfg.read_text())
    raw["compute"].update(device="cuda", precision="bfloat16", threads=0)
    raw["train"].update(epochs=6, p_loss_positions=0, noise_std=0.0)
    cfg.write_text(yaml.safe_dump(raw))
    out = train_cli(cfg, 1)
    assert "cuda:0, bf16" in out.stdout
    log = [json.loads(x) for x in (Path(raw["output_dir"]) / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    convert_and_decode(tiny_target, Path(raw["output_dir"]), tmp_path)
    if torch.cuda.device_count() >= 2:  # NCCL: two GPUs train the same head as one
        two = scale_cfg(tmp_path, tiny_target, "cuda2", responses="regenerate")
        raw2 = dict(raw, work_dir=str(tmp_path / "cuda2/work"), output_dir=str(tmp_path / "cuda2/head"))
        two.write_text(yaml.safe_dump(raw2))
        share_data(tmp_path / "cuda", tmp_path / "cuda2")
        train_cli(two, 2)
        assert max_diff(head_at(cfg, 18), head_at(two, 18)) < 1e-2  # bf16 rounding in another order
    spread = scale_cfg(tmp_path, tiny_target, "device-map", responses="regenerate")
    raw3 = dict(raw, work_dir=str(tmp_path / "device-map/work"))
    raw3["compute"] = dict(raw["compute"], target_device_map="auto")  # accelerate over every visible GPU
    spread.write_text(yaml.safe_dump(raw3))
    train_cli(spread, 1, "--until", "features")
    a = torch.load(tmp_path / "cuda/work/features/shard-00000.pt", weights_only=True)["hidden"].float()
    b = torch.load(tmp_path / "device-map/work/features/shard-00000.pt", weights_only=True)["hidden"].float()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


def test_two_gloo_ranks_train_the_same_eagle3_head(tmp_path: Path) -> None:
    """The EAGLE-3 loss (TTT steps, per-step position subsets, draft vocabulary) splits over ranks the same way."""
    from testkit import tiny_models as tm

    target = tm.make_target(tmp_path / "t4", layers=4)
    cfgs = {}
    for name in ("one3", "two3"):
        f = scale_cfg(tmp_path, target, name)
        raw = yaml.safe_load(f.read_text())
        e3 = yaml.safe_load((REPO / "configs/train/smollm2-eagle3.yaml").read_text())
        raw.update(head="eagle3", eagle3=dict(e3["eagle3"], draft_vocab_size=32, layer_ids=[1, 2, 3], chain_depth=3))
        raw["train"].update(v_weight=0.0, noise_std=0.0, p_weight=1.0)
        f.write_text(yaml.safe_dump(raw))
        cfgs[name] = f
    train_cli(cfgs["one3"], 1)
    share_data(tmp_path / "one3", tmp_path / "two3")
    train_cli(cfgs["two3"], 2)
    assert max_diff(head_at(cfgs["one3"], 6), head_at(cfgs["two3"], 6)) < DDP_ATOL
    assert grad_mean_diff(cfgs["one3"], cfgs["two3"], 6) < GRAD_RTOL


# ---- recipes ---------------------------------------------------------------------------------------------------------


def test_recipes_validate_and_the_held_out_set_does_not_depend_on_the_slice_size() -> None:
    from training.config import load_train_config
    from training.runner import Sample, split

    llama = load_train_config(REPO / "configs/train/llama31-8b-eagle3.yaml")
    assert (llama.compute.device, llama.compute.precision, llama.eagle3.ttt_steps) == ("cuda", "bfloat16", 7)
    demo = load_train_config(REPO / "configs/train/smollm2-eagle-sd4k.yaml")
    assert (demo.data.held_out, demo.data.responses, demo.features.dtype) == ("first", "regenerate", "bfloat16")
    samples = [Sample(torch.tensor([i]), torch.tensor([True]), None) for i in range(10)]
    small = demo.model_copy(update={"data": demo.data.model_copy(update={"num_eval": 3, "num_conversations": 6})})
    (tr_s, ev_s), (tr_l, ev_l) = split(samples[:6], small), split(samples, small)
    assert [int(s.input_ids) for s in ev_s] == [int(s.input_ids) for s in ev_l] == [0, 1, 2]
    assert [int(s.input_ids) for s in tr_s] == [3, 4, 5] and len(tr_l) == 7
    last = small.model_copy(update={"data": small.data.model_copy(update={"held_out": "last"})})
    assert [int(s.input_ids) for s in split(samples, last)[1]] == [7, 8, 9]


def test_curve_commands_share_one_cache_per_answer_type(tmp_path: Path) -> None:
    from bench import bench_train_curve as tc

    cfg = REPO / "configs/train/smollm2-eagle-sd4k.yaml"
    assert tc.cache_dir(cfg, "regenerate") == (REPO / ".cache/train/smollm2-eagle-sd").resolve()
    assert tc.cache_dir(cfg, "dataset") == (REPO / ".cache/train/smollm2-eagle-sd4k-dataset").resolve()
    argv = tc.train_argv(cfg, tmp_path, "dataset", 256, 6, 1)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sets == ["data.responses=dataset", "data.num_conversations=320", "train.epochs=6",
                    f"work_dir={tmp_path}/work/dataset-256", f"output_dir={tmp_path}/heads/dataset-256",
                    "compute.threads=1"]


@pytest.mark.parametrize("argv, message", [
    (["--batch-tokens", "8,x"], "'8,x': give comma-separated integers, e.g. 1024,8192"),
    (["--batch-tokens", "8"], "'8': every budget must be >= 16 tokens"),
    (["--answer-prompts", "64"], "--answer-prompts 64: give 1..--conversations (32)"),
])
def test_bench_train_rejects_bad_arguments(argv: list[str], message: str, capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train", REPO / "bench/bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
