"""The adaptive loop without a server (docs/adaptive.md): the capture store's bounds, privacy and crash safety, the
opt-out, the config rules, the refresh split, and the gate refusing a worse head (python -m doctor gate)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from adaptive.dataset import Captured, RefreshInputError, prompt_groups, split
from triton_repo.models import capture as C

ROOT = Path(__file__).resolve().parent.parent


def settings(**kw: Any) -> C.Settings:
    base = dict(dir="store", max_bytes=1 << 20, sample_rate=1.0, segment_records=4, segment_seconds=60.0,
                queue_size=64)
    return C.Settings(**{**base, **kw})


def rec(i: int, n_out: int = 8) -> dict[str, Any]:
    return {"id": f"r{i}", "prompt_ids": [1, 2, 3, i], "output_ids": list(range(n_out))}


def test_segments_are_sealed_whole_private_and_bounded(tmp_path: Path) -> None:
    written, dropped = [0], [0]
    s = settings(max_bytes=1 << 16)
    w = C.Writer(tmp_path / "store", s, lambda n: written.__setitem__(0, written[0] + n),
                 lambda n: dropped.__setitem__(0, dropped[0] + n))
    for i in range(10):
        assert w.offer(rec(i))
    deadline = time.monotonic() + 10
    while len(C.sealed_segments(tmp_path / "store")) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(C.sealed_segments(tmp_path / "store")) == 2  # 4 + 4 sealed, 2 in the open segment
    assert [r["id"] for r in C.read_records(tmp_path / "store")] == [f"r{i}" for i in range(8)]
    w.close()
    assert [r["id"] for r in C.read_records(tmp_path / "store")] == [f"r{i}" for i in range(10)]
    assert written == [10] and dropped == [0]
    d = tmp_path / "store"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in d.iterdir()} == {0o600}
    # the size bound: a store over max_bytes loses its oldest segments first
    size = C.sealed_segments(d)[0].stat().st_size
    w = C.Writer(d, settings(max_bytes=2 * size + size // 2, segment_records=4))
    for i in range(10, 22):
        w.offer(rec(i))
    w.close()
    ids = [r["id"] for r in C.read_records(d)]
    assert C.store_bytes(d) <= 2 * size + size // 2 and ids == [f"r{i}" for i in range(14, 22)]
    n = len(list(d.iterdir()))
    assert C.purge(d) == n == 2 and not list(d.iterdir()) and d.is_dir()


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Path) -> None:
    """The writer is stuck (a disk that hangs): offers return at once, the overflow is counted, never waited on."""
    gate = threading.Event()
    dropped = [0]

    class Stuck(C.Writer):
        def _write(self, r: dict[str, Any]) -> None:
            gate.wait(10)
            super()._write(r)

    w = Stuck(tmp_path / "s", settings(queue_size=2), on_dropped=lambda n: dropped.__setitem__(0, dropped[0] + n))
    t0 = time.monotonic()
    results = [w.offer(rec(i)) for i in range(50)]
    assert time.monotonic() - t0 < 0.5
    assert results.count(False) == dropped[0] >= 47
    gate.set()
    w.close()
    assert len(list(C.read_records(tmp_path / "s"))) == 50 - dropped[0]


CRASH = """
import os, sys, time
sys.path.insert(0, {root!r})
from triton_repo.models import capture as C
s = C.Settings(dir="x", max_bytes=1 << 20, sample_rate=1.0, segment_records=5, segment_seconds=600.0, queue_size=64)
w = C.Writer(C.Path({store!r}), s)
for i in range(13):
    w.offer({{"id": f"c{{i}}", "prompt_ids": [1], "output_ids": [1, 2]}})
deadline = time.monotonic() + 10
while len(C.sealed_segments(C.Path({store!r}))) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.2)
os._exit(9)  # a crash: no close(), no seal
"""


def test_a_crash_loses_at_most_the_open_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", CRASH.format(root=str(ROOT), store=str(store))], timeout=60)
    assert proc.returncode == 9
    assert [r["id"] for r in C.read_records(store)] == [f"c{i}" for i in range(10)]
    assert [p.name.startswith(C.OPEN_PREFIX) for p in store.iterdir()].count(True) == 1  # the lost tail, unread
    monkeypatch.setattr(C, "OPEN_GRACE_S", 0.0)  # the dead writer's segment is seconds old, not minutes
    C.Writer(store, settings()).close()  # a new writer removes what the dead one left open (its lock is gone)
    assert not [p for p in store.iterdir() if p.name.startswith(C.OPEN_PREFIX)]
    assert len(list(C.read_records(store))) == 10


@pytest.mark.parametrize(("params", "out"), [
    (None, False), ("", False), ("{}", False), ('{"eagle_capture": false}', True), ('{"eagle_capture": "false"}', True),
    ('{"eagle_capture": true}', False), ('{"other": false}', False),
    ("not json", False),
])
def test_opt_out_parameter(params: str | None, out: bool) -> None:
    assert C.opted_out(params) is out


def test_hook_off_without_settings_and_sampled_with_them(tmp_path: Path) -> None:
    class Req:
        def __init__(self, p: str) -> None:
            self.p = p

        def parameters(self) -> str:
            return self.p

    off = C.Hook(None, None, tmp_path, {})
    assert off.writer is None and not off.wanted(Req("{}"))

    class Family:
        COUNTER = 0

        def __init__(self, *a: Any) -> None:
            pass

        def Metric(self, labels: dict[str, str]) -> Any:
            return type("M", (), {"increment": lambda self, n: None})()

    pb = type("pb", (), {"MetricFamily": Family})
    half = C.Hook(pb, settings(sample_rate=0.5), tmp_path, {"version": "3"})
    picks = [half.wanted(Req("{}")) for _ in range(2000)]
    assert 800 < sum(picks) < 1200 and not half.wanted(Req('{"eagle_capture": false}'))
    from core.types import GenerationRequest, GenerationResult, RequestStats, SamplingParams

    dropped: list[int] = []
    assert half.writer is not None
    half.writer.on_dropped = dropped.append
    req = GenerationRequest([1, 2], 4, SamplingParams(), [])  # seed None: recorded as null
    half.finished(True, req, GenerationResult([5, 6], "length", RequestStats(2, 1, 0, 3, [0])))
    half.finished(True, req, object())  # a record it cannot make: dropped and counted, never raised into serving
    half.close()
    [r] = C.read_records(tmp_path / "store")
    assert r["sampling"]["seed"] is None and r["output_ids"] == [5, 6] and r["model_version"] == "3"
    assert r["acceptance"] == {"target_forwards": 1, "accepted_draft_tokens": 0, "draft_tokens": 3,
                               "acceptance_by_depth": [0]} and dropped == [1]


def _prompt(i: int, n: int = 12) -> list[int]:
    return [1000 + (i * 37 + j * 11) % 997 for j in range(n)]  # distinct 4-grams for distinct i


def test_split_is_by_content_deterministic_and_disjoint() -> None:
    recs = [Captured(f"id{i}", _prompt(i), [2, 3], True, {}) for i in range(50)]
    train, held = split(recs, 0.2, seed=0)
    assert len(held) == 10 and len(train) == 40 and not {c.id for c in train} & {c.id for c in held}
    assert split(recs, 0.2, seed=0) == (train, held) and split(recs, 0.2, seed=1)[1] != held
    assert len(split(recs[:4], 0.01, 0)[1]) == 1 and len(split(recs[:4], 0.99, 0)[0]) == 1


@pytest.mark.parametrize("variant", [
    lambda p: list(p),  # the same prompt again
    lambda p: p[:-1] + [7],  # its last token changed
    lambda p: [5] + p,  # a token in front
    lambda p: p[:6] + [8] + p[6:],  # a token inserted in the middle
])
def test_near_duplicate_prompts_stay_on_one_side(variant: Any) -> None:
    """A prompt and its near-copies are one group: never both trained on and held out, whatever the seed."""
    base = _prompt(0, 24)
    recs = [Captured(f"d{i}", variant(base) if i % 2 else base, [2, 3], True, {}) for i in range(20)]
    recs += [Captured(f"o{i}", _prompt(i + 1), [2, 3], True, {}) for i in range(20)]
    assert len(prompt_groups(recs)) == 21
    for seed in range(6):
        train, held = split(recs, 0.3, seed)
        sides = {"train" if c in train else "held" for c in recs if c.id.startswith("d") and c in train + held}
        assert len(sides) == 1, (seed, sides)


@pytest.mark.parametrize(("copies", "others", "share"), [(90, 50, 0.1), (30, 10, 0.2), (10, 40, 0.05), (5, 5, 0.5)])
def test_one_prompt_is_capped_to_its_share_of_the_training_data(copies: int, others: int, share: float) -> None:
    recs = [Captured(f"c{i}", _prompt(0), [2, 3], True, {}) for i in range(copies)]
    recs += [Captured(f"o{i}", _prompt(i + 1), [2, 3], True, {}) for i in range(others)]
    for seed in range(4):
        train, held = split(recs, 0.2, seed, max_group_share=share)
        dup = sum(c.id.startswith("c") for c in train)
        assert dup <= max(1, share * len(train)) and len(train) > 0, (seed, dup, len(train))


def test_one_prompt_only_is_refused_with_what_to_do() -> None:
    for n in (4, 40):
        with pytest.raises(RefreshInputError, match="near-duplicates of one prompt: nothing to hold out"):
            split([Captured(f"x{i}", _prompt(3), [2, 3], True, {}) for i in range(n)], 0.2, 0)


def test_capture_config_rules(tmp_path: Path) -> None:
    from builders.config import ConfigError, load_config

    cfg = tmp_path / "c.yaml"
    base = ("name: x\noutput_dir: out\ntarget: {model: t, dtype: float32}\ndraft: {type: eagle3, model: h}\n"
            "tree: {choices: chain-3}\ntrtllm_version: '1.4'\n")
    lim = "max_batch_size: 2, max_input_len: 32, max_seq_len: 64"
    f16 = base.replace("float32", "float16")
    cfg.write_text(f16 + f"engine: {{backend: pytorch, {lim}}}\ncapture: {{enabled: true}}\n")
    assert load_config(cfg).capture.enabled  # the current line's llmapi model records too (models/llmapi_bridge.py)
    for version in ("1.1", "1.2"):  # the C++ backend records nothing: refused, with what to do
        cfg.write_text(base.replace("'1.4'", f"'{version}'").replace("float32", "float16")
                       + f"engine: {{backend: tensorrt, {lim}}}\ncapture: {{enabled: true}}\n")
        with pytest.raises(ConfigError) as e:
            load_config(cfg)
        assert "capture.enabled=true with engine.backend='tensorrt'" in str(e.value)
        assert "engine.backend: pytorch" in str(e.value) and "capture.enabled: false" in str(e.value)
    cfg.write_text(base + "engine: {backend: reference, max_batch_size: 2, max_input_len: 32, max_seq_len: 64}\n"
                   "capture: {enabled: true, dir: store, sample_rate: 0}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert "capture.sample_rate" in str(e.value)
    cfg.write_text(base + "engine: {backend: reference, max_batch_size: 2, max_input_len: 32, max_seq_len: 64}\n"
                   "capture: {enabled: true}\n")
    from builders.capture_settings import settings as capture_settings

    c = load_config(cfg)
    s = capture_settings(c, Path(c.output_dir) / "triton_repo")
    assert s.dir == "../capture" and s.store_dir(Path(c.output_dir) / "triton_repo") == Path(c.output_dir) / "capture"
    assert not load_config(cfg, ["capture.enabled=false"]).capture.enabled


@pytest.fixture(scope="module")
def mimic3_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference build (ensemble layout) of a tiny target with an EAGLE-3 head that accepts (tests/doctor_models)."""
    from builders.build import main as build_main
    from tests.doctor_models import make_mimic3

    root = tmp_path_factory.mktemp("adaptive")
    target, head = make_mimic3(root / "m")
    cfg = root / "b.yaml"
    cfg.write_text(f"name: a\ntrtllm_version: '1.2'\noutput_dir: {root / 'build'}\n"
                   f"target: {{model: {target}, dtype: float32}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   "tree: {choices: chain-3}\n"
                   "engine: {backend: reference, device: cpu, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n"
                   "capture: {enabled: true, segment_records: 4, segment_seconds: 1.0}\n"
                   "refresh: {original_share: 0.0, epochs: 1, gate_max_new_tokens: 12, gate_margin: 0.0}\n")
    assert build_main([str(cfg)]) == 0
    return root / "build"


def held_out(build: Path, n: int) -> Path:
    """Captured-looking records: prompts of the tiny tokenizer's ids, outputs of the target alone (greedy)."""
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    eng = ReferenceEngine.from_build(build)
    prompts = [[1, 5 + i, 40 + 3 * i, 90 + i] for i in range(n)]
    reqs = [GenerationRequest(p, 12, SamplingParams(), []) for p in prompts]
    res = [r for i in range(0, n, 4) for r in eng.generate(reqs[i:i + 4], speculative=False)]
    f = build / f"held-{n}.jsonl"
    f.write_text("".join(json.dumps({"id": str(i), "prompt_ids": p, "output_ids": r.output_ids,
                                     "sampling": {"temperature": 0.0}}) + "\n"
                         for i, (p, r) in enumerate(zip(prompts, res))))
    return f


def gate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doctor", "gate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TQDM_DISABLE": "1"})


def test_gate_refuses_a_worse_head_and_passes_an_equal_one_without_margin(mimic3_build: Path, tmp_path: Path) -> None:
    from tests.test_production_metrics import _degrade

    build, requests = mimic3_build, held_out(mimic3_build, 6)
    current = build / "checkpoint" / "eagle3"
    worse = _degrade(current, tmp_path / "worse")
    out = tmp_path / "g.json"
    p = gate_cli("--build", str(build), "--candidate", str(worse), "--requests", str(requests), "--margin", "0.1",
                 "--max-new-tokens", "12", "--json", str(out))
    assert p.returncode == 1, p.stderr
    g = json.loads(out.read_text())
    assert not g["publishable"] and not g["better"] and g["lossless"] and g["captured_outputs_reproduced"] == 6
    assert g["candidate"]["tau"] < g["current"]["tau"] and "refused:" in p.stdout
    same = gate_cli("--build", str(build), "--candidate", str(current), "--requests", str(requests), "--margin", "0",
                    "--max-new-tokens", "12")
    assert same.returncode == 0 and "publishable: candidate tau" in same.stdout, same.stdout + same.stderr
    bad = gate_cli("--build", str(build), "--candidate", str(tmp_path / "nothing"), "--requests", str(requests))
    assert bad.returncode == 2 and "error:" in bad.stderr


def test_refresh_exit_2_on_unusable_input(mimic3_build: Path, tmp_path: Path) -> None:
    from adaptive.refresh import main

    assert main(["--build", str(tmp_path)]) == 2  # not a build
    assert main(["--build", str(mimic3_build), "--purge-capture"]) == 0
    assert main(["--build", str(mimic3_build), "--run", "empty"]) == 2  # nothing captured
    assert main(["--build", str(mimic3_build), "--rollback"]) == 1  # nothing published


def test_launcher_explicit_model_control_argv() -> None:
    """`launch.py --model-control explicit`: every model loaded at start, load requests accepted (--publish)."""
    p = subprocess.run([sys.executable, "triton_repo/launch.py", "--repo", str(ROOT), "--print-argv",
                        "--model-control", "explicit"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split()[-2:] == ["--model-control-mode=explicit", "--load-model=*"]
    p = subprocess.run([sys.executable, "triton_repo/launch.py", "--repo", str(ROOT), "--print-argv"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert "--model-control-mode" not in p.stdout


@pytest.mark.parametrize(("published", "retired", "keep"), [(5, 0, 3), (3, 4, 1), (2, 2, 3), (0, 0, 2), (8, 8, 2)])
def test_retention_keeps_version_1_and_the_newest_published(tmp_path: Path, published: int, retired: int,
                                                            keep: int) -> None:
    from adaptive.publish import RETIRED, prune, versions

    model = tmp_path / "triton_repo" / "tensorrt_llm"
    for v in range(1, published + 2):
        (model / str(v)).mkdir(parents=True)
    for r in range(retired):
        d = tmp_path / "refresh" / RETIRED / f"{r + 2}-x"
        d.mkdir(parents=True)
        os.utime(d, (1000 + r, 1000 + r))
    gone = prune(tmp_path, "tensorrt_llm", keep)
    kept = versions(model)
    assert kept == [1, *range(max(2, published + 2 - keep), published + 2)]
    left = sorted(p.name for p in (tmp_path / "refresh" / RETIRED).iterdir()) if retired else []
    assert left == sorted(f"{r + 2}-x" for r in range(max(0, retired - keep), retired))
    assert len(gone) == max(0, published - keep) + max(0, retired - keep)


@pytest.mark.parametrize(("runs", "keep"), [(5, 2), (1, 1), (3, 3), (6, 1)])
def test_retention_of_refresh_runs_spares_the_current_one(tmp_path: Path, runs: int, keep: int) -> None:
    from adaptive.refresh import prune_runs

    root = tmp_path / "refresh"
    for i in range(runs):
        (root / f"run-{i}").mkdir(parents=True)
        (root / f"run-{i}" / "report.json").write_text("{}")
        os.utime(root / f"run-{i}", (1000 + i, 1000 + i))
    (root / "retired").mkdir()  # not a run: never pruned
    current = root / "run-0"  # the oldest, but the one being published
    gone = prune_runs(tmp_path, keep, current)
    left = sorted(p.name for p in root.iterdir())
    assert "retired" in left and "run-0" in left
    assert {f"run-{i}" for i in range(max(0, runs - keep), runs)} <= set(left)
    assert len(gone) == max(0, runs - keep - (1 if runs > keep else 0))


@pytest.mark.parametrize(("given", "expect"), [
    (["127.0.0.1:8000"], ["127.0.0.1:8000"]),
    (["127.0.0.1:8000", "127.0.0.1:8000", "10.1.2.3:8000"], ["127.0.0.1:8000", "10.1.2.3:8000"]),  # once each
    (["dns:localhost:8000"], ["127.0.0.1:8000"]),  # every address the name resolves to (a headless Service's pods)
])
def test_servers_named_and_resolved(given: list[str], expect: list[str]) -> None:
    from adaptive.servers import endpoints

    got = endpoints(given)
    assert [g for g in got if not g.startswith("[")] == expect  # localhost may also resolve to [::1]


@pytest.mark.parametrize(("given", "message"), [
    ("no-port", "write HOST:PORT"), ("host:http", "write HOST:PORT"), (":8000", "write HOST:PORT"),
    ("dns:svc", "write dns:NAME:PORT"), ("dns::8000", "write dns:NAME:PORT"),
    ("dns:no-such-name.invalid:8000", "does not resolve"),
])
def test_a_bad_server_name_is_refused_with_what_to_write(given: str, message: str) -> None:
    from adaptive.publish import PublishError
    from adaptive.servers import endpoints

    with pytest.raises(PublishError, match=message):
        endpoints([given])
