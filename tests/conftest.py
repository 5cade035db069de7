"""Shared fixtures: tiny models written once per test session (see testkit/tiny_models.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from testkit import tiny_models as tm


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> Path:
    """2-layer GQA Llama, untied lm_head, with tokenizer."""
    return tm.make_target(tiny_dir / "target")


@pytest.fixture(scope="session")
def tiny_target_tied(tiny_dir: Path) -> Path:
    """2-layer GQA Llama with tied embeddings and llama3 rope scaling."""
    return tm.make_target(tiny_dir / "target_tied", tie=True, rope_scaling=tm.LLAMA3_ROPE, seed=3)


@pytest.fixture(scope="session")
def eagle_head(tiny_dir: Path, tiny_target: Path) -> Path:
    """EAGLE-1 head with fc.bias."""
    return tm.make_eagle_head(tiny_dir / "eagle_bias", tiny_target, bias=True)


@pytest.fixture(scope="session")
def eagle_head_nobias(tiny_dir: Path, tiny_target: Path) -> Path:
    """EAGLE-1 head without fc.bias, config says "bias": false (LLaMA3-style)."""
    return tm.make_eagle_head(tiny_dir / "eagle_nobias", tiny_target, bias=False, declare_bias=False)


@pytest.fixture(scope="session")
def eagle3_head(tiny_dir: Path, tiny_target: Path) -> Path:
    """EAGLE-3 head with a 96-token draft vocabulary (d2t/t2d)."""
    return tm.make_eagle3_head(tiny_dir / "eagle3", tiny_target)


# ---- reference engine (issue 3): models whose EAGLE head actually accepts tokens ------------------------------------


@pytest.fixture(scope="session")
def mimic_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """(target, EAGLE-1 head) with vocab 320 where the head accepts ~1-2 tokens per step (tau ~2)."""
    return tm.mimic_pair(tiny_dir / "mimic", vocab=tm.VOCAB, seed=5, block_scale=2.0)


@pytest.fixture(scope="session")
def small_vocab_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """(target, EAGLE-1 head) with a 6-token vocabulary, for exact distribution tests of speculative sampling."""
    return tm.mimic_pair(tiny_dir / "vocab6", vocab=6, seed=11, block_scale=2.0)


def convert_eagle_ckpt(target: Path, head: Path, out: Path, *, tp: int = 1, dtype: str = "float32") -> Path:
    """EagleForCausalLM checkpoint via builders.convert (limits of the 25-node EAGLE tree; the reference engine takes
    its tree at load time, so any tree runs on it)."""
    from builders.convert import convert_eagle

    if not (out / "config.json").is_file():
        convert_eagle(
            target, head, out, dtype=dtype, max_draft_len=25, num_eagle_layers=5, max_non_leaves_per_layer=4, tp=tp
        )
    return out


@pytest.fixture(scope="session")
def target_ckpt(tiny_dir: Path, tiny_target: Path) -> Path:
    from builders.convert import convert_llama

    out = tiny_dir / "ckpt_target"
    convert_llama(tiny_target, out, dtype="float32")
    return out


@pytest.fixture(scope="session")
def eagle_ckpt(tiny_dir: Path, tiny_target: Path, eagle_head: Path) -> Path:
    return convert_eagle_ckpt(tiny_target, eagle_head, tiny_dir / "ckpt_eagle")


@pytest.fixture(scope="session")
def eagle_ckpt_nobias(tiny_dir: Path, tiny_target: Path, eagle_head_nobias: Path) -> Path:
    return convert_eagle_ckpt(tiny_target, eagle_head_nobias, tiny_dir / "ckpt_eagle_nobias")


@pytest.fixture(scope="session")
def eagle3_ckpt(tiny_dir: Path, tiny_target: Path, eagle3_head: Path) -> Path:
    """Target checkpoint + normalized head in <ckpt>/eagle3 (builders.convert.convert_eagle3)."""
    from builders.convert import convert_eagle3

    out = tiny_dir / "ckpt_eagle3"
    convert_eagle3(tiny_target, eagle3_head, out, dtype="float32", layers_to_capture=None)
    return out


@pytest.fixture(scope="session")
def mimic_ckpt(tiny_dir: Path, mimic_pair: tuple[Path, Path]) -> Path:
    return convert_eagle_ckpt(*mimic_pair, tiny_dir / "ckpt_mimic")


@pytest.fixture(scope="session")
def small_vocab_ckpt(tiny_dir: Path, small_vocab_pair: tuple[Path, Path]) -> Path:
    return convert_eagle_ckpt(*small_vocab_pair, tiny_dir / "ckpt_vocab6")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module: 2 shared cores, and OpenMP threads spinning against other processes make
    tiny matmuls 100x slower. Modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- the tiny reference build on a real tritonserver (testkit/triton_build.py), shared by the server modules ------


@pytest.fixture(scope="session")
def triton_build_dir(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    from testkit import triton_build

    return triton_build.build(tmp_path_factory.mktemp("triton_build"), tiny_target, eagle_head)


@pytest.fixture(scope="session")
def triton_server(triton_build_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from testkit import triton_build

    log_dir = tmp_path_factory.mktemp("triton_log")
    srv = triton_build.start_server(triton_build_dir / "triton_repo", log_dir)
    yield srv
    code = srv.stop()
    assert code == 0, f"tritonserver did not stop cleanly (exit {code}); log {log_dir / 'tritonserver.log'}"


# ---- targets beyond Llama (testkit/tiny_families.py) -----------------------------------------------------------------


@pytest.fixture(scope="session")
def family_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny random target per family beyond Llama (GQA, untied, rope_theta 1e6), written by transformers."""
    from testkit.tiny_families import FAMILIES, make_family_target

    root = tmp_path_factory.mktemp("families")
    return {f: make_family_target(root / f, f) for f in FAMILIES}
