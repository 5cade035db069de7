"""Mutation score of the core modules (mutmut 3), one group of modules at a time with a fast, targeted test selection.

    python devtools/mutation.py [GROUP ...] [--venv /work/venvs/mut] [--jobs 2] [--out build/mutation]
                               [--mutants GLOB ...] [--report-only]

Not part of `make test`. Each group is run in a scratch copy of the tracked files (mutmut writes `mutants/` there),
with `[tool.mutmut]` set to the group's modules and tests, then `mutmut results` is read back. The report
(<out>/report.json and report.md) lists per group: mutants, killed, survived, timeouts, no tests, the score
killed / (all - equivalent), and each survivor with its diff (`mutmut show`), so it can be triaged: a test added,
or recorded in EQUIVALENT below with the reason it cannot change behaviour.

mutmut must be installed in its own venv (`python -m venv V && V/bin/pip install mutmut`) that also sees the
project's dependencies (e.g. a .pth file naming the project venv's site-packages), so nothing is installed into the
project venv.

Inputs:  the tracked files of this checkout; the groups to run (default: all)
Outputs: <out>/report.md and report.json (score, survivors with diffs), <out>/<group>.run.log, <out>/work/<group>/
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The oracle tests on one family, EAGLE-1, without the tp=2 processes: every mutant rebuilds the session's tiny
# models in its forked worker, so each fixture left out saves seconds per mutant.
ORACLE_K = "not tp2 and not llama3-rope and not eagle3"
# The drafter's tests: every tree kind accepted to a controlled rank mix (a wrong child or rank changes the exact
# acceptance), the dynamic drafter against the static one on the same shape (its masks, positions, features), and
# the static drafter against the definition of drafting fed one node at a time (each node's position and cache slot).
ORACLE_DRAFT = ["tests/test_engine_oracle.py::test_oracle_mix_gives_exact_acceptance",
                "tests/test_engine_oracle.py::test_oracle_really_drafts_the_greedy_path",
                "tests/test_engine_oracle.py::test_dynamic_drafts_the_tokens_of_the_static_tree_of_its_shape",
                "tests/test_engine_oracle.py::test_static_drafting_feeds_each_node_at_its_position_after_the_committed_tokens"]

# The profiler's cycle test: the laps' names (drafting levels, verify, walk, kv compaction) in the loop's order.
PROFILE_CYCLE = "tests/test_engine_profile.py::test_cycle_parts_add_up_to_the_cycle"

# group -> (modules to mutate, pytest arguments selecting the tests that exercise them, mutant name globs: the
# functions whose mutants are run, all of the modules' when empty)
GROUPS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "tree": (["engines/tree.py"], ["tests/test_tree_tensors.py"], []),
    "trees": (["core/trees.py"], ["tests/test_trees.py", "tests/test_tree_tensors.py"], []),
    # the drafter's tree growth: the oracle head accepts to full depth, so a wrong token, parent or mask shows; the
    # profiler's cycle test reads the drafting laps' names
    "draft": (
        ["engines/drafting.py"],
        ["tests/test_tree_tensors.py", *ORACLE_DRAFT, PROFILE_CYCLE],
        [],
    ),
    # the target distribution, the token choice and the acceptance rules (engines/step.py, engines/decode.py)
    "sampling": (
        ["engines/step.py", "engines/decode.py"],
        ["tests/test_sampling_units.py"],
        [f"engines.{m}.x_{f}__mutmut_*" for m, f in (("step", "target_probs"), ("step", "draw"), ("decode", "choose"),
                                                     ("step", "greedy_node"), ("step", "sampling_node"))],
    ),
    # the decode loop in full (prefill, target-only and speculative steps, verify, walk, compact, drafter commit);
    # the EAGLE-3 oracle on one family (the captured target layers go through verify and commit_drafter only there)
    # and the profiler's test (the laps' names, the walk's two lm_head paths)
    "decode": (
        ["engines/decode.py", "engines/step.py"],
        [
            "tests/test_engine_oracle.py",
            "tests/test_sampling_units.py",
            "tests/test_engine_spec.py",
            "tests/test_engine_profile.py",
            "-k",
            f"(({ORACLE_K}) or llama-eagle3) and not tp2 and not cuda and not python_share",
        ],
        [],
    ),
    "slots": (
        ["engines/slots.py"],
        ["tests/test_engine_slots.py", "tests/test_engine_spec.py", "tests/test_engine_oracle.py", "-k",
         f"({ORACLE_K}) and not cuda"],
        [],
    ),
    # the converters' field mapping: the functions that write config keys or read the HF configs they derive from
    "convert-config": (
        ["builders/convert/eagle.py", "builders/convert/eagle3.py", "builders/convert/llama.py", "core/hfconfig.py"],
        ["tests/test_convert_fields.py"],
        [
            "builders.convert.eagle.x_eagle_net_config__mutmut_*",
            "builders.convert.eagle3.x_normalized_config__mutmut_*",
            "builders.convert.llama.x_llama_config_json__mutmut_*",
            "builders.convert.llama.x_mapping_json__mutmut_*",
            "core.hfconfig.x_rope_theta_of__mutmut_*",
            "core.hfconfig.x__rope__mutmut_*",
        ],
    ),
    "llmapi-options": (
        ["builders/engine/llmapi.py"],
        ["tests/test_llmapi.py", "tests/test_llmapi_options.py"],
        [
            f"builders.engine.llmapi.x_{f}__mutmut_*"
            for f in ("layers_to_capture", "resolve_input_layer_ids", "speculative_config", "llm_api_options")
        ],
    ),
    # the tensorrt_llm model's request validation; the response builders (ids/perf tensors) need the python backend
    # stub's C++ Tensor type, so the served tests (tests/test_triton_direct.py) are what checks them
    "request-validation": (
        ["triton_repo/models/llm_io.py"],
        ["tests/test_triton_models.py", "-k", "parse_request or stop_request or sampling"],
        [
            f"triton_repo.models.llm_io.x_{f}__mutmut_*"
            for f in ("parse_request", "sampling_from", "check_token_ids", "is_stop_request", "reference_request")
        ],
    ),
}

SELECT_GUARD = ("the internal guard (raise when a kept node lost its parent) cannot fire: the stable sort by score "
                "keeps every kept node's parent (see x__select__mutmut_30)")

_D = "engines.drafting.x_"  # the drafter's tree growth (its keys were triaged as engines/draft.py, same text)

# Survivors triaged as equivalent: mutant name -> why no test can tell it from the original.
EQUIVALENT: dict[str, str] = {
    "builders.convert.eagle.x_eagle_net_config__mutmut_12": "pp=2 for the head's llama_config_json: pp only feeds "
    "`mapping`, which eagle_net_config overwrites with mapping_json(tp, 1) in the same function",
    "builders.convert.eagle.x_eagle_net_config__mutmut_21": "vocab_size not re-set from the target: it is the head's, "
    "and check_head refuses a head whose vocab_size differs from the target's before anything is written",
    "builders.convert.eagle.x_eagle_net_config__mutmut_25": "mapping not re-set: llama_config_json(..., pp=1) already "
    "wrote mapping_json(tp, 1)",
    "builders.engine.llmapi.x_speculative_config__mutmut_22": '"XX; XX".join of capture_problems: that list has at '
    "most one problem (builders/trtllm/rules.py), so the separator never appears",
    # engines/decode.py and engines/step.py (the speculative step); the names are those of the functions' text when
    # they were triaged (the step's moved there unchanged, except speculate, whose parts speculative_step now runs,
    # and commit_drafter, which takes the step's parts as arguments: their survivors are triaged again on the next run)
    "engines.step.x_rows_of__mutmut_3": "Rows.of(..., None): the CPU default device (see DEVICE_ONLY)",
    "engines.decode.x_prefill__mutmut_1": "dev = None: every tensor of the prefill on the default device, the CPU the "
    "tests run on (see DEVICE_ONLY)",
    "engines.decode.x_prefill__mutmut_11": "Rows.of(..., None): as x_rows_of__mutmut_3",
    "engines.decode.x_prefill__mutmut_41": "causal(b, p, None): the mask on the default device (see DEVICE_ONLY)",
    "engines.decode.x_target_step__mutmut_1": "dev = None: as x_prefill__mutmut_1",
    "engines.decode.x_target_step__mutmut_4": "rows_of(slots, None): as x_rows_of__mutmut_3",
    "engines.decode.x_target_step__mutmut_18": "a (B, 2, 1) visibility table: make_step gathers it with a (B, 1, S) "
    "index for the step's one new token, so only its first row (all True, as in (B, 1, 1)) is read",
    "engines.decode.x_target_step__mutmut_36": "argmax(+1) of the 2-D (batch, vocab) logits is argmax(-1)",
    "engines.step.x_walk__mutmut_47": "argmax(+1) of the 2-D (walking, vocab) logits is argmax(-1)",
    "engines.step.x_compact__mutmut_1": "dev = None: as x_prefill__mutmut_1",
    "engines.step.x_commit_drafter__mutmut_1": "dev = None: as x_prefill__mutmut_1",
    "engines.step.x_update_drafter__mutmut_2": "dev = None: as x_prefill__mutmut_1",
    "engines.step.x_update_drafter__mutmut_24": "causal(b, length, None): as x_prefill__mutmut_41",
    "engines.step.x_update_drafter__mutmut_51": "shape[+1] of the 2-D (batch, hidden) drafter output is shape[-1]",
    "engines.step.x_update_drafter__mutmut_57": "shape[+1] of the 2-D (batch, draft vocab) logits is shape[-1]",
    "core.trees.x_preset__mutmut_40": "the topk preset's size guard (k >= 1 and depth >= 1) made always true: with "
    "k = 0 every term 0**d (d >= 1) is 0 and with depth 0 the sum is empty, so the size is 0 either way",
    "core.trees.x_preset__mutmut_50": "`or` in that guard: as mutmut_40, the sum it guards is 0 whenever the guard is "
    "false",
    "engines.slots.x__hit_stop_string__mutmut_6": "a tail of L+9 tokens instead of L+8: the check runs after every "
    "appended token, so a stop string the wider tail finds was already found when its last token arrived",
    _D + "draft_dynamic__mutmut_7": "torch.topk's default dim is -1",
    _D + "draft_dynamic__mutmut_12": "log_softmax(+1) of the 2-D (batch, vocab) logits is log_softmax(-1)",
    _D + "draft_dynamic__mutmut_14": "topk(dim=+1) of the 2-D (batch, vocab) log-probs is topk(dim=-1)",
    _D + "draft_dynamic__mutmut_27": "the depth-1 candidates' parent -2 instead of -1: _select maps every "
    "negative parent to the root (`par_cand >= 0`), nothing else reads it",
    _D + "draft_dynamic__mutmut_60": "the depth-1 frontier's run parent -2 instead of -1: clamped to 0 for "
    "the gather and masked out by `f_run_parent >= 0`, as -1 is",
    _D + "draft_dynamic__mutmut_77": "the visibility table gets max(runs, 2) rows: with runs >= 2 the same "
    "table; with runs 1 the extra row is never gathered (run parents are slots < runs), with 0 it is never read",
    _D + "draft_dynamic__mutmut_158": "torch.topk's default dim is -1",
    "triton_repo.models.llm_io.x_sampling_from__mutmut_29": "temperature=0.0 dropped from the greedy "
    "SamplingParams: 0.0 is its default",
    _D + "draft_dynamic__mutmut_82": "the visibility table gets max(runs, 2) columns: with runs >= 2 the "
    "same table; with runs 1 the extra column (a scratch slot the step does not have) is never set True",
    _D + "draft_dynamic__mutmut_198": "torch.full with an int fill value and no dtype makes int64 "
    "(torch.long) already",
    _D + "draft_dynamic__mutmut_202": "as mutmut_198: dtype dropped, the int fill gives torch.long",
    _D + "draft_dynamic__mutmut_217": "torch.topk's default dim is -1",
    _D + "draft_dynamic__mutmut_218": "topk(dim=+1) of the 2-D (batch, k*k) cumulative scores is dim -1",
    _D + "_select__mutmut_9": "torch.sort's default dim is -1, dim 1 of the 2-D (batch, candidates) scores",
    _D + "_select__mutmut_19": "torch.sort's default dim is -1, dim 1 of the 2-D (batch, n) order",
    _D + "_select__mutmut_24": "torch.full with an int fill value and no dtype makes torch.long already",
    _D + "_select__mutmut_28": "as mutmut_24",
    _D + "_select__mutmut_30": "node_of's fill +1 instead of -1: only unselected candidates keep the fill, "
    "and a kept node's parent is always kept (stable sort, a child never scores above its parent), so it is read "
    "only by the internal guard that raises on a broken selection",
    _D + "_select__mutmut_31": "node_of's fill -2 instead of -1: as mutmut_30, and still < 0 for the guard",
    _D + "_topk_ids__mutmut_7": "torch.topk's default dim is -1",
    _D + "_select__mutmut_79": SELECT_GUARD,
    _D + "_select__mutmut_82": SELECT_GUARD,
    _D + "_select__mutmut_83": SELECT_GUARD,
    _D + "_select__mutmut_84": SELECT_GUARD,
    _D + "_select__mutmut_85": SELECT_GUARD,
    _D + "draft_static__mutmut_41": "state.h is 2-D (batch, hidden): shape[+1] is shape[-1]",
    _D + "draft_static__mutmut_55": "`or` instead of `and`: expand[d] is empty exactly at d = max_depth (a "
    "level above the deepest has a node with children), so both conditions agree",
    _D + "draft_static__mutmut_56": "d <= max_depth: expand[max_depth] is empty, so the extra level is "
    "skipped by the size test",
    _D + "draft_static__mutmut_57": "numel() >= 0: below max_depth expand[d] is never empty (see mutmut_55)",
    "engines.step.x_target_probs__mutmut_6": "top_k == vocab: topk of every token keeps all of them, as skipping "
    "the filter does",
    "engines.step.x_target_probs__mutmut_15": "torch.topk's default dim is -1",
    "engines.step.x_target_probs__mutmut_28": 'float("-INF") == float("-inf") (Python parses it case-blind)',
    "engines.step.x_target_probs__mutmut_43": "torch.sort's default dim is -1",
    "engines.step.x_sampling_node__mutmut_10": "mass >= 0 instead of > 0: with mass 0 every p is 0 and "
    "rand * 0 < p[x] = 0 is false either way",
    "engines.step.x_sampling_node__mutmut_18": "rand * mass <= p[x] instead of <: differs only when the uniform "
    "draw times the mass equals p[x] exactly, i.e. p[x] = 0 and torch.rand returned exactly 0.0 (probability 2^-24 "
    "per draw); no seeded test can reach it",
}

# Classes of equivalent mutants, recognised from the diff: (regex the mutated line must match once the original
# line's text is substituted in, reason).
DEVICE_ONLY = (
    "only a `device=` argument is dropped or set to None: the tensor is made on the default device, which is the "
    "CPU the tests run on, so no CPU test can tell; on CUDA the mismatch raises (tests marked gpu, "
    "tests/test_engine_spec.py::test_cuda_greedy_equals_cpu)"
)


def equivalent_reason(name: str, diff: str) -> str | None:
    if name in EQUIVALENT:
        return EQUIVALENT[name]
    minus = [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    if len(minus) != 1 or len(plus) != 1:
        return None
    line = minus[0]
    for m in re.finditer(r"(, )?device=[\w.]+", line):
        a, b = m.span()
        arg_at = a + (2 if m.group(1) else 0)  # where `device=` starts
        if plus[0] in (line[:arg_at] + "device=None" + line[b:], line[:a] + ", " + line[b:], line[:a] + line[b:]):
            return DEVICE_ONLY
    return None

STATUS = re.compile(r"^\s*(\S+): (\w[\w ]*)$")


def scratch_copy(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True, text=True,
                           capture_output=True).stdout.split()
    for f in files:
        src = REPO / f
        if src.is_file() and not f.startswith(("heads/", "docs/", "docker/")):
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def configure(dst: Path, modules: list[str], tests: list[str]) -> None:
    text = (dst / "pyproject.toml").read_text()
    text += (
        "\n[tool.mutmut]\n"
        'source_paths = ["core/", "engines/", "measure/", "training/", "builders/", "triton_repo/", "clients/"]\n'
        f"only_mutate = {json.dumps(modules)}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]\n'
        'process_isolation = "forkserver"\n'
    )
    (dst / "pyproject.toml").write_text(text)


def run_group(name: str, venv: Path, out: Path, jobs: int, report_only: bool = False,
              only: list[str] | None = None) -> dict:
    modules, tests, names = GROUPS[name]
    names = only or names  # a part of the group (mutant names or globs), e.g. the mutants a first run did not reach
    work = out / "work" / name
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # the mutated copy (mutants/) must be what the tests import
    t0 = time.time()
    returncode = 0
    if not report_only:
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        scratch_copy(work)
        configure(work, modules, tests)
        run = subprocess.run(
            [str(venv / "bin" / "mutmut"), "run", "--max-children", str(jobs), *names],
            cwd=work,
            env=env,
            check=False,
            text=True,
            capture_output=True,
        )
        (out / f"{name}.run.log").write_text(run.stdout + run.stderr)
        returncode = run.returncode
    elif not (work / "mutants").is_dir():
        raise SystemExit(f"{work}/mutants: no earlier run of group {name} to report on")
    res = subprocess.run([str(venv / "bin" / "mutmut"), "results", "--all", "true"], cwd=work, env=env, text=True,
                         capture_output=True, check=True)
    statuses: dict[str, str] = {}
    for line in res.stdout.splitlines():
        m = STATUS.match(line)
        if m and (not names or any(fnmatch.fnmatch(m.group(1), g) for g in names)):
            statuses[m.group(1)] = m.group(2).strip()
    survivors = {}
    for mutant, status in statuses.items():
        if status in ("survived", "no tests"):
            show = subprocess.run([str(venv / "bin" / "mutmut"), "show", mutant], cwd=work, env=env, text=True,
                                  capture_output=True, check=True)
            survivors[mutant] = {
                "status": status,
                "diff": show.stdout,
                "equivalent": equivalent_reason(mutant, show.stdout),
            }
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    equivalent = sum(1 for s in survivors.values() if s["equivalent"])
    killed = counts.get("killed", 0) + counts.get("timeout", 0)  # a timeout is a detected change (mutmut counts it so)
    scored = len(statuses) - equivalent - counts.get("skipped", 0) - counts.get("not checked", 0)
    return {
        "group": name,
        "modules": modules,
        "tests": tests,
        "functions": names,
        "exit_code": returncode,
        "seconds": None if report_only else round(time.time() - t0),
        "mutants": len(statuses),
        "counts": counts,
        "equivalent": equivalent,
        "score": None if scored <= 0 else round(killed / scored, 4),
        "survivors": survivors,
    }


def write_report(out: Path, groups: list[dict], commit: str) -> None:
    (out / "report.json").write_text(json.dumps({"commit": commit, "groups": groups}, indent=2))
    lines = [f"# Mutation report at {commit}", ""]
    lines.append("| group | modules | mutants | killed | survived | no tests | equivalent | score |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for g in groups:
        c = g["counts"]
        lines.append(f"| {g['group']} | {', '.join(g['modules'])} | {g['mutants']} | "
                     f"{c.get('killed', 0) + c.get('timeout', 0)} | {c.get('survived', 0)} | {c.get('no tests', 0)} | "
                     f"{g['equivalent']} | {g['score']} |")
    for g in groups:
        for name, s in g["survivors"].items():
            lines += ["", f"## {name} ({s['status']})", "", s["equivalent"] or "NOT TRIAGED", "", "```diff",
                      s["diff"].strip(), "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="*", help=f"groups to run (default: all): {', '.join(GROUPS)}")
    ap.add_argument("--venv", type=Path, default=Path("/work/venvs/mut"), help="venv with mutmut installed")
    ap.add_argument("--jobs", type=int, default=1, help="mutants tested at once")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "mutation", help="report directory")
    ap.add_argument("--report-only", action="store_true", help="re-read the results of an earlier run in --out")
    ap.add_argument("--mutants", nargs="+", metavar="GLOB",
                    help="run (or report) only these mutants of the group, e.g. 'engines.drafting.x__run__mutmut_*'")
    args = ap.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {unknown}; choose from {', '.join(GROUPS)}")
    if args.mutants and len(args.groups) != 1:
        ap.error(f"--mutants names mutants of one group; got groups {args.groups or 'all'}: name exactly one group")
    if not (args.venv / "bin" / "mutmut").is_file():
        ap.error(f"{args.venv}/bin/mutmut not found: python -m venv {args.venv} && {args.venv}/bin/pip install mutmut")
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True, capture_output=True,
                            check=True).stdout.strip()
    done = []
    for g in args.groups or list(GROUPS):
        print(f"[mutation] {g}: {', '.join(GROUPS[g][0])} ...", flush=True)
        r = run_group(g, args.venv, args.out, args.jobs, args.report_only, args.mutants)
        done.append(r)
        print(
            f"[mutation] {g}: {r['mutants']} mutants {r['counts']} score {r['score']} in {r['seconds']} s", flush=True
        )
        write_report(args.out, done, commit)
    print(f"[mutation] report: {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
