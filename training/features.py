"""Target features, one row per token, for both head kinds, computed in length-bucketed batches.

  hidden  [T, H]    the target's LAST hidden state AFTER its final RMSNorm (HF `last_hidden_state`; SafeAILab ge_data
                    `hidden_states[-1]`): EAGLE-1/2 regresses it, EAGLE-3 takes its target distribution from it.
  aux     [T, n*H]  EAGLE-3 only: the INPUTS of the decoder layers in `layer_ids`, concatenated in that order (id j =
                    the residual stream entering layer j, 0 = the embeddings), captured by forward pre-hooks: what
                    the reference engine captures and SafeAILab's EAGLE-3 fc fuses (DeepSeek-V4: layer j - 1's MoE
                    output, as upstream captures it; core/families.py `feature_source`).
  greedy  [T]       EAGLE-3 only: argmax of the target's FULL logits at each position (its greedy next token).

Sequences are sorted by length and packed into right-padded batches of at most `batch_tokens` tokens (rows x
longest); a causal target's outputs at real positions do not depend on padding after them, so nothing but the
padding's own compute is spent on it. A shard holds the rows of every sequence of one data shard concatenated
(`offsets` marks the sequences), in `FeaturesConfig.dtype`, and is loaded memory-mapped: a training step reads
only the rows of its own examples. Written atomically; a shard written for another head kind, other layers or
another dtype is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from tqdm import tqdm

from core.families import feature_source
from training.shards import atomic_save, shard_path

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle
    from transformers import PreTrainedModel

    from training.config import TrainHeadConfig

KIND = "features"
FORMAT = 2


class FeatureError(RuntimeError):
    """Cached features do not fit the config; the message says what to delete."""


@dataclass(frozen=True)
class FeatureSpec:
    layer_ids: tuple[int, ...] | None  # None: EAGLE-1/2 (hidden only); else EAGLE-3 (aux + hidden + greedy)
    dtype: torch.dtype  # storage dtype of hidden/aux

    @property
    def kind(self) -> str:
        return "eagle" if self.layer_ids is None else "eagle3"

    def key(self) -> dict:
        return {"kind": self.kind, "layer_ids": list(self.layer_ids or []), "dtype": str(self.dtype)}


class HasInputIds(Protocol):
    """A training sample as the online feature function reads it (training/runner.py Sample)."""

    input_ids: torch.Tensor


def spec_for(cfg: TrainHeadConfig) -> FeatureSpec:
    """The FeatureSpec of a TrainHeadConfig."""
    e3 = cfg.eagle3 if cfg.kind.eagle3 else None
    if e3 is not None and e3.layer_ids is None:
        raise FeatureError("eagle3.layer_ids is unset: the default needs the target's depth "
                           "(training.config.with_layer_ids after loading the target)")
    layer_ids = None if e3 is None or e3.layer_ids is None else tuple(e3.layer_ids)
    return FeatureSpec(layer_ids, getattr(torch, cfg.features.dtype))


def check_layers(model: PreTrainedModel, spec: FeatureSpec) -> None:
    n = len(model.model.layers)
    bad = [j for j in spec.layer_ids or () if not 0 <= j < n]
    if bad:
        raise FeatureError(f"eagle3.layer_ids {bad} are outside 0..{n - 1} (the target's decoder layers)")


class LayerInputs:
    """Forward pre-hooks keeping the input of each decoder layer in `layer_ids` during the forwards inside `with`."""

    def __init__(self, model: PreTrainedModel, layer_ids: tuple[int, ...] | None) -> None:
        self.model, self.layer_ids = model, layer_ids or ()
        self.got: dict[int, torch.Tensor] = {}
        self.handles: list[RemovableHandle] = []

    def __enter__(self) -> LayerInputs:
        layers = self.model.model.layers
        kind = getattr(self.model.config, "model_type", None)
        for j in self.layer_ids:
            where, k = feature_source(kind, j)  # DeepSeek-V4: the embeddings / a layer's MoE output
            if where == "input":
                self.handles.append(layers[j].register_forward_pre_hook(self._grab(j), with_kwargs=True))
            else:
                module = self.model.model.embed_tokens if where == "embed" else layers[k].mlp
                self.handles.append(module.register_forward_hook(self._output(j)))
        return self

    def _output(self, j: int) -> Callable[[nn.Module, tuple[Any, ...], torch.Tensor], None]:
        def hook(_mod: nn.Module, _args: tuple[Any, ...], output: torch.Tensor) -> None:
            self.got[j] = output

        return hook

    def _grab(self, j: int) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        def hook(_mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.got[j] = args[0] if args else kwargs["hidden_states"]

        return hook

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()

    def aux(self) -> torch.Tensor:
        """[B, L, n*H] of the last forward, on the device of the first captured layer."""
        dev = self.got[self.layer_ids[0]].device
        return torch.cat([self.got[j].to(dev) for j in self.layer_ids], dim=-1)


def greedy_tokens(model: PreTrainedModel, hidden: torch.Tensor, rows: int = 2048) -> torch.Tensor:
    """argmax of the target's full logits for hidden [N, H], `rows` at a time (a [N, V] logit matrix of a 128k
    vocabulary does not fit)."""
    lm = model.get_output_embeddings().weight
    out = [(h.to(lm.device, lm.dtype) @ lm.T).argmax(-1) for h in hidden.split(rows)]
    return torch.cat(out).cpu() if out else torch.zeros(0, dtype=torch.long)


@torch.no_grad()
def forward_features(
    model: PreTrainedModel, ids: torch.Tensor, attention_mask: torch.Tensor, spec: FeatureSpec
) -> dict[str, torch.Tensor]:
    """One right-padded batch [B, L] -> {"hidden" [B, L, H], "aux" [B, L, n*H]} on the target's output devices."""
    with LayerInputs(model, spec.layer_ids) as cap:
        hidden = model.model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
        return {"hidden": hidden, **({"aux": cap.aux()} if spec.layer_ids else {})}


def bucket_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped so rows x longest <= batch_tokens (a longer sequence gets a batch of its own), longest first
    (an out-of-memory batch shows up at once), each batch's lengths as close as sorting makes them."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def sequence_features(
    model: PreTrainedModel, seqs: list[torch.Tensor], spec: FeatureSpec, batch_tokens: int
) -> list[dict[str, torch.Tensor]]:
    """Features of each [T] token sequence (CPU; float32 hidden/aux, int64 greedy), length-bucketed batches."""
    dev = model.get_input_embeddings().weight.device
    out: list[dict[str, torch.Tensor]] = [{} for _ in seqs]
    for batch in bucket_batches([len(s) for s in seqs], batch_tokens):
        width = len(seqs[batch[0]])
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        att = torch.zeros(len(batch), width, dtype=torch.long)
        for r, i in enumerate(batch):
            ids[r, : len(seqs[i])] = seqs[i].long()
            att[r, : len(seqs[i])] = 1
        got = forward_features(model, ids.to(dev), att.to(dev), spec)
        for r, i in enumerate(batch):
            n = len(seqs[i])
            out[i] = {k: v[r, :n].float().cpu() for k, v in got.items()}
            if spec.layer_ids:
                out[i]["greedy"] = greedy_tokens(model, got["hidden"][r, :n])
    return out


def _cast(x: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    y = x.to(dtype)
    if not bool(torch.isfinite(y).all()):
        raise FeatureError(f"{what} overflows {dtype} (max |x| = {x.abs().max().item():.4g}); set features.dtype: "
                           "bfloat16")
    return y


def pack(rows: list[dict[str, torch.Tensor]], spec: FeatureSpec, what: str) -> dict:
    """Per-sequence features -> one shard: flat tensors + offsets (format FORMAT), in the storage dtype."""
    lengths = [len(r["hidden"]) for r in rows]
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    shard = {"format": FORMAT, "spec": spec.key(), "offsets": offsets,
             "hidden": _cast(torch.cat([r["hidden"] for r in rows]), spec.dtype, f"{what}: last hidden state")}
    if spec.layer_ids:
        shard["aux"] = _cast(torch.cat([r["aux"] for r in rows]), spec.dtype, f"{what}: captured layer inputs")
        shard["greedy"] = torch.cat([r["greedy"] for r in rows]).to(torch.int32)
    return shard


def my_shards(n: int, rank: int, world: int) -> list[int]:
    """Shard indices this rank computes (round robin: ranks finish together when shards cost the same)."""
    return list(range(rank, n, world))


def build_features(
    model: PreTrainedModel,
    data_shards: list[Path],
    work_dir: Path,
    spec: FeatureSpec,
    batch_tokens: int,
    rank: int = 0,
    world: int = 1,
) -> list[Path]:
    """Write (or reuse) one feature shard per data shard, this rank's share of them; returns every shard's path
    (the caller waits for the other ranks before reading theirs)."""
    check_layers(model, spec)
    paths = [shard_path(work_dir, KIND, i) for i in range(len(data_shards))]
    mine = my_shards(len(data_shards), rank, world)
    bar = tqdm(mine, desc=f"target features (rank {rank}/{world}): {spec.kind} hidden states per shard", unit="shard",
               disable=rank != 0)
    for i in bar:
        if paths[i].is_file():
            check_shard(paths[i], spec)
            bar.set_postfix_str(f"shard {i}: reused")
            continue
        data = torch.load(data_shards[i], weights_only=True)
        bar.set_postfix_str(f"shard {i}: {len(data['input_ids'])} sequences through the target")
        rows = sequence_features(model, data["input_ids"], spec, batch_tokens)
        atomic_save(pack(rows, spec, str(data_shards[i])), paths[i])
    return paths


def check_shard(path: Path, spec: FeatureSpec) -> dict:
    d = torch.load(path, weights_only=True, mmap=True)
    if d.get("format") != FORMAT:
        raise FeatureError(f"{path} was written by an older trainer (another shard layout); delete {path.parent} "
                           "to recompute")
    if d["spec"] != spec.key():
        raise FeatureError(f"{path} holds {d['spec']} but the config asks for {spec.key()}; delete {path.parent} to "
                           "recompute (or use another work_dir)")
    return d


def load_features(paths: list[Path], spec: FeatureSpec) -> Iterator[dict[str, torch.Tensor]]:
    """Per-sequence views {"hidden", "aux"?, "greedy"?} into the memory-mapped shards, in shard order."""
    for p in paths:
        d = check_shard(p, spec)
        off = d["offsets"].tolist()
        names = [k for k in ("hidden", "aux", "greedy") if k in d]
        for a, b in zip(off[:-1], off[1:]):
            yield {k: d[k][a:b] for k in names}


def online_features(
    model: PreTrainedModel, spec: FeatureSpec, batch_tokens: int
) -> Callable[[Sequence[HasInputIds]], list[dict[str, torch.Tensor]]]:
    """A FeatureFn computing the features of a training step's samples with the target (features.storage: online)."""

    def fn(samples: Sequence[HasInputIds]) -> list[dict[str, torch.Tensor]]:
        return sequence_features(model, [s.input_ids for s in samples], spec, batch_tokens)

    return fn
