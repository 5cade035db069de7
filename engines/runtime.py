"""Loading an engine: checkpoint, head, tree, tokenizer and limits, with the weight layouts of its device.

A `Runtime` is the loaded weights and what decoding needs to know about them; it decodes nothing itself. The
speculative step is engines/step.py (the prefill and target-only steps engines/decode.py); engines/session.py holds
the batch as slots (one cache row each): `add` a request at any time, `step` prefills the new ones or advances every
active sequence by one step, finished or cancelled sequences leave (`pop`). Its `generate` is a session holding
exactly its requests, stepped until all are done; Triton's reference model keeps one session for its lifetime
(in-flight batching).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.spec import ReferenceSpec
from core.speculation import SpeculationPolicy
from core.trees import Tree
from core.types import Limits
from engines.checkpoint import (
    DTYPES,
    CheckpointError,
    Loader,
    Tensors,
    load_eagle1,
    load_eagle3,
    load_target,
    quant_of,
    rank_file,
    read_config,
    require,
)
from engines.drafting import Drafting, StaticDrafting, drafting_for
from engines.linear import describe_layouts, prepare_linears
from core.families import NATIVE, traits
from engines.generic import GenericTarget, load_generic
from engines.heads import Drafter, Eagle1Drafter
from engines.layers import MLP
from engines.model import Llama
from engines.parallel import TPGroup, current_group


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is visible; use device auto or cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: use auto, cpu or cuda")
    return torch.device(device)


def load_tokenizer(path: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"{path}: no tokenizer files; the convert stage copies them to <checkpoint>/tokenizer")
    return AutoTokenizer.from_pretrained(str(path))


@dataclass
class Runtime:
    target: Llama | GenericTarget
    drafter: Drafter | None
    drafting: Drafting | None  # None = target-only decoding
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    random_head: bool
    group: TPGroup
    limits: Limits | None = None  # from the build's reference.json; None = only memory limits
    window: int | None = None  # the target's sliding window: longer sequences would be computed wrongly, refused
    window_key: str = "sliding_window"  # the config key of `window` (attention_chunk_size: Llama 4's chunks)
    policy: SpeculationPolicy | None = None  # draft length per step (engines/schedule.py); None = the whole tree
    kernels: tuple[str, ...] = ()  # what multiplies the weights (engines/linear.py describe_layouts), set at load

    def __post_init__(self) -> None:
        recurrent = isinstance(self.target, GenericTarget) and self.target.recurrent is not None
        compressed = isinstance(self.target, GenericTarget) and self.target.compressed is not None
        chain = isinstance(self.drafting, StaticDrafting) and self.drafting.tree.is_chain()
        if (recurrent or compressed) and self.drafting is not None and not chain:
            what = "recurrent layers" if recurrent else "compressed attention (DeepSeek-V4)"
            raise ValueError(f"this target has {what}, which read(s) a forward's tokens in order: the "
                             "reference engine verifies only chain drafts for it (tree.choices chain-N), not "
                             f"{type(self.drafting).__name__.removesuffix('Drafting').lower()} trees with branches")

    @classmethod
    def load(
        cls, ckpt: Path, *, tree: Tree | None, dtype: str, device: str,
        eagle3_head_dir: Path | None, tokenizer_dir: Path | None = None, draft_vocab: list[int] | None = None,
    ) -> Runtime:
        """`draft_vocab`: target token ids an EAGLE-1/2 head drafts over (its lm_head restricted to those rows,
        e.g. the most frequent tokens: cheaper draft steps; verification still uses the full vocabulary)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: use one of {', '.join(DTYPES)}")
        dev = resolve_device(device)
        cfg = read_config(ckpt)
        group = current_group(int(require(cfg, "mapping", ckpt)["tp_size"]))
        arch = require(cfg, "architecture", ckpt)
        target, tensors, ld = _target(cfg, ckpt, group, dev, dtype)
        drafter: Drafter | None = None
        ignore: tuple[str, ...] = ()
        if arch == "EagleForCausalLM":
            ignore = tuple(f"eagle_nets.{k}." for k in range(1 if tree is not None else 0, cfg["num_eagle_layers"]))
            if tree is not None:
                if eagle3_head_dir is not None:
                    raise CheckpointError(
                        f"{ckpt} is an EagleForCausalLM (EAGLE-1/2) checkpoint; do not pass an EAGLE-3 head"
                    )
                assert ld is not None  # an EagleForCausalLM checkpoint always has converted weights
                drafter = load_eagle1(ld, cfg, ckpt, group, dev)
        elif arch not in NATIVE and not isinstance(target, GenericTarget):
            raise CheckpointError(f"{ckpt}/config.json: architecture {arch!r}; expected EagleForCausalLM, one of "
                                  f"{', '.join(NATIVE)} or a generic_target")
        elif tree is not None:
            if eagle3_head_dir is None:
                raise CheckpointError(
                    f"{ckpt} holds no EAGLE head (architecture {arch}): pass eagle3_head_dir for an EAGLE-3 "
                    "head, convert with an EAGLE-1/2 head, or use tree=None for target-only decoding"
                )
            drafter = load_eagle3(Path(eagle3_head_dir), target, len(target.layers), DTYPES[dtype], dev)
        if tensors is not None:
            tensors.check_all_used(ignore)
            tensors.close()
        if draft_vocab is not None:
            drafter = restrict_draft_vocab(drafter, draft_vocab)
        fuse_and_lay_out(target, drafter)
        drafting = None if tree is None else drafting_for(tree, dev)
        if tree is not None:
            check_tree_fits(tree, drafter)
        random_head = bool(cfg.get("eagle_deploy", {}).get("random_head", False))
        tok = load_tokenizer(tokenizer_dir or ckpt / "tokenizer")
        window = target.window if isinstance(target, GenericTarget) else traits(cfg).sliding_window
        key = target.window_key if isinstance(target, GenericTarget) else "sliding_window"
        return cls(target, drafter, drafting, tok, dev, DTYPES[dtype], random_head, group, window=window,
                   window_key=key, kernels=tuple(describe_layouts(target, drafter)))

    def check_window(self, length: int) -> None:
        if self.window is not None and length > self.window:
            raise ValueError(
                f"a sequence of up to {length} tokens (prompt + max_new_tokens) exceeds the target's {self.window_key}="
                f"{self.window}: the reference engine attends to every earlier key and would compute positions "
                f"beyond it wrongly; keep prompt + max_new_tokens <= {self.window}")

    def with_tree(self, tree: Tree) -> Runtime:
        """The same weights (not copied) drafting with another tree."""
        if self.drafter is None:
            raise ValueError("this engine has no EAGLE head; a tree needs one")
        check_tree_fits(tree, self.drafter)
        return dataclasses.replace(self, drafting=drafting_for(tree, self.device))

    def with_policy(self, policy: SpeculationPolicy | None) -> Runtime:
        """The same weights and tree, each step's draft length following `policy` (None: always the whole tree)."""
        return dataclasses.replace(self, policy=policy)

    def with_draft_vocab(self, ids: list[int]) -> Runtime:
        """The same weights with the head drafting over `ids` only (a new lm_head of those rows; the rest shared)."""
        drafter = restrict_draft_vocab(self.drafter, ids)
        prepare_linears(drafter.lm_head)
        if self.drafting is not None:
            check_tree_fits(self.drafting.tree, drafter)
        return dataclasses.replace(self, drafter=drafter, kernels=tuple(describe_layouts(self.target, drafter)))


def _target(cfg: dict[str, Any], ckpt: Path, group: TPGroup, dev: torch.device,
            dtype: str) -> tuple[Llama | GenericTarget, Tensors | None, Loader | None]:
    """The checkpoint's target: converted weights, or transformers' model of `generic_target` (engines/generic.py)."""
    generic = cfg.get("generic_target")
    if generic is None:
        tensors = Tensors(rank_file(ckpt, group.rank), dev)
        ld = Loader(tensors, DTYPES[dtype], quant_of(cfg, ckpt))
        return load_target(ld, cfg, ckpt, group, dev), tensors, ld
    if group.size != 1:
        raise CheckpointError(f"{ckpt}/config.json: tp_size={group.size}; a generic target runs at tp=1 only")
    path = Path(generic)  # absolute (the HF target), or inside the checkpoint (a mirrored FP8 export)
    return load_generic(path if path.is_absolute() else ckpt / path, DTYPES[dtype], dev), None, None


def restrict_draft_vocab(drafter: Drafter | None, ids: list[int]) -> Eagle1Drafter:
    if drafter is None:
        raise ValueError("draft_vocab restricts an EAGLE head's drafting, but this engine has no head (tree=None)")
    if not isinstance(drafter, Eagle1Drafter):
        raise ValueError("draft_vocab is for EAGLE-1/2 heads; an EAGLE-3 head drafts over its own vocabulary (d2t)")
    return drafter.restricted(ids)


def fuse_and_lay_out(target: Llama | GenericTarget, drafter: Drafter | None) -> None:
    """One product for each MLP's two input branches, then the weight layouts of the device (engines/linear.py)."""
    roots: list[object] = [drafter]  # what holds Linear layers (engines/linear.py prepare_linears)
    blocks: list[MLP] = []
    if not isinstance(target, GenericTarget):  # transformers' modules keep their own layout
        blocks, roots = [layer.mlp for layer in target.layers], [target, drafter]
    if isinstance(drafter, Eagle1Drafter):
        blocks += [layer.mlp for layer in drafter.layers]
    elif drafter is not None:
        blocks.append(drafter.mlp)
    for mlp in blocks:
        mlp.fuse()
    prepare_linears(*roots)


def check_tree_fits(tree: Tree, drafter: Drafter | None) -> None:
    assert drafter is not None
    k = tree.max_top_k
    vocab = drafter.lm_head.vocab_size if isinstance(drafter, Eagle1Drafter) else drafter.lm_head.weight.shape[0]
    if k > vocab:
        raise ValueError(f"the tree needs the top {k} draft tokens per node but the draft vocabulary has {vocab}")


def runtime_from_spec(spec: ReferenceSpec, build_dir: Path, device: str | None) -> Runtime:
    head = spec.path(build_dir, spec.eagle3_head_dir) if spec.eagle3_head_dir else None
    rt = Runtime.load(
        spec.path(build_dir, spec.checkpoint_dir), tree=spec.tree, dtype=spec.dtype, device=device or spec.device,
        eagle3_head_dir=head, tokenizer_dir=spec.path(build_dir, spec.tokenizer_dir), draft_vocab=spec.draft_vocab,
    )
    if rt.group.size != spec.tp:
        raise CheckpointError(f"reference.json says tp={spec.tp} but the checkpoint has tp_size={rt.group.size}")
    rt.limits = Limits(spec.max_batch_size, spec.max_input_len, spec.max_seq_len)
    rt.policy = spec.policy()
    return rt
