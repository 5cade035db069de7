"""`make demo` (scripts/demo.py) end to end on the tiny fixtures, on the current line (EAGLE-3, TensorRT-LLM 1.4, the
llmapi model) and on the 1.1 engine flow: build, real Triton server, streamed chat answer, load test with report and
plots, server stopped, summary and verdict printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

from scripts import demo


def test_commands_are_the_documented_client_invocations(tmp_path: Path) -> None:
    plan = demo.plan_for(tmp_path / "c.yaml", quick=True, prompt="Hi there")
    assert demo.build_argv(plan.config)[1:] == [str(REPO / "builders/build.py"), str(tmp_path / "c.yaml")]
    gen = demo.generate_argv("127.0.0.1:9", tmp_path / "repo", plan)
    assert gen[1] == str(REPO / "clients/generate.py")
    assert gen[gen.index("--prompt") + 1] == "Hi there" and {"--stream", "--chat"} <= set(gen)
    assert gen[gen.index("--max-tokens") + 1] == "12"
    lt = demo.loadtest_argv("127.0.0.1:9", tmp_path / "repo", tmp_path / "p.jsonl", tmp_path / "out", plan)
    assert lt[lt.index("--concurrency") + 1] == "1" and lt[lt.index("--requests") + 1] == "2"
    assert lt[lt.index("--out") + 1] == str(tmp_path / "out")
    assert "--chat" in lt  # the load test sends what a chat client sends, as the streamed answer does
    full = demo.plan_for(tmp_path / "c.yaml", quick=False, prompt="x")
    assert (full.answer_tokens, full.load_concurrency, full.load_prompts) == (96, "1,2,4", None)
    assert "--baseline-url" not in lt
    both = demo.loadtest_argv("127.0.0.1:9", tmp_path / "repo", tmp_path / "p.jsonl", tmp_path / "out", plan,
                              baseline_url="127.0.0.1:10")
    assert both[both.index("--baseline-url") + 1] == "127.0.0.1:10"
    assert gen[gen.index("--timeout") + 1] == lt[lt.index("--timeout") + 1] == str(demo.REQUEST_TIMEOUT_S)


@pytest.mark.server
@pytest.mark.slow
def test_demo_end_to_end_on_tiny_models(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc")
    cfg = tmp_path / "tiny-demo.yaml"
    cfg.write_text(
        f"name: tiny-demo\ntrtllm_version: '1.1'\noutput_dir: {tmp_path / 'build'}\n"
        f"target: {{model: {tiny_target}, dtype: float32}}\n"
        f"draft: {{type: eagle, model: {eagle_head}}}\n"
        "tree: {choices: topk-2-2, max_concurrency: 1}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 2, max_input_len: 128, max_seq_len: 256}\n"
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello world!", "The quick brown fox")))
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/demo.py"), "--config", str(cfg), "--quick", "--prompts", str(prompts),
         "--prompt", "What is the capital of France?"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for step in ("1/5 target", "2/5 build", "3/5 Triton server", "4/5 one streamed chat answer", "5/5 load test",
                 "demo finished: server stopped"):
        assert f"=== {step}" in out
    summary = json.loads((tmp_path / "build/demo_results/summary.json").read_text())
    assert summary["head"] == str(eagle_head)
    level = summary["levels"]["c=1"]
    assert level["requests_ok"] == 2 and level["output_tokens_per_s"] > 0
    assert level["tau"] is not None and level["tau"] >= 1.0  # the server reported speculative stats
    assert summary["plots"] and all(Path(p).is_file() for p in summary["plots"])
    report = json.loads((tmp_path / "build/demo_results/loadtest/report.json").read_text())
    assert report["levels"][0]["errors"] == {}
    assert f"load c=1: tau {level['tau']:.2f} tokens per target forward" in out
    for d in ("checkpoint", "engine", "triton_repo"):
        assert (tmp_path / "build" / d / "manifest.json").is_file()
    served = summary["served_on_off"]["c=1"]  # EAGLE server vs the same build served without speculation
    assert served["eagle_tokens_per_s"] > 0 and served["off_tokens_per_s"] > 0
    assert f"    c=1: {served['eagle_tokens_per_s']:.1f} vs {served['off_tokens_per_s']:.1f} tokens/s = " in out
    off_report = json.loads((tmp_path / "build/demo_results/loadtest/baseline/report.json").read_text())
    assert off_report["levels"][0]["requests_ok"] == 2 and not off_report["levels"][0]["draft_tokens"]
    s = summary["speedup"]
    assert f"EAGLE speedup over target-only decoding: {s['ratio']:.2f}x at tau {s['tau']:.2f}" in out
    assert summary["verdict"] == demo.verdict(summary["served_on_off"], s, demo.undrafted(summary["levels"]))
    assert all(f"  {line}\n" in out for line in summary["verdict"])
    assert ("eagle-tune-tree --objective speed" in out) == (
        not summary["verdict"][0].startswith("verdict: speculation pays on this machine"))
    # load-aware speculation on the 1.1 line is the reference engine's own: labelled as ours
    assert ("    load-aware speculation: no speculation above 1 sequence (tree.max_concurrency: 1) -- ours: "
            "TensorRT-LLM 1.1 has no such field") in out
    assert s["kernels"] and all(f"    kernels: {line}\n" in out for line in s["kernels"])  # engines/linear.py
    assert "float32 kernels: MKL on W^T for one row" in s["kernels"][0]  # the demo runs in float32
    log = (tmp_path / "build/demo_results/tritonserver.log").read_text()
    assert f"[eagle] tensorrt_llm: kernels: {s['kernels'][0]}" in log  # the engine says it at load


def test_demo_serves_the_tree_tuned_for_the_device(tmp_path: Path) -> None:
    import yaml

    from builders.config import load_config

    tree, f = demo.device_tree("heads/smollm2-eagle", "cpu", "float32")
    assert f == REPO / "configs/trees/smollm2-eagle-fastest-cpu-fp32.yaml"
    assert tree == yaml.safe_load(f.read_text())["tree"] and list(tree) == ["choices"]
    argv = demo.build_argv(tmp_path / "c.yaml", tree)
    assert argv[argv.index("--set") + 1] == "tree.dynamic=null"
    assert argv[-1] == "tree.choices=" + json.dumps(tree["choices"])
    assert demo.build_argv(tmp_path / "c.yaml", tree["choices"]) == argv  # a list of paths is a static tree
    dyn = demo.build_argv(tmp_path / "c.yaml", {"dynamic": {"top_k": 2, "depth": 2, "total_draft_tokens": 4}})
    assert dyn[3:] == ["--set", "tree.choices=null", "--set",
                       'tree.dynamic={"top_k": 2, "depth": 2, "total_draft_tokens": 4}']
    assert demo.build_argv(tmp_path / "c.yaml")[2:] == [str(tmp_path / "c.yaml")]  # no tree: the config's
    assert demo.policy_line(None, "1.1") is None
    assert demo.policy_line("no speculation above 2 sequences (tree.max_concurrency: 2)", "1.4") == (
        "load-aware speculation: no speculation above 2 sequences (tree.max_concurrency: 2) (TensorRT-LLM 1.4's "
        "speculative_config)")
    assert "-- ours: TensorRT-LLM 1.2 has no such field" in demo.policy_line("x", "1.2")
    assert demo.draft_vocab_line(None) is None
    shipped = str(REPO / "heads" / "smollm2-eagle" / "draft-vocab-8192.json")  # what configs/demo.yaml names
    assert demo.draft_vocab_line(shipped) == (
        "draft vocabulary: the head drafts over 8,192 tokens (draft-vocab-8192.json) -- ours: TensorRT-LLM's EAGLE-1/2 "
        "heads draft over the full vocabulary; the target verifies over all of it, so outputs do not change")
    for key in (
        ("smollm2-eagle", "cuda", "float32"),
        ("smollm2-eagle", "cpu", "bfloat16"),
        ("other", "cpu", "float32"),
    ):
        assert demo.device_tree(*key) is None  # nothing tuned there: the config's tree is served
    cfg = load_config(REPO / "configs/demo.yaml", ["engine.device=cpu"])
    chosen, why = demo.choose_tree(cfg, use_device_tree=True)
    assert chosen == tree and why.startswith("tuned for speed on cpu in float32")
    assert demo.choose_tree(cfg, use_device_tree=False) == (None, "the config's tree (--tree config)")
    none, why = demo.choose_tree(load_config(REPO / "configs/demo.yaml", ["engine.device=cpu",
                                                                        "target.dtype=bfloat16"]), True)
    assert none is None and why == "the config's tree (no tree tuned for this head on cpu bfloat16)"


def test_the_demo_runs_the_current_line_and_the_engine_flow_is_one_flag_away() -> None:
    from builders.config import load_config

    assert demo.LINES["current"] == REPO / "configs/smollm2-eagle3-current.yaml"
    current = load_config(demo.LINES["current"])
    assert (current.trtllm_version, current.draft.type, current.engine.backend) == ("1.4", "eagle3", "reference")
    assert load_config(demo.LINES["1.1"]).trtllm_version == "1.1"
    help_text = subprocess.run([sys.executable, str(REPO / "scripts/demo.py"), "--help"], capture_output=True,
                               text=True, timeout=120, cwd=REPO).stdout
    assert "--line {current,1.1}" in help_text and "configs/smollm2-eagle3-current.yaml" in help_text
    make = (REPO / "Makefile").read_text()
    assert "scripts/demo.py $(DEMO_ARGS)" in make  # `make demo DEMO_ARGS="--line 1.1"`


SPEEDUP = {"ratio": 0.8, "eagle_tokens_per_s": 20.0, "target_only_tokens_per_s": 25.0, "tau": 1.6,
           "tree": "dynamic tree (top_k 2, depth 3, 6 draft tokens)"}


@pytest.mark.parametrize(("c1", "others", "ratio", "first"), [
    (1.3, {"c=2": 1.0, "c=4": 0.97}, 1.4, "verdict: speculation pays on this machine: served 1.30x"),
    (0.85, {"c=2": 0.95}, 0.8, "verdict: speculation does not pay on this machine: served 0.85x"),
    (1.38, {"c=2": 0.90, "c=4": 0.57}, 1.07, "verdict: speculation pays here at one sequence (served 1.38x"),
    (1.1, {}, 0.9, "verdict: speculation does not pay on this machine: served 1.10x"),
])
@pytest.mark.parametrize("policy", [None, "no speculation above 1 sequence (tree.max_concurrency: 1)"])
def test_the_verdict_says_whether_speculation_pays_here_and_why_not(
        c1: float, others: dict[str, float], ratio: float, first: str, policy: str | None) -> None:
    served = {"c=1": {"ratio": c1}, **{k: {"ratio": v} for k, v in others.items()}}
    lines = demo.verdict(served, {**SPEEDUP, "ratio": ratio, "policy": policy})
    assert lines[0].startswith(first)
    cost = demo.step_cost(SPEEDUP)
    assert cost == pytest.approx(1.6 * 25.0 / 20.0)  # tau x target tokens/s / EAGLE tokens/s
    text = "\n".join(lines)
    assert f"costs {cost:.2f}x a target-only step and yields tau 1.60 tokens" in text
    slower = [k for k, v in others.items() if v < 0.9]
    assert ("above one sequence the batch already fills this device" in text) == bool(slower)
    assert ("Set tree.max_concurrency: 1" in text) == (bool(slower) and policy is None)
    assert all(f"{k} {others[k]:.2f}x" in lines[0] for k in slower)
    assert ("eagle-tune-tree --objective speed" in text) == (not first.startswith("verdict: speculation pays on"))
    assert ("why (measured here)" in text) == first.startswith("verdict: speculation does not pay")


def test_the_verdict_does_not_blame_speculation_where_the_server_did_not_draft() -> None:
    """Above max_concurrency both servers do the same work: a ratio below 1 there is the spread between two
    identical servers, and the verdict says so instead of blaming the tree."""
    levels = {"c=1": {"tau": 1.31, "acceptance_rate": 0.16}, "c=2": {"tau": 1.0, "acceptance_rate": 0.0},
              "c=4": {"tau": 1.0, "acceptance_rate": 0.0}}
    assert demo.undrafted(levels) == {"c=2", "c=4"}
    served = {"c=1": {"ratio": 1.18}, "c=2": {"ratio": 0.85}, "c=4": {"ratio": 0.96}}
    lines = demo.verdict(served, {**SPEEDUP, "ratio": 1.08, "policy": "x"}, demo.undrafted(levels))
    text = "\n".join(lines)
    assert lines[0].startswith("verdict: speculation pays on this machine: served 1.18x"), text
    assert "at c=2 (0.85x), c=4 (0.96x) the EAGLE server did not draft" in text and "fills this device" not in text


@pytest.mark.server
@pytest.mark.slow
def test_demo_current_line_end_to_end_on_tiny_models(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc")
    from testkit import tiny_models as tm

    # 8 layers: the tiny EAGLE-3 head captures distinct layers ([2, 4, 5]), as the llmapi options need
    tiny_target = tm.make_target(tmp_path / "target", layers=8)
    eagle3_head = tm.make_eagle3_head(tmp_path / "head", tiny_target)
    cfg = tmp_path / "tiny-current.yaml"
    cfg.write_text(
        f"name: tiny-current\ntrtllm_version: '1.4'\noutput_dir: {tmp_path / 'build'}\n"
        f"target: {{model: {tiny_target}, dtype: float32}}\n"
        f"draft: {{type: eagle3, model: {eagle3_head}}}\n"
        "tree: {dynamic: {top_k: 2, depth: 2, total_draft_tokens: 4}}\n"
        "engine: {backend: reference, device: cpu, max_batch_size: 2, max_input_len: 128, max_seq_len: 256}\n"
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello world!", "The quick brown fox")))
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/demo.py"), "--config", str(cfg), "--quick", "--prompts", str(prompts),
         "--prompt", "What is the capital of France?", "--threads", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert f"config: {cfg} (TensorRT-LLM line 1.4, eagle3 head, engine.backend reference)" in out
    summary = json.loads((tmp_path / "build/demo_results/summary.json").read_text())
    assert (summary["line"], summary["layout"]) == ("1.4", "llmapi")
    assert (tmp_path / "build/triton_repo/tensorrt_llm/1/model.yaml").is_file()  # upstream's llmapi layout
    level = summary["levels"]["c=1"]
    assert level["requests_ok"] == 2 and level["tau"] is not None and level["tau"] >= 1.0
    served = summary["served_on_off"]["c=1"]
    assert served["eagle_tokens_per_s"] > 0 and served["off_tokens_per_s"] > 0
    off_report = json.loads((tmp_path / "build/demo_results/loadtest/baseline/report.json").read_text())
    assert off_report["levels"][0]["requests_ok"] == 2 and not off_report["levels"][0]["draft_tokens"]
    assert summary["verdict"] == demo.verdict(summary["served_on_off"], summary["speedup"],
                                              demo.undrafted(summary["levels"]))
    assert all(f"  {line}\n" in out for line in summary["verdict"])  # printed as measured, whichever it says
    assert "speculative: accepted" in proc.stderr + out and "output tokens: not counted" not in proc.stderr + out
