"""Refresh threads A/B on this machine (docs/adaptive.md, "Refresh"): one process alternates between 1 and N torch
threads, timing a fine-tune step and the target's features of a sequence, so both see the same load.

    python bench/bench_refresh_threads.py --build BUILD --run BUILD/refresh/<run> [--threads 2] [--rounds 2]

The steps train the served head on the run's held-out samples (their cached features; a scratch copy, nothing is
written); the features are recomputed for 4 held-out sequences. Prints one JSON document: per round and thread
count, seconds per step and per sequence, with the load average before and after.

Inputs:  a refresh run with its feature shards (python adaptive/refresh.py --build BUILD)
Outputs: JSON on stdout
Guide:   docs/adaptive.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="the build directory")
    ap.add_argument("--run", type=Path, required=True, help="a refresh run directory with work/features/")
    ap.add_argument("--threads", type=int, default=2, help="the thread count compared with 1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="fine-tune steps timed per round and thread count")
    args = ap.parse_args()

    import torch

    from builders import layout
    from adaptive import dataset as D
    from adaptive import finetune as F
    from adaptive.publish import served_head
    from adaptive.refresh import load_build
    from training import runner
    from training.compute import resolve_compute
    from training.eagle3_loop import collate3, eagle3_loss, plan3
    from training.eagle3_train import examples3_of
    from training.features import FeatureSpec, load_features, sequence_features
    from training.runner import Sample

    cfg = load_build(args.build)
    rc = cfg.refresh
    served = F.read_served(served_head(args.build, cfg.triton.llm_model))
    c = resolve_compute(F.compute_config(1))  # what the refresh resolves (bf16 where the CPU has it), on the CPU
    model, _, target_dir = F.load_target(layout.hf_target_dir(args.build), c)
    spec = FeatureSpec(tuple(served.layer_ids), F.FEATURE_DTYPE)
    seqs = [D.captured_sequence(x, rc.max_seq_len) for x in D.read_jsonl(args.run / "held_out.jsonl")]
    feats = list(load_features(sorted((args.run / "work" / "features").glob("held_out-*.pt")), spec))
    ex = examples3_of([Sample(i, m, f) for (i, m), f in zip(seqs, feats)], runner.cached_features)
    head, lm_sub = F.load_head(served, model)
    lm_sub = lm_sub.to(c.target_dtype)
    tc = F.train_config(rc, served, target_dir, args.run / "work", args.run / "head", len(ex), 3).train
    opt = torch.optim.AdamW(head.parameters(), lr=1e-5)
    head.train()
    b = rc.batch_size

    def step(i: int) -> None:
        at = (i * b) % max(1, len(ex) - b)
        part = ex[at:at + b]
        plans = plan3([e.loss_mask for e in part], 3, tc.p_loss_positions * len(part), runner.step_generator(tc, i))
        with c.autocast():
            loss, _ = eagle3_loss(head, lm_sub, collate3(part, 3), 3, 0.8, tc, plans, [p.n_ce for p in plans])
        opt.zero_grad()
        loss.float().backward()
        opt.step()

    rows = []
    for rnd in range(args.rounds):
        for th in (1, args.threads):
            torch.set_num_threads(th)
            load = os.getloadavg()[0]
            t = time.monotonic()
            for i in range(args.steps):
                step(i)
            per_step = (time.monotonic() - t) / args.steps
            t = time.monotonic()
            with torch.no_grad(), c.autocast():
                sequence_features(model, [ids for ids, _ in seqs[:4]], spec, 2048)
            rows.append({"round": rnd, "threads": th, "step_s": round(per_step, 2),
                         "feature_s_per_seq": round((time.monotonic() - t) / 4, 2), "load_before": load,
                         "load_after": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"cpu": os.cpu_count(), "bf16": c.bf16, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
