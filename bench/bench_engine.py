"""Engine benchmark: SmolLM2-135M-Instruct, MT-bench first turns, greedy, batch 1, every method in one run.

    python bench/bench_engine.py [--questions 20] [--max-new-tokens 128] [--eagle-head heads/smollm2-eagle]
        [--eagle3-head heads/smollm2-eagle3] [--trees demo,tuned,chain-3] [--dtypes float32,bfloat16]
        [--draft-vocab 8192] [--device cpu] [--threads 1] [--json FILE] [--forward-ts 1,2,4,8,16] [--forward-only]

1. Forward costs: one target forward with T new tokens after a 200-token context (KV cache, logits at the last
   position) for HF (transformers, no compile) and the engine in each dtype, T = 1..16, interleaved, with the
   machine's roofs measured in the same run (measure/costs.py): weights read / memory bandwidth, FLOPs / GEMM rate.
2. Generation: HF generate, HF prompt lookup, engine target-only and engine EAGLE (each head x tree x dtype, and the
   EAGLE-1/2 head drafting over the --draft-vocab most frequent tokens), prompt by prompt, every method on a prompt
   before the next prompt (a change of load reaches every method alike). Ratios, tau, identical outputs.
3. Agreement: EAGLE vs the engine's own target-only decoding and vs HF in the same dtype, per prompt (first
   divergence), and for each divergence the logit gap of the two tokens in float32 and in the engine (lossless.py).
4. Cycle breakdown: the parts of the speculative cycle (draft levels, verification, walk, KV compaction, output,
   drafter update) over the whole run, and the share of wall time outside torch operators.
Heads are converted on the fly from the directories given, so the script reruns unchanged on a retrained head.
Absolute speeds depend on the machine and its load: compare ratios within one run.

Inputs:  MT-bench questions; the demo target; the heads --eagle-head and --eagle3-head (converted on the fly)
Outputs: the figures on stdout; --json the results
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tqdm import tqdm

from core.laps import Laps
from engines.api import GenerationRequest, ReferenceEngine, RequestStats, SamplingParams, aggregate_stats
from engines.linear import layout_for
from measure.costs import Machine, bounds, forward_fns, interleaved_ms, measure_machine, profile_cycles
from sources.data import chat_ids, mtbench_questions
from measure.lossless import explain, first_divergence
from measure.profile import python_share

TS = [1, 2, 4, 8, 16]
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


# ---- engines from head directories ----------------------------------------------------------------------------------


def resolve_tree(name: str) -> Any:
    """demo = configs/demo.yaml's tree; tuned = configs/trees/smollm2-eagle-tuned-14.yaml; file:PATH = a tree
    snippet (tree.choices); anything else = a core/trees.py preset (chain-3, topk-2-3, ...)."""
    import yaml

    from builders.config import load_config
    from core.trees import DraftTree, preset

    if name == "demo":
        return load_config(REPO / "configs" / "demo.yaml").static_tree()
    path = REPO / "configs" / "trees" / "smollm2-eagle-tuned-14.yaml" if name == "tuned" else None
    if name.startswith("file:"):
        path = Path(name[5:])
    if path is not None:
        return DraftTree.from_choices(yaml.safe_load(path.read_text())["tree"]["choices"])
    return DraftTree.from_choices(preset(name))


def load_engines(
    hf_dir: Path, work: Path, args: argparse.Namespace, tree: Any
) -> dict[tuple[str, str], ReferenceEngine]:
    """{(head kind, dtype): engine} with the first tree; other trees share these weights (with_tree)."""
    from builders.convert import convert_eagle, convert_eagle3

    out: dict[tuple[str, str], ReferenceEngine] = {}
    convert_eagle(hf_dir, args.eagle_head, work / "eagle", dtype="float32", max_draft_len=tree.size,
                  num_eagle_layers=tree.depth, max_non_leaves_per_layer=tree.max_non_leaves_per_layer)
    convert_eagle3(hf_dir, args.eagle3_head, work / "eagle3", dtype="float32", layers_to_capture=None)
    for dt in args.dtypes:  # float32 checkpoints, loaded in each dtype (a 16-bit build stores the same rounded values)
        out[("eagle", dt)] = ReferenceEngine.from_checkpoint(work / "eagle", tree=tree, dtype=dt, device=args.device)
        out[("eagle3", dt)] = ReferenceEngine.from_checkpoint(work / "eagle3", tree=tree, dtype=dt, device=args.device,
                                                              eagle3_head_dir=work / "eagle3" / "eagle3")
    return out


def draft_vocab_ids(tokenizer_dir: Path, size: int, work: Path) -> list[int]:
    from measure.draft_vocab import read_draft_vocab

    f = work / "draft_vocab.json"
    argv = [sys.executable, "-m", "measure.draft_vocab", "--tokenizer", str(tokenizer_dir), "--size", str(size),
            "--out", str(f)]
    subprocess.run(argv, check=True, cwd=REPO)
    return read_draft_vocab(f)


# ---- methods --------------------------------------------------------------------------------------------------------


@dataclass
class Method:
    """One decoding method and its figures, per prompt (so that a run can be saved, resumed and cut short)."""

    name: str
    dtype: str
    kind: str  # "hf" | "target" | "eagle"
    run: Callable[[list[int], int], tuple[list[int], RequestStats | None, Laps | None]]
    engine: ReferenceEngine | None = None
    seconds: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    stats: list[RequestStats] = field(default_factory=list)  # engine methods
    parts: list[dict[str, float]] = field(default_factory=list)  # speculative cycle parts (seconds), EAGLE
    cycles: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tps(self) -> float:
        return self.tokens / sum(self.seconds)

    def part_totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.parts:
            for k, v in p.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def state(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "outputs": self.outputs, "stats": [asdict(st) for st in self.stats],
                "parts": self.parts, "cycles": self.cycles}

    def restore(self, d: dict[str, Any], prompts: int) -> None:
        """The figures of the first `prompts` prompts of a saved state."""
        self.seconds, self.outputs = d["seconds"][:prompts], d["outputs"][:prompts]
        self.parts, self.cycles = d["parts"][:prompts], d["cycles"][:prompts]
        self.stats = [RequestStats(**st) for st in d["stats"][:prompts]]

    def add(self, fn_out: tuple[list[int], RequestStats | None, Laps | None], seconds: float) -> None:
        out, st, laps = fn_out
        self.seconds.append(seconds)
        self.outputs.append(out)
        if st is not None:
            self.stats.append(st)
        if laps is not None:
            self.cycles.append(laps.steps)
            self.parts.append(dict(laps.parts))


def engine_run(engine: ReferenceEngine, eos: list[int], speculative: bool) -> Callable[..., Any]:
    """Timed generation with the cycle's parts. The laps do not synchronize, so they cost the timed run nothing; on
    CPU their parts are exact, on CUDA (asynchronous) the cycle table replaces them by a synchronized pass."""
    def run(ids: list[int], n: int) -> tuple[list[int], RequestStats | None, Laps | None]:
        session = engine.session(capacity=1, max_len=len(ids) + n, speculative=speculative)
        prof = profile_cycles(session, [GenerationRequest(ids, n, SamplingParams(), eos)], Laps())
        [r] = prof.results
        return r.output_ids, r.stats, prof.laps

    return run


def hf_run(model: Any, eos: list[int], **kw: Any) -> Callable[..., Any]:
    def run(ids: list[int], n: int) -> tuple[list[int], RequestStats | None, Laps | None]:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=n, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, eos_token_id=eos, pad_token_id=eos[0], **kw)
        return out[0, len(ids):].tolist(), None, None

    return run


def hf_forward_fns(model: Any, ts: list[int], context: int = 200) -> dict[int, Callable[[], None]]:
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(
            torch.randint(0, model.config.vocab_size, (1, context), generator=g).to(model.device), past_key_values=cache
        )

    def make(t: int) -> Callable[[], None]:
        tokens = torch.randint(0, model.config.vocab_size, (1, t), generator=g).to(model.device)

        @torch.inference_mode()
        def one() -> None:
            model(tokens, past_key_values=cache, logits_to_keep=1)
            cache.crop(-t)  # rewind: the next call writes the same positions

        return one

    return {t: make(t) for t in ts}


# ---- report ---------------------------------------------------------------------------------------------------------


def forward_costs(engines: dict, hfs: dict, args: argparse.Namespace) -> dict[str, Any]:
    dev, ts = torch.device(args.device), args.forward_ts
    # The compute roof of the 16-bit rows uses the rate of the dtype their products compute in: float32 for the
    # float32-kernel layout and for the AVX2 kernel's bf16 panels (widened to float32 in registers).
    kinds = {dt: getattr(torch, dt) if layout_for(dev, getattr(torch, dt)) == "as stored" else torch.float32
             for dt in args.dtypes}
    m0 = {k: measure_machine(dev, k) for k in set(kinds.values())}
    fns: dict[tuple[str, int], Callable[[], None]] = {}
    for dt in args.dtypes:
        for t, fn in hf_forward_fns(hfs[dt], ts).items():
            fns[(f"HF {SHORT[dt]}", t)] = fn
        rt = engines[("eagle3", dt)]._rt
        for t, fn in forward_fns(rt.target, rt.dtype, dev, ts).items():
            fns[(f"engine {SHORT[dt]}", t)] = fn
    ms = interleaved_ms(fns, repeats=7)
    m1 = {k: measure_machine(dev, k) for k in m0}
    # Best of before/after: the strictest roof.
    best = {k: Machine(*(max(getattr(m0[k], f), getattr(m1[k], f)) for f in Machine.__dataclass_fields__)) for k in m0}
    b32 = next(iter(best.values()))  # bandwidths do not depend on the GEMM dtype
    print(f"\n1. Forward cost: T new tokens after a 200-token context, one sequence, logits at the last position "
          f"(median of 7, all rows interleaved). Machine (best of before/after): copy {b32.copy_bytes_per_s / 1e9:.1f} "
          f"GB/s (read+write), read {b32.read_bytes_per_s / 1e9:.1f} GB/s, GEMM "
          + ", ".join(f"{str(k).removeprefix('torch.')} {m.gemm_flops / 1e9:.1f} GFLOP/s" for k, m in best.items()))
    print(f"  {'':<13}" + "".join(f"{'T=' + str(t):>16}" for t in ts))
    rows: dict[str, Any] = {}
    for name in dict.fromkeys(k[0] for k in fns):
        base = ms[(name, 1)]
        print(f"  {name:<13}" + "".join(f"{ms[(name, t)]:>9.1f} {ms[(name, t)] / base:>5.2f}x" for t in ts))
        rows[name] = {t: ms[(name, t)] for t in ts}
    for dt in args.dtypes:
        target = engines[("eagle3", dt)]._rt.target
        bs = {t: bounds(target, t, best[kinds[dt]]) for t in ts}
        name = f"engine {SHORT[dt]}"
        print(f"  roof {SHORT[dt]:<8}" + "".join(f"{1e3 * bs[t].roof_s:>9.1f} {'':>6}" for t in ts)
              + f"  (memory {1e3 * bs[1].memory_copy_s:.1f} ms at copy / {1e3 * bs[1].memory_read_s:.1f} ms at read "
              f"bandwidth; compute {', '.join(f'{1e3 * bs[t].compute_s:.1f}' for t in ts)} ms)")
        print(f"  {name} / roof" + "".join(f"{rows[name][t] / (1e3 * bs[t].roof_s):>15.2f}x" for t in ts))
        rows[f"roof {SHORT[dt]}"] = {t: 1e3 * bs[t].roof_s for t in ts}
    for dt in args.dtypes:
        e, h = rows[f"engine {SHORT[dt]}"], rows[f"HF {SHORT[dt]}"]
        goals = "".join(f", T={t} {e[t] / e[1]:.2f}x (target <= {g})" for t, g in ((8, 1.25), (16, 1.5)) if t in e)
        print(f"  {SHORT[dt]}: engine one-token step {e[1]:.1f} ms = {e[1] / h[1]:.2f}x HF's {h[1]:.1f} ms "
              f"(target <= 1.0){goals} a one-token step")
    return {
        "ms": {k: {str(t): v for t, v in r.items()} for k, r in rows.items()},
        "machine": {str(k): m.__dict__ for k, m in best.items()},
        "layouts": {dt: layout_for(dev, getattr(torch, dt)) for dt in args.dtypes},
    }


def generation_table(methods: list[Method], args: argparse.Namespace) -> None:
    by = {m.name: m for m in methods}
    hf32 = by["HF generate fp32"]
    print(f"\n2. Generation: {len(hf32.outputs)} MT-bench questions, {args.max_new_tokens} new tokens, greedy, batch 1")
    print(f"  {'method':<44}{'tok/s':>7}{'vs HF fp32':>11}{'vs HF same':>11}{'vs target':>10}{'tau':>7}"
          f"{'same as HF':>11}{'same as target':>15}")
    for m in methods:
        hf, tgt = by[f"HF generate {SHORT[m.dtype]}"], by.get(f"engine target-only {SHORT[m.dtype]}")
        tau = f"{aggregate_stats(m.stats).tau:.3f}" if m.kind == "eagle" else ""
        vs_t = f"{m.tps / tgt.tps:.2f}x" if tgt and m.kind != "hf" else ""
        same_t = f"{identical(m, tgt)}/{len(m.outputs)}" if tgt and m.kind == "eagle" else ""
        print(f"  {m.name:<44}{m.tps:>7.1f}{m.tps / hf32.tps:>10.2f}x{m.tps / hf.tps:>10.2f}x{vs_t:>10}{tau:>7}"
              f"{identical(m, hf):>8}/{len(m.outputs):<2}{same_t:>15}")


def identical(a: Method, b: Method | None) -> int:
    return 0 if b is None else sum(x == y for x, y in zip(a.outputs, b.outputs))


def agreement(methods: list[Method], prompts: list[list[int]], oracle: ReferenceEngine, tok: Any) -> dict[str, Any]:
    """Per prompt: first divergence of every engine method from HF and from target-only in its dtype; each
    16-bit divergence (EAGLE rows from target-only, target-only rows from HF) explained by the two tokens' logit
    gap in float32 and in the engine."""
    by = {m.name: m for m in methods}
    print("\n3. Agreement (per prompt: index of the first differing token, '.' = identical)")
    report: dict[str, Any] = {}
    for m in methods:
        if m.kind == "hf":
            continue
        refs = [by[f"HF generate {SHORT[m.dtype]}"]] + (
            [by[f"engine target-only {SHORT[m.dtype]}"]] if m.kind == "eagle" else []
        )
        for ref in refs:
            divs = [first_divergence(a, b) for a, b in zip(m.outputs, ref.outputs)]
            cells = " ".join("." if d is None else str(d) for d in divs)
            print(f"  {m.name:<44} vs {ref.name:<26} {sum(d is None for d in divs):>2}/{len(divs)}: {cells}")
            report[f"{m.name} vs {ref.name}"] = divs
        if m.dtype != "float32":
            # 16-bit divergences, from target-only decoding (EAGLE rows) or from HF (target-only rows): the two
            # tokens' logit gap in float32 and in the engine after the common prefix.
            ref = by[f"engine target-only {SHORT[m.dtype]}"] if m.kind == "eagle" else refs[0]
            assert m.engine is not None
            for q, (a, b) in enumerate(zip(ref.outputs, m.outputs)):
                d = explain(oracle, m.engine, prompts[q], a, b)
                if d is not None:
                    print(f"    q{q} token {d.index}: {ref.name} chose {tok.decode([d.token_a])!r}, this row "
                          f"{tok.decode([d.token_b])!r}; logit gap float32 {d.gap_fp32:+.3f}, {SHORT[m.dtype]} engine "
                          f"{d.gap_engine:+.3f} (rounding moved it {d.rounding:.3f})")
                    report.setdefault(f"{m.name} explained", []).append(d.__dict__ | {"question": q})
    return report


def cycle_table(methods: list[Method], prompts: list[list[int]], eos: list[int]) -> dict[str, Any]:
    print("\n4. Speculative cycle, ms per cycle over the whole run (parts add up to the cycle); 'outside ops' = share "
          "of a 32-token generation's wall time outside torch operators (torch.profiler)")
    out: dict[str, Any] = {}
    for m in methods:
        if m.kind != "eagle" or not sum(m.cycles):
            continue
        assert m.engine is not None
        if m.engine.device != "cpu":  # a separate pass with synchronizing laps over a few prompts
            m.parts, m.cycles = [], []
            for ids in prompts[:3]:
                session = m.engine.session(capacity=1, max_len=len(ids) + 128)
                prof = profile_cycles(session, [GenerationRequest(ids, 128, SamplingParams(), eos)])
                m.parts.append(dict(prof.laps.parts))
                m.cycles.append(prof.laps.steps)
        per = {k: 1e3 * v / sum(m.cycles) for k, v in m.part_totals().items()}
        req = GenerationRequest(prompts[0], 32, SamplingParams(), eos)
        wall, in_ops = python_share(functools.partial(m.engine.generate, [req]))
        draft = sum(v for k, v in per.items() if k.startswith("draft"))
        cells = "  ".join(f"{k} {v:.1f}" for k, v in per.items())
        print(f"  {m.name:<44} cycle {sum(per.values()):6.1f} = drafting {draft:.1f} + {cells}; outside ops "
              f"{1 - in_ops / wall:.0%}")
        out[m.name] = {"parts_ms": per, "cycles": sum(m.cycles), "outside_ops": 1 - in_ops / wall}
    return out


# ---- main -----------------------------------------------------------------------------------------------------------


def build_methods(args: argparse.Namespace, hfs: dict, engines: dict, trees: list[tuple[str, Any]],
                  vocab: list[int] | None, eos: list[int]) -> list[Method]:
    """HF generate per dtype, HF prompt lookup (float32), engine target-only per dtype, then EAGLE per dtype x head x
    tree (+ the restricted draft vocabulary for the EAGLE-1/2 head)."""
    ms: list[Method] = []
    for dt in args.dtypes:
        ms.append(Method(f"HF generate {SHORT[dt]}", dt, "hf", hf_run(hfs[dt], eos)))
    ms.append(
        Method("HF prompt lookup fp32", "float32", "hf", hf_run(hfs["float32"], eos, prompt_lookup_num_tokens=10))
    )
    for dt in args.dtypes:
        e = engines[("eagle3", dt)]
        ms.append(Method(f"engine target-only {SHORT[dt]}", dt, "target", engine_run(e, eos, False), e))
    for dt in args.dtypes:
        for head, label in (("eagle", "EAGLE-1"), ("eagle3", "EAGLE-3")):
            for tname, tree in trees:
                e = engines[(head, dt)].with_tree(tree)
                ms.append(Method(f"EAGLE {label} {tname} {SHORT[dt]}", dt, "eagle", engine_run(e, eos, True), e))
                if head == "eagle" and vocab is not None and dt in args.draft_vocab_dtypes:
                    ev = e.with_draft_vocab(vocab)
                    ms.append(Method(f"EAGLE {label} {tname} vocab {len(vocab)} {SHORT[dt]}", dt, "eagle",
                                     engine_run(ev, eos, True), ev))
    return ms


def generate_all(methods: list[Method], prompts: list[list[int]], n: int, state: Path | None, key: dict) -> None:
    """Every method on a prompt before the next prompt, after an untimed warm-up of each (lazy initialisation).
    With `state`, the figures are saved after every prompt; a rerun with the same settings resumes after the last
    prompt saved, and a rerun with fewer --questions than saved reports on those without generating."""
    done = 0
    if state is not None and state.is_file():
        doc = json.loads(state.read_text())
        if doc["key"] == key and set(doc["methods"]) == {m.name for m in methods}:
            done = min(doc["done"], len(prompts))
            for m in methods:
                m.restore(doc["methods"][m.name], done)
            print(f"{done} prompts from {state}")
    if done == len(prompts):
        return
    for m in methods:
        m.run(prompts[0][:8], 4)
    for q in tqdm(range(done, len(prompts)), desc="prompts (all methods each)", initial=done, total=len(prompts)):
        for m in methods:
            t0 = time.perf_counter()
            out = m.run(prompts[q], n)
            m.add(out, time.perf_counter() - t0)
        if state is not None:
            tmp = state.with_suffix(".tmp")
            tmp.write_text(json.dumps({"key": key, "done": q + 1, "methods": {m.name: m.state() for m in methods}}))
            tmp.replace(state)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--eagle-head", type=Path, default=REPO / "heads" / "smollm2-eagle", help="EAGLE-1/2 head dir")
    ap.add_argument("--eagle3-head", type=Path, default=REPO / "heads" / "smollm2-eagle3", help="EAGLE-3 head dir")
    ap.add_argument("--trees", default="demo,tuned,chain-3", help="comma-separated: demo, tuned, a preset, file:PATH")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated; float32 must be one of them")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="EAGLE-1/2 rows drafting over the N most frequent "
                    "ShareGPT answer tokens (0 = none)")
    ap.add_argument("--draft-vocab-dtypes", default="bfloat16", help="dtypes that get those rows")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is the most stable on a shared machine)"
    )
    ap.add_argument("--json", type=Path, help="write every figure here (and resume from FILE.state.json, saved after "
                    "every prompt, when rerun with the same settings)")
    ap.add_argument("--forward-ts", type=lambda v: [int(x) for x in v.split(",")], default=TS,
                    help="new-token counts T of section 1 (default 1,2,4,8,16; a GPU run adds 64)")
    ap.add_argument("--forward-only", action="store_true", help="only section 1 (forward costs and roofs: minutes)")
    args = ap.parse_args()
    args.dtypes, args.draft_vocab_dtypes = args.dtypes.split(","), args.draft_vocab_dtypes.split(",")
    if "float32" not in args.dtypes:
        ap.error("--dtypes must include float32 (the exact oracle and the HF baseline)")
    if 1 not in args.forward_ts or min(args.forward_ts) < 1:
        ap.error(f"--forward-ts {args.forward_ts}: positive counts including 1 (each row is a ratio to T=1)")
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from sources.targets import smollm2_dir

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    load0, t_start = os.getloadavg(), time.time()
    hf_dir = smollm2_dir()
    trees = [(name, resolve_tree(name)) for name in args.trees.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        engines = load_engines(hf_dir, work, args, trees[0][1])
        tok = engines[("eagle3", "float32")].tokenizer
        eos = [int(tok.eos_token_id)]
        use_vocab = args.draft_vocab and not args.forward_only
        vocab = draft_vocab_ids(work / "eagle" / "tokenizer", args.draft_vocab, work) if use_vocab else None
        hfs = {dt: AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=getattr(torch, dt)).to(args.device).eval()
               for dt in args.dtypes}
        print(f"SmolLM2-135M-Instruct on {args.device} ({torch.backends.cpu.get_cpu_capability()}), torch threads "
              f"{torch.get_num_threads()}, commit {commit}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
              f"{load0[0]:.1f} at the start; heads {args.eagle_head}, {args.eagle3_head}; weight layouts "
              + ", ".join(f"{dt}: {layout_for(torch.device(args.device), getattr(torch, dt))}" for dt in args.dtypes))
        costs = forward_costs(engines, hfs, args)
        methods: list[Method] = []
        agree: dict[str, Any] = {}
        cycles: dict[str, Any] = {}
        if not args.forward_only:
            prompts = [chat_ids(tok, q.turns[0]) for q in mtbench_questions(args.questions)]
            methods = build_methods(args, hfs, engines, trees, vocab, eos)
            key = {k: str(v) for k, v in vars(args).items() if k not in ("json", "forward_only", "questions")}
            state = args.json.with_suffix(".state.json") if args.json else None
            generate_all(methods, prompts, args.max_new_tokens, state, key)
            generation_table(methods, args)
            agree = agreement(methods, prompts, engines[("eagle3", "float32")], tok)
            cycles = cycle_table(methods, prompts, eos)
    load1 = os.getloadavg()
    print(f"\nload average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {time.time() - t_start:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "commit": commit, "date": time.strftime("%Y-%m-%d"), "load": [load0[0], load1[0]], "args": vars(args),
            "forward": costs, "agreement": agree, "cycles": cycles,
            "methods": {m.name: {"tok_s": m.tps, "tokens": m.tokens, "seconds": sum(m.seconds),
                                 "tau": aggregate_stats(m.stats).tau if m.stats else None} for m in methods},
        }, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
