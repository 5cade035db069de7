"""`python -m doctor export`: each layout is read back by the doctor, loads in the real `speculators`
package (its own venv, .venv-speculators, created by scripts/setup_env_speculators.sh, which `make setup` runs), and
round-trips to identical tensors. For the EAGLE authors' loader (not installable here) the test asserts the fields it
reads: SafeAILab/EAGLE@cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b eagle/model/ea_model.py `EaModel.__init__` /
`from_pretrained` (model.safetensors, `bias`, load_state_dict(strict=False)), eagle/model/cnets.py `Model.__init__`
(`target_hidden_size` -> embedding from the head file, `draft_vocab_size`, `midlayer.*`, d2t/t2d buffers) and
`LlamaAttention._init_rope` (top-level `rope_theta`, `rope_scaling["type"]`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from doctor.__main__ import main
from core.records import resolve_recorded
from testkit import tiny_models as tm

pytestmark = pytest.mark.usefixtures("one_thread")
SPECULATORS_VENV = Path(__file__).resolve().parents[1] / ".venv-speculators"
SPECULATORS_PY = Path(os.environ.get("SPECULATORS_VENV", SPECULATORS_VENV)) / "bin" / "python"
LOAD = """
import json, sys, torch
from safetensors.torch import load_file
from speculators.models import Eagle3DraftModel
d = sys.argv[1]
m = Eagle3DraftModel.from_pretrained(d)
sd = m.state_dict()
f = load_file(d + "/model.safetensors")
print(json.dumps({"missing": sorted(k for k in f if k not in sd),
                  "unequal": sorted(k for k in f if k in sd and not torch.equal(sd[k].to(f[k].dtype), f[k])),
                  "ids": m.config.eagle_aux_hidden_state_layer_ids, "draft_vocab": m.config.draft_vocab_size,
                  "cls": type(m).__name__}))
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 30-layer tiny target (the SafeAILab default layers [2, 15, 27] exist) and an EAGLE-3 head for it."""
    d = tmp_path_factory.mktemp("export")
    target = tm.make_target(d / "target", layers=30)
    return target, tm.make_eagle3_head(d / "head", target)


def export(head: Path, to: str, out: Path, target: Path | None, *extra: str) -> int:
    return main(["export", "--head", str(head), "--to", to, str(out), *extra]
                + (["--target", str(target)] if target else []))


def doctor(target: Path, head: Path, engine: str, tmp: Path) -> dict:
    out = tmp / f"{engine}-{head.name}.json"
    code = main(["--target", str(target), "--head", str(head), "--engine", engine, "--no-measure", "--json", str(out)])
    rep = json.loads(out.read_text())
    assert code == 0, [f for f in rep["findings"] if f["severity"] != "info"]
    return rep


def by_midlayer(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.replace("layers.0.", "midlayer."): v for k, v in t.items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not bad, bad


@pytest.mark.parametrize("to,engine", [("eagle-repo", "eagle-repo"), ("specforge", "sglang"),
                                       ("speculators", "vllm"), ("trtllm", "trtllm-1.4")])
def test_export_loads_where_meant(to: str, engine: str, tmp_path: Path, pair: tuple[Path, Path]) -> None:
    target, head = pair
    assert export(head, to, tmp_path / to, target) == 0
    rep = doctor(target, tmp_path / to, engine, tmp_path)
    assert rep["compatibility"][engine] == "loads as it is"
    original = load_file(str(head / "model.safetensors"))
    written = by_midlayer(load_file(str(tmp_path / to / "model.safetensors")))
    assert set(written) - set(original) <= ({"embed_tokens.weight"} if to == "eagle-repo" else set())
    for k, v in original.items():  # the converter (trtllm) writes one float dtype; the others keep each tensor's
        assert torch.equal(written[k].to(v.dtype), v) and (to == "trtllm" or written[k].dtype == v.dtype), k


def test_eagle_repo_fields(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """The fields the EAGLE authors' EAGLE-3 loader reads (module docstring for the source)."""
    target, head = pair
    assert export(head, "eagle-repo", tmp_path / "out", target) == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    t = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert cfg["rope_theta"] == 10000.0 and "rope_parameters" not in cfg
    assert cfg["draft_vocab_size"] == t["lm_head.weight"].shape[0] == t["d2t"].shape[0]
    assert t["t2d"].shape == (cfg["vocab_size"],) and t["t2d"].dtype == torch.bool
    assert "fc.bias" not in t and all(not k.startswith("layers.") for k in t)
    assert {"midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight", "fc.weight"} <= set(t)
    # target_hidden_size is set, so the embedding must be in the head file: it is the target's
    assert "target_hidden_size" in cfg
    emb = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(t["embed_tokens.weight"], emb.to(t["embed_tokens.weight"].dtype))
    # without --target there is no embedding to ship: refused with what to give
    assert export(head, "eagle-repo", tmp_path / "no_target", None) == 2


def test_speculators_round_trip(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """ours -> speculators -> flat -> speculators: identical tensors at every step."""
    target, head = pair
    assert export(head, "speculators", tmp_path / "s1", target) == 0
    assert export(tmp_path / "s1", "specforge", tmp_path / "flat", None) == 0
    assert export(tmp_path / "flat", "speculators", tmp_path / "s2", target) == 0
    original = load_file(str(head / "model.safetensors"))
    same(by_midlayer(load_file(str(tmp_path / "s1" / "model.safetensors"))), original)
    same(load_file(str(tmp_path / "flat" / "model.safetensors")), original)
    same(load_file(str(tmp_path / "s2" / "model.safetensors")), load_file(str(tmp_path / "s1" / "model.safetensors")))
    flat = json.loads((tmp_path / "flat" / "config.json").read_text())
    assert flat["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and flat["draft_vocab_size"] == 96


# CI always runs it: `make setup` creates the venv there.
@pytest.mark.skipif(not SPECULATORS_PY.is_file() and not os.environ.get("CI"),
                    reason=f"no speculators venv at {SPECULATORS_PY.parent.parent} (scripts/setup_env_speculators.sh)")
def test_speculators_package_loads_export(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    target, head = pair
    # speculators' Eagle3DraftModel.from_pretrained reads the verifier's config by name: offline, its local path
    assert export(head, "speculators", tmp_path / "s", target, "--verifier-name", str(target)) == 0
    proc = subprocess.run([str(SPECULATORS_PY), "-c", LOAD, str(tmp_path / "s")], check=False, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"missing": [], "unequal": [], "ids": [2, 15, 27], "draft_vocab": 96, "cls": "Eagle3DraftModel"}


@pytest.mark.parametrize(("name", "written"), [("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"), ("/data/models/qwen3", None),
                                                (None, None)])
def test_speculators_verifier_is_the_target(tmp_path: Path, name: str | None, written: str | None) -> None:
    """verifier.architectures is the target's own (a Qwen3 target here) and name_or_path its hub id, never a local
    path (speculators/config.py VerifierConfig.from_config takes both from the verifier's config)."""
    from testkit import tiny_families as tf

    target = tf.make_family_target(tmp_path / "qwen3", "qwen3")
    cfg = json.loads((target / "config.json").read_text())
    cfg.pop("_name_or_path", None)
    if name is not None:
        cfg["_name_or_path"] = name
    (target / "config.json").write_text(json.dumps(cfg))
    head = tm.make_eagle3_head(tmp_path / "head", target)
    assert export(head, "speculators", tmp_path / "s", target) == 0
    verifier = json.loads((tmp_path / "s" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": written, "architectures": ["Qwen3ForCausalLM"]}
    assert export(head, "speculators", tmp_path / "no_target", None) == 0
    assert json.loads((tmp_path / "no_target" / "config.json").read_text())["speculators_config"]["verifier"] == {
        "name_or_path": None, "architectures": []}
    assert export(head, "speculators", tmp_path / "named", target, "--verifier-name", "org/qwen3-tiny") == 0
    assert json.loads((tmp_path / "named" / "config.json").read_text())["speculators_config"]["verifier"] == {
        "name_or_path": "org/qwen3-tiny", "architectures": ["Qwen3ForCausalLM"]}


def _build_head(tmp: Path, target: Path, head: Path, name: str) -> tuple[int, Path]:
    from builders import build
    from tests.test_config_cli import write_cfg

    out = tmp / f"build-{name}"
    cfg = write_cfg(tmp / f"{name}.yaml", target, head, out, trtllm_version="1.4", draft__type="eagle3")
    return build.main([str(cfg), "--only", "checkpoint"]), out


def test_build_converts_a_speculators_head_like_its_flat_twin(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """The convert stage takes every layout the doctor reads: a head in vLLM's speculators layout builds with no
    manual export, to the same normalized head as the flat original; the doctor finds nothing wrong with it for
    the reference engine (the build's own loader)."""
    target, head = pair
    assert export(head, "speculators", tmp_path / "spec", target) == 0
    rc_flat, flat = _build_head(tmp_path, target, head, "flat")
    rc_spec, spec = _build_head(tmp_path, target, tmp_path / "spec", "spec")
    assert rc_flat == rc_spec == 0
    a = load_file(str(flat / "checkpoint" / "eagle3" / "model.safetensors"))
    b = load_file(str(spec / "checkpoint" / "eagle3" / "model.safetensors"))
    same(a, b)
    ca, cb = (json.loads((d / "checkpoint" / "eagle3" / "config.json").read_text()) for d in (flat, spec))
    # recorded relative to the build directory (core/records.py)
    assert resolve_recorded(cb["eagle_deploy"].pop("head_source"), spec) == tmp_path / "spec"
    ca["eagle_deploy"].pop("head_source")
    # the speculators layout states the RoPE base in rope_parameters (transformers 5); the flat twin in rope_theta
    assert cb.pop("rope_parameters") == {"rope_theta": ca["rope_theta"], "rope_type": "default"}
    assert ca == cb
    assert not list(Path(tempfile.gettempdir()).glob("eagle3-flat-*")), "the flat view is removed"
    rep = doctor(target, tmp_path / "spec", "reference", tmp_path)
    assert rep["layout"] == "speculators" and rep["compatibility"]["reference"] == "loads as it is"
    from ledger import check as ledger_check  # every key the converter wrote for it is cited

    assert ledger_check.main([str(tmp_path / "spec.yaml")]) == 0


def test_a_broken_speculators_head_is_refused_naming_its_directory(tmp_path: Path, pair: tuple[Path, Path],
                                                                    capsys: pytest.CaptureFixture) -> None:
    target, head = pair
    assert export(head, "speculators", tmp_path / "spec", target) == 0
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    cfg["target_hidden_size"] = 2 * int(cfg["transformer_layer_config"]["hidden_size"])
    (tmp_path / "spec" / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    rc, out = _build_head(tmp_path, target, tmp_path / "spec", "broken")
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert f"draft.model {tmp_path / 'spec'} (speculators layout): target_hidden_size=" in err, err
