"""Config values that could never be served are refused at load (builders/config.py, builders/capacity.py,
core/config_input.py): strict integers (`true` is not 1), ceilings from what the target and the backend can hold
(KV bytes against engine.memory_budget_gib), trees bounded before they are built, YAML alias expansion and file size
bounded, and the error output bounded whatever the input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from builders import build
from builders.capacity import kv_bytes_per_token, weight_bytes
from builders.config import ConfigError, load_config
from core.hfconfig import llama_spec, read_config
from core.shapes import shape_of_config
from tests.test_config_cli import write_cfg

INT_FIELDS = ["engine.max_batch_size", "engine.max_seq_len", "engine.max_input_len", "engine.max_num_tokens",
              "engine.workers", "parallel.tp", "parallel.pp", "draft.seed", "triton.max_queue_size",
              "triton.llm_instances", "triton.max_queue_delay_microseconds", "quantization.calibration.num_samples"]
NOT_INTS = ["true", "false", "8.0", "'8'", "1e3", "[8]", "{a: 1}"]


def _problems(cfg: Path, *sets: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(cfg, list(sets))
    return e.value.problems


@pytest.mark.parametrize("field", INT_FIELDS)
def test_integers_are_strict(field: str, tiny_target: Path, tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    for value in NOT_INTS:
        problems = _problems(cfg, f"{field}={value}")
        assert any(p.startswith(f"{field}: Input should be a valid integer") for p in problems), (value, problems)


@pytest.mark.parametrize("sets", [["triton.kv_cache_free_gpu_mem_fraction=true"], ["engine.memory_budget_gib=.inf"],
                                  ["engine.memory_budget_gib=.nan"], ["triton.request_deadline_s=.inf"],
                                  ["triton.deadline_per_token_s=false"]])
def test_floats_are_finite_numbers(sets: list[str], tiny_target: Path, tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    field = sets[0].split("=")[0]
    assert any(p.startswith(f"{field}: Input should be a") for p in _problems(cfg, *sets))


def _tensor_bytes(model: Path) -> int:
    return sum(t.numel() * t.element_size() for t in load_file(str(model / "model.safetensors")).values())


def test_weight_bytes_match_the_real_tensors(tiny_target: Path, tiny_target_tied: Path) -> None:
    for model in (tiny_target, tiny_target_tied):
        assert weight_bytes(shape_of_config(read_config(model), str(model)), 4) == _tensor_bytes(model)


@pytest.mark.parametrize("backend", ["reference", "pytorch"])
@pytest.mark.parametrize("sets", [["engine.max_batch_size=1000000000"], ["engine.max_seq_len=1000000000"],
                                  ["engine.max_batch_size=100000", "engine.max_seq_len=100000"],
                                  ["engine.max_num_tokens=2000000000"]])
def test_limits_beyond_the_memory_budget_are_refused(backend: str, sets: list[str], tiny_target: Path,
                                                     tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out", engine__backend=backend,
                    engine__memory_budget_gib=0.25)
    problems = _problems(cfg, *sets)
    hits = [p for p in problems if "engine.memory_budget_gib=0.25:" in p]
    assert hits and "per rank" in hits[0] and "lower engine.max_batch_size" in hits[0], problems


def test_kv_bytes_are_stated_exactly(tiny_target: Path, tmp_path: Path) -> None:
    spec = llama_spec(tiny_target)
    per_token = kv_bytes_per_token(shape_of_config(read_config(tiny_target), str(tiny_target)), 4, "reference")
    assert per_token == 2 * spec.num_hidden_layers * spec.num_key_value_heads * spec.head_dim * 4  # K and V, float32
    # max_batch_size 64 x max_seq_len 512 on the reference engine: exactly this many KV bytes, against 1 MiB.
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out",
                    engine__max_batch_size=64, engine__max_seq_len=512, engine__memory_budget_gib=1 / 1024)
    [p] = [p for p in _problems(cfg) if "memory_budget_gib" in p]
    assert f"{per_token:,} bytes/token" in p and "max_batch_size x max_seq_len = 64 x 512 tokens" in p
    assert f"{64 * 512 * per_token / 2**30:,.2f} GiB" in p
    assert load_config(cfg, ["engine.memory_budget_gib=1"]).engine.memory_budget_gib == 1.0


@pytest.mark.parametrize("sets", [["engine.max_batch_size=2147483648"], ["engine.max_seq_len=1000000000000"],
                                  ["parallel.tp=65"], ["triton.llm_instances=1000"], ["tree.choices=chain-1000"]])
def test_hard_ceilings(sets: list[str], tiny_target: Path, tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    field = sets[0].split("=")[0]
    problems = _problems(cfg, *sets)
    assert any(p.startswith(field) and ("less than or equal" in p or "1..256" in p) for p in problems), problems


@pytest.mark.parametrize("choices", [
    [[0] * i for i in range(1, 258)],  # a 257-node chain
    [[i] for i in range(300)],  # 300 siblings
    [[0] * 300],  # one path 300 deep (no parents either)
])
def test_trees_are_bounded_before_they_are_built(choices: list[list[int]], tiny_target: Path, tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    problems = _problems(cfg, f"tree.choices={json.dumps(choices)}")
    assert any(p.startswith("tree.choices") and "at most 256" in p for p in problems), problems


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text", [
    BOMB + "name: tiny\n",  # 10^9 leaves from ~600 bytes
    "name: &n [*n]\n",  # a self-referencing alias
    "name: tiny\ntree: {choices: " + json.dumps([[0] * i for i in range(1, 1001)]) + "}\n",  # 4 MB
])
def test_yaml_size_and_alias_expansion_are_bounded(text: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert build.main([str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "expands to more than 100,000 values" in err or "a build config is at most 262,144" in err
    assert len(err) < 2000


def test_alias_bomb_through_set_is_bounded(tiny_target: Path, tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    flow = "&a [x, x, x, x, x, x, x, x, x, x]"
    problems = _problems(cfg, f"name=[{flow}, *a, *a, *a, *a, *a, *a, *a, *a, *a]",
                         "draft.x=" + "[" + ", ".join(["[" + ", ".join(["1"] * 400) + "]"] * 400) + "]")
    assert problems == [problems[0]] and "expands to more than 100,000 values" in problems[0]


def test_error_output_is_bounded(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    text = cfg.read_text() + "".join(f"junk{i}: {'y' * 200}\n" for i in range(300)) + f"huge: {'z' * 100_000}\n"
    cfg.write_text(text)
    assert build.main([str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "301 problem(s)" in err and "... and 251 more problem(s)" in err
    assert "more characters)" in err and len(err) < 50 * 1700


@pytest.mark.parametrize(("text", "says"), [
    ("[" * 100_000, "YAML nested too deeply to read"),
    ("name: tiny\ntree: {choices: " + "[" * 100_000 + "}\n", "YAML nested too deeply to read"),
    ("{a: " * 30_000 + "1" + "}" * 30_000 + "\n", "YAML nested too deeply to read"),
    ("- " * 100_000 + "x\n", "YAML nested too deeply to read"),
])
def test_yaml_nested_too_deeply_is_a_config_error(text: str, says: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert build.main([str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cfg}: 1 problem(s)") and says in err, err[:500]


def test_set_value_nested_too_deeply_is_a_config_error(tiny_target: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    assert build.main([str(cfg), "--dry-run", "--set", "tree.choices=" + "[" * 100_000]) == 2
    err = capsys.readouterr().err
    assert "--set 'tree.choices=[[[[" in err and "YAML nested too deeply to read" in err and len(err) < 2000, err[:500]


def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, says in ((fifo, "is a FIFO (named pipe); give a regular file"), (tmp_path, "is a directory"),
                       (tmp_path / "none.yaml", "no such file")):
        assert build.main([str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert f"config file {path}: {says}" in err, err
