"""Measured checks: tau and acceptance per draft position on the reference engine, then experiments that name the
cause when acceptance is low, each measured on the same prompts.

Every run decodes the prompts greedily with a chain of `depth` rank-0 drafts (measure/tree_tuning.py `chain`), so a
step's accepted length is the number of leading drafts equal to the target's continuation, and
p[d] = P(draft d accepted | drafts < d accepted) = reach(d) / reach(d-1), reach(0) = decoding steps
(core.types RequestStats.acceptance_by_depth). Greedy decoding is lossless: every run emits the same text, so
runs differ only in what the head drafts.

An experiment changes one thing (a d2t remap, captured layers moved by one, chat template off, the target's RoPE
base). When first-position acceptance is below COLLAPSED (a problem on its own), an experiment that restores it to
at least twice that names the cause; otherwise only a large gain does (tau + MIN_TAU_GAIN and first-position
acceptance x MIN_P1_RATIO), because runs with and without the chat template decode different texts and a few
prompts are noisy. The experiment that recovers the most is the cause; smaller gains are reported as info.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from doctor.findings import Finding, Report, Severity
from doctor.head import Head
from doctor.loaders import safeailab_default_ids
from doctor.static import chat_template_of
from measure.tree_tuning import AcceptanceTable, chain
from core.hfconfig import LlamaSpec, ModelConfigError
from engines.api import (
    GenerationRequest,
    ReferenceEngine,
    SamplingParams,
    aggregate_stats,
)

COLLAPSED = 0.05  # first-position acceptance below this: the head drafts (almost) nothing right
MIN_TAU_GAIN = 0.3
MIN_P1_RATIO = 1.5
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator keeps food cold.",
    "Give three tips for staying productive when working from home.",
    "What is the difference between a list and a tuple in Python?",
]


@dataclass
class Setup:
    ckpt: Path  # converted target (+ EAGLE-1 head) checkpoint
    head3: Path | None  # normalized EAGLE-3 head dir
    work: Path
    depth: int
    max_new_tokens: int
    chat: list[list[int]]  # prompt ids with the chat template
    raw: list[list[int]]  # prompt ids without it
    eos: list[int]


def _figures(engine: ReferenceEngine, prompts: list[list[int]], n: int, eos: list[int], depth: int) -> dict[str, Any]:
    reqs = [GenerationRequest(p, n, SamplingParams(), eos) for p in prompts]
    s = aggregate_stats([r.stats for r in engine.generate(reqs)])
    table = AcceptanceTable([[s.target_forwards, *(list(s.acceptance_by_depth) + [0] * depth)[:depth]]])
    p = [round(table.p(d, 0), 4) for d in range(1, depth + 1)]
    return {"tau": round(s.tau, 4), "p_by_position": p, "steps": s.target_forwards, "prompts": len(prompts),
            "generated_tokens": s.generated_tokens}


def run_variant(st: Setup, *, head3: Path | None = None, ckpt: Path | None = None, raw: bool = False) -> dict[str, Any]:
    engine = ReferenceEngine.from_checkpoint(ckpt or st.ckpt, tree=chain(0, st.depth), dtype="float32", device="cpu",
                                             eagle3_head_dir=head3 or st.head3)
    return _figures(engine, st.raw if raw else st.chat, st.max_new_tokens, st.eos, st.depth)


# ---- variants: a copy of the normalized head / checkpoint with one thing changed ------------------------------------
def _head_copy(
    src: Path, dst: Path, cfg: dict[str, Any] | None = None, tensors: dict[str, torch.Tensor] | None = None
) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    c = json.loads((src / "config.json").read_text())
    c.update(cfg or {})
    (dst / "config.json").write_text(json.dumps(c))
    if tensors:
        t = load_file(str(src / "model.safetensors"))
        t.update(tensors)
        save_file(t, str(dst / "model.safetensors"))
    elif not (dst / "model.safetensors").exists():
        os.symlink((src / "model.safetensors").resolve(), dst / "model.safetensors")
    return dst


def _ckpt_copy(src: Path, dst: Path, net: dict[str, Any]) -> Path:
    """An EAGLE-1 checkpoint with eagle_net_config keys changed (weights and tokenizer linked, not copied)."""
    dst.mkdir(parents=True, exist_ok=True)
    c = json.loads((src / "config.json").read_text())
    c["eagle_net_config"] = dict(c["eagle_net_config"], **net)
    (dst / "config.json").write_text(json.dumps(c))
    for f in src.iterdir():
        if f.name != "config.json" and not (dst / f.name).exists():
            os.symlink(f.resolve(), dst / f.name)
    return dst


def _d2t_variant(st: Setup, name: str, targets: torch.Tensor, vocab: int) -> Path:
    targets = targets.clamp(0, vocab - 1)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    n = targets.numel()
    assert st.head3 is not None
    return _head_copy(st.head3, st.work / "variants" / name, tensors={"d2t": targets - torch.arange(n), "t2d": t2d})


@dataclass(frozen=True)
class Experiment:
    name: str
    what: str  # the one thing it changes
    run: Callable[[], dict[str, Any]]
    fix: str  # what to do if it explains the low acceptance


def eagle3_experiments(st: Setup, head: Head, target: LlamaSpec) -> list[Experiment]:
    assert st.head3 is not None
    base = json.loads((st.head3 / "config.json").read_text())
    ids = list(base["eagle_aux_hidden_state_layer_ids"])
    L = target.num_hidden_layers
    out: list[Experiment] = []
    tried: list[list[int]] = [ids]
    for name, new in (("layers +1", [i + 1 for i in ids]), ("layers -1", [i - 1 for i in ids]),
                      ("layers default", safeailab_default_ids(L))):
        if new in tried or not all(0 <= i < L for i in new):
            continue
        tried.append(new)
        d = _head_copy(
            st.head3, st.work / "variants" / name.replace(" ", "_"), cfg={"eagle_aux_hidden_state_layer_ids": new}
        )
        fix = (f"set eagle_aux_hidden_state_layer_ids to {new} in the head's config.json (TensorRT-LLM "
               f"eagle3_layers_to_capture {[i - 1 for i in new]})")
        out.append(
            Experiment(name, f"captured layers {new} instead of {ids}", partial(run_variant, st, head3=d), fix)
        )
    t = load_file(str(st.head3 / "model.safetensors"))
    if "d2t" in t:
        tg = torch.arange(t["d2t"].numel()) + t["d2t"].long()
        V = target.vocab_size
        cands = {"d2t sorted": torch.sort(tg).values,
                 "d2t index +1": torch.cat([tg[1:], tg[-1:]]), "d2t index -1": torch.cat([tg[:1], tg[:-1]]),
                 "d2t value +1": tg + 1, "d2t value -1": tg - 1}
        if "t2d" in t and int(t["t2d"].sum()) == tg.numel():
            cands["d2t from t2d"] = t["t2d"].nonzero().flatten()
        seen = [tg]
        for name, remap in cands.items():
            if any(torch.equal(remap.clamp(0, V - 1), s) for s in seen):
                continue
            seen.append(remap.clamp(0, V - 1))
            d = _d2t_variant(st, name.replace(" ", "_"), remap, V)
            fix = (f"rewrite d2t as the `{name}` remap (target id of draft j = {remap[:4].tolist()}...), or re-export "
                   "the head's d2t from its training run")
            out.append(
                Experiment(name, f"draft -> target map remapped ({name})", partial(run_variant, st, head3=d), fix)
            )
    theta = float(base.get("rope_theta", head.rope_theta))
    if theta != target.rope_theta:
        d = _head_copy(st.head3, st.work / "variants" / "rope", cfg={"rope_theta": target.rope_theta,
                                                                      "rope_parameters": None})
        what = f"the head's RoPE base {target.rope_theta:g} (the target's) instead of {theta:g}"
        out.append(Experiment("rope target base", what, lambda: run_variant(st, head3=d),
                              f"set rope_theta={target.rope_theta:g} in the head's config"))
    return out


def eagle1_experiments(st: Setup, head: Head, target: LlamaSpec) -> list[Experiment]:
    out: list[Experiment] = []
    if head.rope_theta != target.rope_theta:
        d = _ckpt_copy(st.ckpt, st.work / "variants" / "rope_head", {"rotary_base": head.rope_theta})
        what = (
            f"the drafter with the head's RoPE base {head.rope_theta:g} instead of the target's {target.rope_theta:g}"
        )
        fix = (f"the head was trained with RoPE base {head.rope_theta:g}: serve it where the drafter's base comes "
               "from the head's config, or retrain it with the target's")
        out.append(Experiment("rope head base", what, lambda: run_variant(st, ckpt=d), fix))
    return out


def chat_experiment(st: Setup) -> list[Experiment]:
    if st.chat == st.raw:
        return []
    fix = ("serve prompts the way the head was trained: without the chat template (or retrain the head on "
           "chat-formatted data)")
    return [
        Experiment("chat template off", "prompts without the chat template", lambda: run_variant(st, raw=True), fix)
    ]


# ---- setup ----------------------------------------------------------------------------------------------------------
def _prompt_ids(target_dir: Path, prompts: list[str]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    from engines.api import load_tokenizer
    from sources.data import chat_ids

    tok = load_tokenizer(target_dir)
    raw = [tok(p, add_special_tokens=True)["input_ids"] for p in prompts]
    chat = [chat_ids(tok, p) for p in prompts] if chat_template_of(target_dir) is not None else raw
    eos = tok.eos_token_id
    return chat, raw, [int(eos)] if eos is not None else []


def _convert(head: Head, target_dir: Path, target: LlamaSpec, work: Path, depth: int) -> tuple[Path, Path | None]:
    """The pair as the build converts it: an EAGLE-1 checkpoint (Llama-family targets, builders/convert/eagle.py), or
    for EAGLE-3 the converter's family handling (builders/convert/eagle3.py `convert_eagle3`: converted weights for
    the native families, a generic_target config for the others; it refuses what the engine cannot run)."""
    from builders.convert import convert_eagle
    from builders.convert.eagle3 import EAGLE3_DIR, convert_eagle3
    from builders.convert.llama import Provenance

    prov = Provenance(random_head=False, target_source=str(target_dir), head_source=str(head.dir))
    if not head.kind.eagle3:
        ckpt = work / "ckpt_eagle"
        convert_eagle(target_dir, head.dir, ckpt, dtype="float32", max_draft_len=depth, num_eagle_layers=1,
                      max_non_leaves_per_layer=1, provenance=prov)
        return ckpt, None
    ckpt = work / "ckpt"
    ids = head.layer_ids or safeailab_default_ids(target.num_hidden_layers)
    convert_eagle3(target_dir, head.dir, ckpt, dtype="float32", layers_to_capture=ids, provenance=prov)
    return ckpt, ckpt / EAGLE3_DIR


def measure_head(rep: Report, head: Head, target_dir: Path, target: LlamaSpec, *, prompts: list[str] | None,
                 max_new_tokens: int, depth: int, work: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        w = Path(work) if work is not None else Path(tmp)
        w.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            ckpt, head3 = _convert(head, target_dir, target, w, depth)
            chat, raw, eos = _prompt_ids(target_dir, prompts or PROMPTS)
            st = Setup(ckpt, head3, w, depth, max_new_tokens, chat, raw, eos)
            base = run_variant(st)
        except (ModelConfigError, ValueError, OSError, RuntimeError) as e:
            sev: Severity = "info" if rep.problems else "error"  # else the static checks missed what breaks it
            rep.add([Finding("measured", sev, f"measured checks not run: the reference engine cannot load this "
                             f"pair as it is ({str(e)[:300]})", fix="fix the other findings first")])
            return
        rep.measured = {"depth": depth, "max_new_tokens": max_new_tokens, "chat_template": chat != raw,
                        "baseline": base, "healthy_reference": healthy_reference(head.draft_type), "experiments": []}
        _judge_baseline(rep, base, head)
        exps = chat_experiment(st) + (eagle3_experiments(st, head, target) if head3 is not None
                                      else eagle1_experiments(st, head, target))
        explaining = []
        for exp in exps:
            try:
                fig = dict(exp.run(), name=exp.name, what=exp.what)
            except (ModelConfigError, ValueError, RuntimeError) as e:
                rep.measured["experiments"].append({"name": exp.name, "what": exp.what, "error": str(e)[:300]})
                continue
            rep.measured["experiments"].append(fig)
            if _explains(base, fig):
                explaining.append((fig, exp.fix))
            elif fig["tau"] >= base["tau"] + 0.1:
                rep.add([Finding("measured:" + exp.name.split()[0], "info", f"{exp.what} raises tau from "
                                 f"{base['tau']:.3f} to {fig['tau']:.3f}: less than what names a cause (module doc)",
                                 {"baseline": base, "experiment": fig})])
        rep.add(_causes(base, explaining))
        if not explaining and base["p_by_position"][0] < COLLAPSED:
            rep.add([Finding("measured:none", "error", f"none of the {len(exps)} experiments restores acceptance: "
                             "the head's weights do not fit this target as served (trained for another target or "
                             "checkpoint, damaged, or a mismatch no experiment covers)",
                             {"experiments": [e["name"] for e in rep.measured["experiments"]]},
                             "check the head's provenance; retrain it on this target (docs/train-a-head.md)")])
        rep.measured["seconds"] = round(time.perf_counter() - t0, 2)


def healthy_reference(draft_type: str) -> dict[str, Any]:
    """What the shipped demo head of this type measured with this doctor (doctor/healthy.json)."""
    doc = json.loads((Path(__file__).parent / "healthy.json").read_text())
    return dict(doc[draft_type], source=doc["source"])


def _judge_baseline(rep: Report, base: dict[str, Any], head: Head) -> None:
    p1 = base["p_by_position"][0]
    ev = {"tau": base["tau"], "p_by_position": base["p_by_position"], "collapsed_below": COLLAPSED}
    if p1 < COLLAPSED:
        rep.add([Finding("acceptance", "error", f"first-position acceptance {p1:.3f} (tau {base['tau']:.3f}): the "
                         "head drafts almost nothing the target accepts; a trained head of any size accepts well "
                         f"above {COLLAPSED} at its first draft (docs/low-acceptance.md has measured healthy figures)",
                         ev, "see the experiments below and docs/low-acceptance.md")])
    else:
        rep.add([Finding("acceptance", "info", f"tau {base['tau']:.3f}, acceptance per draft position "
                         f"{base['p_by_position']}", ev)])


def _causes(base: dict[str, Any], explaining: list[tuple[dict[str, Any], str]]) -> list[Finding]:
    """The experiment that recovers the most is the cause (error); others that also help are reported as info."""
    out = []
    for rank, (fig, fix) in enumerate(sorted(explaining, key=lambda e: -e[0]["tau"])):
        msg = (f"{fig['what']} raises tau from {base['tau']:.3f} to {fig['tau']:.3f} and first-position acceptance "
               f"from {base['p_by_position'][0]:.3f} to {fig['p_by_position'][0]:.3f}")
        ev = {"baseline": base, "experiment": fig}
        if rank == 0:
            out.append(Finding("measured:" + fig["name"].split()[0], "error", msg + ": this explains the low "
                               "acceptance", ev, fix))
        else:
            out.append(Finding("measured:" + fig["name"].split()[0], "info", msg + " (less than the cause above)", ev))
    return out


def _explains(base: dict[str, Any], fig: dict[str, Any]) -> bool:
    """Collapsed baseline: the change restores real acceptance. Otherwise the texts of the runs can differ (chat
    template off) and a few prompts are noisy, so only a large gain names a cause."""
    p0, p1 = base["p_by_position"][0], fig["p_by_position"][0]
    if p0 < COLLAPSED:
        return p1 >= 2 * COLLAPSED and p1 >= 3 * p0
    return fig["tau"] >= base["tau"] + MIN_TAU_GAIN and p1 >= MIN_P1_RATIO * p0
