"""Head versions of the served LLM model (docs/adaptive.md). The build renders version 1, which serves the build's own
head. `adaptive/refresh.py --publish` adds version N as a directory beside it:

    <repo>/<llm_model>/<N>/model.py, eagle_bootstrap.py, ...   the same files as the version it follows
    <repo>/<llm_model>/<N>/draft_head/                         the published EAGLE-3 head, normalized (the
                                                               converter's layout: builders/convert/eagle3.py)
    <repo>/<llm_model>/<N>/model.yaml                          llmapi layout: speculative_model_dir = that head
    <repo>/<llm_model>/<N>/acceptance_baseline.json            the gate's figures for this head (its baseline)

Triton serves the newest version (the default version policy, latest 1) and loads it with the model-control API while
the old one finishes the requests it holds. The reference models load their engine through `engine_for`: the
build's checkpoint and tree with this version's head when it has one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engines.api import ReferenceEngine

HEAD_DIR = "draft_head"


def version_dir(args: dict[str, Any]) -> Path:
    """This model version's directory (`args` of initialize(): model_repository is the model's directory)."""
    return Path(args["model_repository"]) / str(args.get("model_version", "1"))


def published_head(args: dict[str, Any]) -> Path | None:
    d = version_dir(args) / HEAD_DIR
    return d.resolve() if d.is_dir() else None


def check_llmapi_yaml(options: dict[str, Any], head: Path, repository: str) -> None:
    """An llmapi version's model.yaml must name the head this version serves (what TensorRT-LLM would load)."""
    spec = options.get("speculative_config") or {}
    named = spec.get("speculative_model_dir") or spec.get("speculative_model")
    if not isinstance(named, str) or Path(os.path.normpath(os.path.join(repository, named))).resolve() != head:
        raise ValueError(f"model.yaml speculative_model_dir {named!r} is not this version's head {head}; publish the "
                         "version again (adaptive/refresh.py --publish)")


def engine_for(args: dict[str, Any], build_dir: Path) -> ReferenceEngine:
    """The reference engine of this version: the build's, with this version's published head when it has one.
    Prints what multiplies its weights on this machine (the server log): `kernel_lines`."""
    engine = _load(args, build_dir)
    print("\n".join(kernel_lines(args["model_name"], engine.kernels)), flush=True)
    return engine


def kernel_lines(model_name: str, kernels: tuple[str, ...]) -> list[str]:
    return [f"[eagle] {model_name}: kernels: {line}" for line in kernels]


def _load(args: dict[str, Any], build_dir: Path) -> ReferenceEngine:
    from core.spec import read_spec
    from engines.api import ReferenceEngine

    head = published_head(args)
    if head is None:
        return ReferenceEngine.from_build(build_dir)
    options = version_dir(args) / "model.yaml"
    if options.is_file():  # the llmapi layout: its model.yaml must name the head this version serves
        import yaml

        check_llmapi_yaml(yaml.safe_load(options.read_text()) or {}, head,
                          str(Path(args["model_repository"]).resolve().parent))
    spec = read_spec(build_dir)
    if not spec.kind.eagle3:
        raise ValueError(f"{head}: a published head version needs an EAGLE-3 build (this build's head is "
                         f"{spec.draft_type}); remove the version directory")
    return ReferenceEngine.from_build(build_dir, eagle3_head_dir=head)
