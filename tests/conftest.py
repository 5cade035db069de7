"""Shared fixtures: tiny models written once per test session (see tests/tiny_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import tiny_models as tm  # noqa: E402


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
