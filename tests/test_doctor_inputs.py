"""`python -m doctor` and `doctor export` check their inputs before any work: non-regular files
(directories, FIFOs), oversized files and lines, config counts of the wrong type or out of range, bad limits and
output paths each exit 2 with a message naming the input, fast and without a traceback
(doctor/config_check.py, core/files.py, doctor/export.py `out_problems`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doctor.__main__ import main
from tests.doctor_models import copy_head

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent


def _doctor(*args: str) -> tuple[int, str]:
    """The doctor as users run it (a subprocess: a FIFO must not hang it, a traceback would show on stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "doctor", *args], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stderr


def _head_with(tmp: Path, src: Path, name: str, **cfg: object) -> Path:
    return copy_head(src, tmp / name, cfg=dict(cfg))


@pytest.mark.parametrize(("cfg", "says"), [
    ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers is 1000000000; give an integer in [1, 1024]"),
    ({"num_hidden_layers": True}, "num_hidden_layers is true (bool); give an integer"),
    ({"hidden_size": "576"}, 'hidden_size is "576" (str); give an integer'),
    ({"num_attention_heads": 9.5}, "num_attention_heads is 9.5 (float); give an integer"),
    ({"vocab_size": -3}, "vocab_size is -3; give an integer in [1, 16777216]"),
    ({"intermediate_size": 0}, "intermediate_size is 0"),
    ({"max_position_embeddings": 10**12}, "max_position_embeddings is 1000000000000"),
    ({"draft_vocab_size": None, "target_hidden_size": [1]}, "target_hidden_size is [1] (list)"),
    ({"rms_norm_eps": "1e-5"}, 'rms_norm_eps is "1e-5"; give a positive number'),
    ({"rope_theta": -1}, "rope_theta is -1; give a positive number"),
    ({"eagle_aux_hidden_state_layer_ids": [1, "2", True]}, 'eagle_aux_hidden_state_layer_ids holds ["2", true]'),
    ({"eagle_aux_hidden_state_layer_ids": list(range(100))}, "must be a list of 1 to 64 layer indices"),
    ({"eagle_config": {"num_hidden_layers": 10**9}}, "eagle_config.num_hidden_layers is 1000000000"),
])
def test_head_config_counts_are_typed_and_bounded_before_any_work(cfg: dict, says: str, tmp_path: Path,
                                                                   tiny_target: Path, eagle3_head: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    head = _head_with(tmp_path, eagle3_head, "bad", **cfg)
    t0 = time.perf_counter()
    assert main(["--target", str(tiny_target), "--head", str(head), "--no-measure"]) == 2
    assert time.perf_counter() - t0 < 60  # no list of a billion layer names (not a timing claim: a hang guard)
    err = capsys.readouterr().err
    assert err.startswith(f"error: --head {head / 'config.json'}: ") and says in err, err


def test_target_config_counts_are_checked_too(tmp_path: Path, tiny_target: Path, eagle3_head: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    target.mkdir()
    for f in tiny_target.iterdir():
        if f.is_file():
            (target / f.name).symlink_to(f)
    (target / "config.json").unlink()
    cfg = json.loads((tiny_target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=10**9, num_key_value_heads="2")))
    assert main(["--target", str(target), "--head", str(eagle3_head), "--no-measure"]) == 2
    err = capsys.readouterr().err
    assert "--target" in err and "num_hidden_layers is 1000000000" in err and 'num_key_value_heads is "2"' in err


def test_a_directory_or_fifo_as_config_exits_2_without_hanging(tmp_path: Path, tiny_target: Path,
                                                                eagle3_head: Path) -> None:
    d = copy_head(eagle3_head, tmp_path / "dir_cfg")
    (d / "config.json").unlink()
    (d / "config.json").mkdir()
    code, err = _doctor("--target", str(tiny_target), "--head", str(d), "--no-measure")
    assert code == 2 and f"--head {d / 'config.json'}: is a directory; give a regular file" in err
    f = copy_head(eagle3_head, tmp_path / "fifo_cfg")
    (f / "config.json").unlink()
    os.mkfifo(f / "config.json")
    code, err = _doctor("--target", str(tiny_target), "--head", str(f), "--no-measure")
    assert code == 2 and "is a FIFO (named pipe); give a regular file" in err
    big = copy_head(eagle3_head, tmp_path / "big_cfg")
    with open(big / "config.json", "a") as fh:
        fh.write(" " * (17 << 20))
    code, err = _doctor("--target", str(tiny_target), "--head", str(big), "--no-measure")
    assert code == 2 and "bytes > the limit of 16777216 (16 MiB)" in err
    for text, says in (("[1, 2]", "the top level must be a JSON object"), ("{not json", "not valid JSON")):
        (big / "config.json").write_text(text)
        code, err = _doctor("--target", str(tiny_target), "--head", str(big), "--no-measure")
        assert code == 2 and says in err, err


def _prompts(tmp: Path, name: str, data: bytes | None) -> Path:
    p = tmp / name
    if data is None:
        os.mkfifo(p)
    else:
        p.write_bytes(data)
    return p


@pytest.mark.parametrize(("name", "data", "says"), [
    ("empty.jsonl", b"", "no prompts"),
    ("blank.jsonl", b"\n\n  \n", "no prompts"),
    ("text.jsonl", b"hello there\n", "line 1: not valid JSON"),
    ("list.jsonl", b"[1, 2]\n", "line 1 has neither a non-empty string `prompt`"),
    ("number.jsonl", b'{"prompt": 7}\n', "line 1 has neither a non-empty string `prompt`"),
    ("latin1.jsonl", b'{"prompt": "caf\xe9"}\n', "line 1 is not UTF-8"),
    ("long_line.jsonl", b'{"prompt": "' + b"a" * (2 << 20) + b'"}\n', "line 1 has more than 1048576 bytes"),
    ("many.jsonl", b'{"prompt": "hi"}\n' * 10_001, "more than 10000 prompts"),
    ("fifo.jsonl", None, "is a FIFO (named pipe); give a regular file"),
])
def test_bad_prompts_files_exit_2_before_loading_models(name: str, data: bytes | None, says: str, tmp_path: Path,
                                                        tiny_target: Path, eagle3_head: Path) -> None:
    """Measured mode (the tokenizer would see every prompt): each refused from the file alone."""
    p = _prompts(tmp_path, name, data)
    code, err = _doctor("--target", str(tiny_target), "--head", str(eagle3_head), "--prompts", str(p))
    assert code == 2 and says in err, err


def test_a_huge_prompts_file_is_refused_by_its_size_before_it_is_read(tmp_path: Path, tiny_target: Path,
                                                                       eagle3_head: Path) -> None:
    p = tmp_path / "huge.jsonl"
    with open(p, "wb") as f:  # sparse: 1 GB long, nothing written
        f.truncate(1 << 30)
    code, err = _doctor("--target", str(tiny_target), "--head", str(eagle3_head), "--prompts", str(p))
    assert code == 2 and "1073741824 bytes > the limit of 67108864 (64 MiB)" in err
    (tmp_path / "dir.jsonl").mkdir()
    code, err = _doctor("--target", str(tiny_target), "--head", str(eagle3_head), "--prompts",
                        str(tmp_path / "dir.jsonl"))
    assert code == 2 and "is a directory; give a regular file" in err


@pytest.mark.parametrize(("args", "says"), [
    (["--max-seq-len", "-5"], "--max-seq-len -5: give an integer in [1, 16777216]"),
    (["--max-seq-len", "0"], "--max-seq-len 0: give an integer in [1,"),
    (["--max-seq-len", str(1 << 40)], f"--max-seq-len {1 << 40}: give"),
    (["--max-new-tokens", "1"], "--max-new-tokens 1: give an integer in [2, 4096]"),
    (["--max-new-tokens", "100000000"], "--max-new-tokens 100000000: give"),
])
def test_limits_out_of_range_exit_2(args: list[str], says: str, tiny_target: Path, eagle3_head: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", str(tiny_target), "--head", str(eagle3_head), "--no-measure", *args]) == 2
    assert says in capsys.readouterr().err


def test_json_output_that_is_a_directory_or_in_no_directory_exits_2(tmp_path: Path, tiny_target: Path,
                                                                    eagle3_head: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out").mkdir()
    for path, says in ((tmp_path / "out", "is a directory; give a file path"),
                       (tmp_path / "no" / "such" / "r.json", "does not exist")):
        assert main(["--target", str(tiny_target), "--head", str(eagle3_head), "--no-measure", "--json",
                     str(path)]) == 2
        assert says in capsys.readouterr().err


def _export(*args: str) -> tuple[int, str]:
    return _doctor("export", *args)


def test_export_refuses_symlinks_its_own_input_and_a_file_as_out(tmp_path: Path, eagle3_head: Path) -> None:
    head = copy_head(eagle3_head, tmp_path / "head")
    before = (head / "config.json").read_bytes()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("keep me")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").symlink_to(elsewhere)
    (tmp_path / "link_out").symlink_to(tmp_path / "real_out", target_is_directory=True)
    (tmp_path / "a_file").write_text("x")
    cases = {
        str(head): "is, is inside or contains the input",
        str(head / "sub"): "is, is inside or contains the input",
        str(tmp_path): "is, is inside or contains the input",
        str(linked): "holds symbolic link(s) config.json",
        str(tmp_path / "link_out"): "is a symbolic link",
        str(tmp_path / "a_file"): "exists and is not a directory",
    }
    for out, says in cases.items():
        code, err = _export("--head", str(head), "--to", "specforge", out)
        assert code == 2 and says in err, (out, err)
    assert (head / "config.json").read_bytes() == before
    assert elsewhere.read_text() == "keep me" and not (tmp_path / "real_out").exists()
    code, err = _export("--head", str(head), "--to", "specforge", str(tmp_path / "fine"))
    assert code == 0, err
    assert json.loads((tmp_path / "fine" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "README.md"])
def test_export_refuses_a_file_in_out_with_another_hard_link(name: str, tmp_path: Path, eagle3_head: Path) -> None:
    """The build's rule (builders/build_dir.py `single_file`): a file with a second name is never written through;
    any file of OUT counts, not only the two export writes today."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    os.link(elsewhere, out / name)
    code, err = _export("--head", str(eagle3_head), "--to", "specforge", str(out))
    assert code == 2 and f"holds file(s) {name} with another hard link: export would write through them" in err, err
    assert elsewhere.read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == [name]
    (out / name).unlink()
    (out / name).write_text("a plain file of its own")  # one name only: export may replace it
    code, err = _export("--head", str(eagle3_head), "--to", "specforge", str(out))
    assert code == 0, err


NESTED_JSON = ["[" * 100_000, '{"hidden_size": ' + "[" * 100_000, '{"e": ' * 100_000 + "{}" + "}" * 100_000]


@pytest.mark.parametrize("text", NESTED_JSON)
def test_deeply_nested_json_in_any_doctor_input_exits_2(text: str, tmp_path: Path, tiny_target: Path,
                                                        eagle3_head: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The head's config, the target's config and a prompts line: JSON too deep for the parser (RecursionError)
    is an input error like invalid JSON, wherever it sits."""
    head = copy_head(eagle3_head, tmp_path / "head")
    (head / "config.json").write_text(text)
    assert main(["--target", str(tiny_target), "--head", str(head), "--no-measure"]) == 2
    assert f"error: --head {head / 'config.json'}: JSON nested too deeply to read" in capsys.readouterr().err
    target = tmp_path / "target"
    target.mkdir()
    for f in tiny_target.iterdir():
        if f.is_file() and f.name != "config.json":
            (target / f.name).symlink_to(f)
    (target / "config.json").write_text(text)
    assert main(["--target", str(target), "--head", str(eagle3_head), "--no-measure"]) == 2
    assert f"error: --target {target / 'config.json'}: JSON nested too deeply to read" in capsys.readouterr().err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n' + text + "\n")
    assert main(["--target", str(tiny_target), "--head", str(eagle3_head), "--prompts", str(prompts)]) == 2
    assert f"error: --prompts {prompts}: line 2: JSON nested too deeply to read" in capsys.readouterr().err


def test_nested_values_where_the_doctor_wants_a_scalar_exit_2(tmp_path: Path, tiny_target: Path, eagle3_head: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    head = copy_head(eagle3_head, tmp_path / "head", cfg={"hidden_size": [[[[64]]]]})
    assert main(["--target", str(tiny_target), "--head", str(head), "--no-measure"]) == 2
    assert "hidden_size is [[[[64]]]] (list)" in capsys.readouterr().err
    prompts = tmp_path / "p.jsonl"
    for line in ('{"turns": [[["hi"]]]}', '{"prompt": {"prompt": "hi"}}', '[[{"prompt": "hi"}]]'):
        prompts.write_text(line + "\n")
        assert main(["--target", str(tiny_target), "--head", str(eagle3_head), "--prompts", str(prompts)]) == 2
        assert "line 1 has neither a non-empty string `prompt`" in capsys.readouterr().err


GOOD = '{"prompt_ids": [1, 5, 40], "output_ids": [7, 8], "sampling": {"temperature": 0.0}}\n'


@pytest.mark.parametrize(("text", "says"), [
    ("[1, 2]\n", "line 1 is a JSON list, not an object with prompt_ids and output_ids"),
    (GOOD + '"text"\n', "line 2 is a JSON str, not an object"),
    (GOOD + "[" * 100_000 + "\n", "line 2: JSON nested too deeply to read"),
    ('{"prompt_ids": [[1, 2]], "output_ids": []}\n', "line 1 `prompt_ids` holds [1, 2]; give integers in"),
    ('{"prompt_ids": [1, true], "output_ids": []}\n', "line 1 `prompt_ids` holds true"),
    ('{"prompt_ids": [1, -4], "output_ids": [{"a": 1}]}\n', "`prompt_ids` holds -4; give integers in [0, 2147483647]; "
     "`output_ids` holds {\"a\": 1}"),
    ('{"prompt_ids": [], "output_ids": []}\n', "`prompt_ids` must be a non-empty list of token ids"),
    ('{"prompt_ids": {"0": 1}, "output_ids": "12"}\n', "`output_ids` must be a list of token ids"),
    ('{"prompt_ids": [1], "output_ids": [], "sampling": {"temperature": [0]}}\n', "`temperature` is a number"),
    ('{"prompt_ids": [1], "output_ids": [], "sampling": [0.0]}\n', "`sampling` must be an object"),
    ("{not json\n", "line 1: not valid JSON"),
    ("\n \n", "no requests"),
])
def test_gate_refuses_each_bad_requests_line_by_number(text: str, says: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Read before the build is opened (the build given here does not exist: the requests are refused first)."""
    req = tmp_path / "held.jsonl"
    req.write_text(text)
    assert main(["gate", "--build", str(tmp_path / "b"), "--candidate", str(tmp_path), "--requests", str(req)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --requests {req}") and says in err, err


def test_gate_refuses_a_fifo_as_requests_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    code, err = _doctor("gate", "--candidate", str(tmp_path), "--requests", str(tmp_path / "fifo"), "--build",
                        str(tmp_path))
    assert code == 2 and f"--requests {tmp_path / 'fifo'}: is a FIFO (named pipe); give a regular file" in err, err


def test_gate_refuses_missing_and_unusable_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory as --requests, a directory or FIFO as --json, a missing or unfinished --build: each exit 2 with a
    message, before any model is loaded."""
    req = tmp_path / "held.jsonl"
    req.write_text(GOOD)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "not_a_build").mkdir()
    base = ["gate", "--candidate", str(tmp_path), "--requests", str(req)]
    cases = [
        (["gate", "--candidate", str(tmp_path), "--requests", str(tmp_path), "--build", str(tmp_path)],
         f"--requests {tmp_path}: is a directory; give a regular file"),
        ([*base, "--build", str(tmp_path / "gone")], f"--build {tmp_path / 'gone'}: no such directory"),
        ([*base, "--build", str(tmp_path / "not_a_build")], "is not a finished build with engine.backend=reference"),
        ([*base, "--build", str(tmp_path), "--json", str(tmp_path)], f"--json {tmp_path}: is a directory"),
        ([*base, "--build", str(tmp_path), "--json", str(tmp_path / "fifo")], "is a FIFO (named pipe); give a file"),
        ([*base, "--build", str(tmp_path), "--json", str(tmp_path / "no" / "g.json")], "does not exist"),
    ]
    for args, says in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err, (args, err)
    with pytest.raises(SystemExit) as e:
        main(["gate", "--candidate", str(tmp_path), "--requests", str(req)])
    assert e.value.code == 2 and "the following arguments are required: --build" in capsys.readouterr().err
