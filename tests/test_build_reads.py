"""Each stage writes only what something reads: a current-line PyTorch build (trtllm_version 1.4, engine.backend
pytorch, an EAGLE-3 head) writes the normalized head, the tokenizer and the target's shape, never a copy of the
target's weights; every output is named in its stage's plan with who reads it; records hold no absolute paths; the
shipped heads' recipes neither."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from builders.build import main as build_main
from builders.layout import MANIFEST
from testkit import tiny_models as tm
from tests.engine_cases import write_build_yaml

REPO = Path(__file__).resolve().parent.parent


def _written(build: Path) -> dict[str, int]:
    """Every regular file the build wrote (links to the user's files excluded), with its size."""
    return {str(p.relative_to(build)): p.stat().st_size for p in build.rglob("*")
            if p.is_file() and not p.is_symlink()}


def _covered(path: str, planned: list[dict[str, str]]) -> bool:
    return any(path == o["path"] or (o["path"].endswith("/") and path.startswith(o["path"])) for o in planned)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reads")
    target = tm.make_target(root / "target", layers=4)
    head = tm.make_eagle3_head(root / "eagle3", target)
    head_cfg = json.loads((head / "config.json").read_text())
    head_cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # TensorRT-LLM needs three distinct layers
    (head / "config.json").write_text(json.dumps(head_cfg))
    return target, head


def test_current_line_pytorch_build_writes_no_target_copy(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    target, head = pair
    build = tmp_path / "build"
    cfg = write_build_yaml(tmp_path / "pt.yaml", output_dir=build, target=target, head=head, draft="eagle3",
                           backend="pytorch", tree="chain-3", name="reads", version="1.4")
    assert build_main([str(cfg)]) == 0
    written = _written(build)
    target_bytes = sum(p.stat().st_size for p in target.glob("*.safetensors"))
    head_bytes = (build / "checkpoint" / "eagle3" / "model.safetensors").stat().st_size
    assert not list(build.rglob("rank*.safetensors"))
    # the one weight file written is the head's; nothing else comes near the target's size
    assert [k for k in written if k.endswith(".safetensors")] == ["checkpoint/eagle3/model.safetensors"]
    # the Dynamo model card repeats the tokenizer (a few MB for a real target, a tenth of this tiny one's weights)
    tokenizer = {f.name for f in (build / "checkpoint" / "tokenizer").iterdir()}
    card = sum(n for k, n in written.items() if k.startswith("dynamo/model/") and k.rsplit("/", 1)[-1] in tokenizer)
    assert sum(written.values()) - head_bytes - card < target_bytes / 10, written
    ck = json.loads((build / "checkpoint" / "config.json").read_text())
    assert ck["eagle_deploy"]["target_weights"] is False and ck["num_hidden_layers"] == 4
    opts = yaml.safe_load((build / "engine" / "llm_api_options.yaml").read_text())
    assert opts["speculative_config"]["speculative_model"] == str(build / "checkpoint" / "eagle3")
    for stage in ("checkpoint", "engine", "triton_repo"):
        man = json.loads((build / stage / MANIFEST).read_text())
        planned = man["planned_outputs"]
        assert planned and all(o["read_by"] for o in planned)
        unplanned = [o["path"] for o in man["outputs"] if not _covered(o["path"], planned)]
        assert unplanned == [], f"{stage} writes files no plan names: {unplanned}"
        # records name paths relative to the build directory (core/records.py)
        text = json.dumps({k: man[k] for k in ("inputs", "notes", "commands", "argv")})
        assert str(tmp_path) not in text, f"{stage}/manifest.json records an absolute path"


def test_reference_build_still_writes_the_target_for_the_reference_engine(tmp_path: Path,
                                                                        pair: tuple[Path, Path]) -> None:
    target, head = pair
    build = tmp_path / "build"
    cfg = write_build_yaml(tmp_path / "ref.yaml", output_dir=build, target=target, head=head, draft="eagle3",
                           backend="reference", tree="chain-3", name="reads-ref", version="1.4",
                           engine={"max_batch_size": 2})
    assert build_main([str(cfg), "--only", "checkpoint"]) == 0
    man = json.loads((build / "checkpoint" / MANIFEST).read_text())
    rank0 = next(o for o in man["planned_outputs"] if o["path"] == "rank0.safetensors")
    assert "reference engine" in rank0["read_by"] and (build / "checkpoint" / "rank0.safetensors").is_file()


def test_shipped_head_recipes_hold_no_absolute_path() -> None:
    recipes = sorted((REPO / "heads").glob("*/recipe.yaml"))
    assert recipes
    for r in recipes:
        cfg = yaml.safe_load(r.read_text())["config"]
        for key in ("work_dir", "output_dir", "target"):
            value = str(cfg.get(key) or "")
            assert not os.path.isabs(value), f"{r}: {key}={value} is an absolute path"
        assert " /work/" not in r.read_text() and " /home/" not in r.read_text(), r


def test_bench_build_outputs_script_on_a_tiny_shape(tmp_path: Path) -> None:
    """bench/bench_build_outputs.py (docs/benchmarks.md) on the tiny shape, this checkout."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_build_outputs.py"), "--work", str(tmp_path),
                           "--shape", "tiny", "--project", f"this={REPO}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "inputs: tiny shape, 8 layers" in proc.stdout and "| this | " in proc.stdout
    assert not (tmp_path / "build-this").exists()  # removed after measuring unless --keep
