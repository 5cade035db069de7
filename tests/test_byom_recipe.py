"""Bring your own model on a CPU (docs/bring-your-own-model.md, "Try your architecture on a CPU"): the recipe's
commands, as the page shows them, run end to end for a non-Llama architecture (tiny model, head trained with the
default capture layers, current-line build, real Triton server, one streamed answer); scripts/tiny_model.py keeps
each family's architecture and shrinks its sizes."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.tiny_model import shrink

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "bring-your-own-model.md"


def recipe() -> list[list[str]]:
    """The fenced commands of the page's "Try your architecture on a CPU" section, as argv (comments dropped)."""
    text = PAGE.read_text()
    section = text[text.index("## Try your architecture on a CPU"):]
    block = re.search(r"^```bash\n(.*?)^```", section, flags=re.S | re.M)
    assert block is not None
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


def test_the_page_shows_the_five_steps() -> None:
    steps = [argv[1] for argv in recipe()]
    assert steps == ["scripts/tiny_model.py", "training/train_head.py", "builders/build.py", "triton_repo/launch.py",
                     "clients/generate.py"]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "mistral", "gpt_oss"])
def test_tiny_model_keeps_the_architecture_and_shrinks_the_sizes(family: str, tmp_path: Path) -> None:
    from testkit.tiny_families import family_config, make_family_target

    like = make_family_target(tmp_path / "like", family)
    r = subprocess.run([sys.executable, str(REPO / "scripts/tiny_model.py"), "--like", str(like), "--out",
                        str(tmp_path / "out"), "--layers", "4", "--hidden", "32"], capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    src, out = json.loads((like / "config.json").read_text()), json.loads((tmp_path / "out/config.json").read_text())
    assert out["architectures"] == src["architectures"] and out["vocab_size"] == src["vocab_size"]
    assert (out["num_hidden_layers"], out["hidden_size"], out["num_attention_heads"]) == (4, 32, 4)
    assert all(len(out[k]) == 4 for k in ("layer_types",) if k in src)
    assert (tmp_path / "out/model.safetensors").is_file() and (tmp_path / "out/tokenizer.json").is_file()
    assert r.stdout.startswith(f"{tmp_path / 'out'}: ") and "4 layers, hidden 32" in r.stdout
    assert family_config(family)["num_hidden_layers"] >= 1  # the testkit config is the "your model" stand-in


def test_shrink_is_pure_and_keeps_the_kv_ratio() -> None:
    cfg = {"architectures": ["X"], "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 36, "layer_types": ["full"] * 36, "quantization_config": {"quant_method": "fp8"}}
    small = shrink(cfg, layers=6, hidden=64)
    assert cfg["hidden_size"] == 4096 and "quantization_config" in cfg  # the input is untouched
    assert (small["num_attention_heads"], small["num_key_value_heads"]) == (4, 1) and "head_dim" not in small
    assert small["layer_types"] == ["full"] * 6 and "quantization_config" not in small


@pytest.mark.slow
@pytest.mark.server
def test_the_recipe_runs_end_to_end_for_a_qwen3_model(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc")
    from testkit.tiny_families import make_family_target
    from triton_repo.launch import free_port

    like = make_family_target(tmp_path / "your-model", "qwen3")  # "your model": config.json and tokenizer
    byom = tmp_path / "byom"
    where = {"/path/to/your-model": str(like), "build/byom": str(byom)}
    extra = {  # the configs name build/byom relative to the checkout: pointed at tmp_path the way a user would
        "training/train_head.py": ["--set", f"target={byom / 'target'}", "--set", f"work_dir={byom / 'train'}",
                                   "--set", f"output_dir={byom / 'head'}",
                                   # the test tokenizer: 320 tokens, about 110 of them in the answers
                                   "--set", "eagle3.draft_vocab_size=64"],
        "builders/build.py": ["--set", f"output_dir={byom / 'build'}", "--set", f"target.model={byom / 'target'}",
                              "--set", f"draft.model={byom / 'head'}"],
    }
    ports = {"grpc": free_port(), "http": free_port(), "metrics": free_port()}
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    server = None
    try:
        for argv in recipe():
            argv = [sys.executable if a == "python" else a for a in argv]
            for k, v in where.items():
                argv = [a.replace(k, v) for a in argv]
            script = Path(argv[1]).relative_to(REPO) if argv[1].startswith("/") else Path(argv[1])
            argv[1] = str(REPO / script)
            argv += extra.get(str(script), [])
            if script.name == "launch.py":
                argv = [a for a in argv if a != "&"] + ["--grpc-port", str(ports["grpc"]), "--http-port",
                                                        str(ports["http"]), "--metrics-port", str(ports["metrics"])]
                server = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True)
                _wait_ready(server)
                continue
            if script.name == "generate.py":
                argv = [a.replace("localhost:8001", f"127.0.0.1:{ports['grpc']}") for a in argv]
            r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
            assert r.returncode == 0, f"{' '.join(argv)}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
            if script.name == "train_head.py":
                assert "eagle3.layer_ids: [2, 4, 5] for this 8-layer target (TensorRT-LLM's default" in r.stdout
            if script.name == "generate.py":
                assert "speculative: accepted" in r.stderr and "output tokens: not counted" not in r.stderr
        head_cfg = json.loads((byom / "head/config.json").read_text())
        assert head_cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
        target_cfg = json.loads((byom / "target/config.json").read_text())
        assert target_cfg["architectures"] == ["Qwen3ForCausalLM"] and target_cfg["num_hidden_layers"] == 8
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)


def _wait_ready(server: subprocess.Popen[str], timeout_s: float = 600) -> None:
    assert server.stdout is not None
    end = time.monotonic() + timeout_s
    lines = []
    while time.monotonic() < end:
        line = server.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("tritonserver ready"):
            return
    raise AssertionError("eagle-launch did not report ready:\n" + "".join(lines[-40:]))
