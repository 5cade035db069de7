"""Rendering the Triton model repository (no server): every config.pbtxt parses as tritonclient's ModelConfig, the
ensemble I/O equals tensorrtllm_backend's all_models/inflight_batcher_llm/ensemble/config.pbtxt for the tensors we
serve, golden renders for tensorrt and pytorch, strict errors, launch argv (scripts/launch_triton_server.py form).

`UPDATE_GOLDEN=1 pytest tests/test_triton_render.py` rewrites tests/golden/triton/ (review the diff)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.build import main as build_main
from builders.config import load_config
from engines.trees import DraftTree, preset
from tests.engine_cases import write_build_yaml
from triton_repo import contract as C
from builders.triton import render
from triton_repo import launch
from triton_repo.models import batcher, common, llm_io

GOLDEN = Path(__file__).resolve().parent / "golden" / "triton"
REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")

# tensorrtllm_backend all_models/inflight_batcher_llm/ensemble/config.pbtxt (commit 6a749f5^, May 2025):
# (name, data_type, dims, optional) of the inputs/outputs we serve.
UPSTREAM_ENSEMBLE_INPUTS = {
    "text_input": ("TYPE_STRING", [1], False), "max_tokens": ("TYPE_INT32", [1], False),
    "stop_words": ("TYPE_STRING", [-1], True), "exclude_input_in_output": ("TYPE_BOOL", [1], True),
    "end_id": ("TYPE_INT32", [1], True), "pad_id": ("TYPE_INT32", [1], True), "top_k": ("TYPE_INT32", [1], True),
    "top_p": ("TYPE_FP32", [1], True), "temperature": ("TYPE_FP32", [1], True), "seed": ("TYPE_UINT64", [1], True),
    "beam_width": ("TYPE_INT32", [1], True), "return_perf_metrics": ("TYPE_BOOL", [1], True),
    "stream": ("TYPE_BOOL", [1], True),
}  # fmt: skip
UPSTREAM_ENSEMBLE_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]), "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]), "total_draft_tokens": ("TYPE_INT32", [1]),
}  # fmt: skip


def _yaml(root: Path, target: Path, head: Path, draft_type: str, backend: str, tree: str,
          version: str = "1.1") -> Path:
    return write_build_yaml(root / f"{backend}.yaml", output_dir=root / "build", target=target, head=head,
                            draft=draft_type, backend=backend, tree=tree, name=f"render-{backend}", version=version)


@pytest.fixture(scope="module")
def reference_repo(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> Path:
    root = tmp_path_factory.mktemp("render_ref")
    assert build_main([str(_yaml(root, tiny_target, eagle_head, "eagle", "reference", "topk-2-2"))]) == 0
    return root / "build" / "triton_repo"


@pytest.fixture(scope="module")
def tensorrt_build(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, eagle_head: Path) -> tuple[Any, Path]:
    """TensorRT-LLM cannot build engines here: the checkpoint stage runs, the repository renders from the config
    (the engine path is only referenced)."""
    root = tmp_path_factory.mktemp("render_trt")
    cfg_file = _yaml(root, tiny_target, eagle_head, "eagle", "tensorrt", "trtllm-default")
    assert build_main([str(cfg_file), "--only", "checkpoint"]) == 0
    return load_config(cfg_file), root / "build"


@pytest.fixture(scope="module")
def target4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4-layer target: TensorRT-LLM's EAGLE-3 needs 3 distinct captured layers in 1..L-1 (builders/engine/llmapi.py)."""
    from tests import tiny_models as tm

    return tm.make_target(tmp_path_factory.mktemp("target4") / "target", layers=4)


@pytest.fixture(scope="module")
def pytorch_build(tmp_path_factory: pytest.TempPathFactory, target4: Path) -> tuple[Any, Path]:
    from tests import tiny_models as tm

    root = tmp_path_factory.mktemp("render_pt")
    head = tm.make_eagle3_head(root / "eagle3", target4)
    # Three distinct input-indexed layers (the fixture repeats one, which TensorRT-LLM's set cannot express).
    head_cfg = json.loads((head / "config.json").read_text())
    head_cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(head_cfg))
    # a 4-layer target has no three distinct default capture layers: TensorRT-LLM 1.2 writes eagle3_layers_to_capture
    cfg_file = _yaml(root, target4, head, "eagle3", "pytorch", "chain-3", version="1.2")
    assert build_main([str(cfg_file), "--only", "checkpoint", "--only", "engine"]) == 0
    return load_config(cfg_file), root / "build"


def parse(repo: Path, model: str) -> mc.ModelConfig:
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), mc.ModelConfig())


def normalized(text: str, build: Path, target: Path | None = None) -> str:
    text = text.replace(str(build.resolve()), "<BUILD>").replace(str(REPO_ROOT), "<PROJECT>")
    return text if target is None else text.replace(str(target.resolve()), "<TARGET>")


def check_golden(rel: str, text: str) -> None:
    f = GOLDEN / rel
    if os.environ.get("UPDATE_GOLDEN") == "1":
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    assert f.is_file(), f"golden file {f} missing; run with UPDATE_GOLDEN=1 and review it"
    assert text == f.read_text(), f"{rel} differs from the golden file (UPDATE_GOLDEN=1 to accept after review)"


# ---- contract and rendered configs -------------------------------------------------------------------------------


def test_contract_wiring_is_consistent() -> None:
    assert C.check_wiring() == []


def test_every_config_parses_and_no_placeholder_survives(reference_repo: Path) -> None:
    for m in MODELS:
        text = (reference_repo / m / "config.pbtxt").read_text()
        assert "${" not in text
        cfg = parse(reference_repo, m)
        assert cfg.name == m and cfg.max_batch_size == 8
    for f in reference_repo.rglob("*"):
        if f.is_file() and f.suffix in (".pbtxt", ".json", ".yaml"):
            assert "${" not in f.read_text(), f
    assert {p.name for p in reference_repo.iterdir()} == {*MODELS, "client.json", "manifest.json"}


def test_ensemble_io_matches_tensorrtllm_backend(reference_repo: Path) -> None:
    ens = parse(reference_repo, "ensemble")
    got_in = {i.name: (mc.DataType.Name(i.data_type), list(i.dims), i.optional) for i in ens.input}
    got_out = {o.name: (mc.DataType.Name(o.data_type), list(o.dims)) for o in ens.output}
    # text_input / max_tokens: required, but declared optional so that preprocessing can refuse a request missing
    # one (render.ensemble_config says why); the BLS model keeps upstream's attributes.
    required = {n: (*UPSTREAM_ENSEMBLE_INPUTS[n][:2], True) for n in C.REQUIRED_HELP}
    assert set(required) == {"text_input", "max_tokens"}
    assert got_in == {**UPSTREAM_ENSEMBLE_INPUTS, **required}
    assert got_out == UPSTREAM_ENSEMBLE_OUTPUTS
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    bls = parse(reference_repo, "tensorrt_llm_bls")
    assert {i.name: (mc.DataType.Name(i.data_type), list(i.dims), i.optional) for i in bls.input} == (
        UPSTREAM_ENSEMBLE_INPUTS
    )
    pre = {i.name: i.optional for i in parse(reference_repo, "preprocessing").input}
    assert pre["QUERY"] and pre["REQUEST_OUTPUT_LEN"]  # refused by the model itself when absent


def test_reference_llm_model_is_decoupled_python_with_queue_limit(reference_repo: Path) -> None:
    llm = parse(reference_repo, "tensorrt_llm")
    assert llm.backend == "python" and llm.model_transaction_policy.decoupled
    assert llm.dynamic_batching.default_queue_policy.max_queue_size == 64  # TritonConfig default
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert params["llm_kind"] == "reference" and params["max_seq_len"] == "512" and params["max_input_len"] == "256"
    assert Path(params["build_dir"]) == reference_repo.parent.resolve()
    assert Path(params["project_root"]) == REPO_ROOT
    assert (reference_repo / "tensorrt_llm" / "1" / "model.py").read_text() == (
        REPO_ROOT / "triton_repo" / "models" / "reference_llm.py"
    ).read_text()


def test_client_json_is_generated_from_the_ensemble_config(reference_repo: Path) -> None:
    desc = json.loads((reference_repo / "client.json").read_text())
    ens = parse(reference_repo, "ensemble")
    wire = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32",
            "TYPE_BOOL": "BOOL"}  # fmt: skip
    assert desc["model"] == ens.name and desc["streaming"] is True and desc["backend"] == "reference"
    assert [(i["name"], i["datatype"], i["dims"], i["optional"]) for i in desc["inputs"]] == [
        (i.name, wire[mc.DataType.Name(i.data_type)], list(i.dims), i.optional and i.name not in C.REQUIRED_HELP)
        for i in ens.input
    ]  # client.json says what a client must send: text_input and max_tokens are required
    assert [o["name"] for o in desc["outputs"]] == [o.name for o in ens.output]
    defaults = {i["name"]: i["default"] for i in desc["inputs"]}
    assert defaults["temperature"] == 1.0 and defaults["stream"] is False and defaults["end_id"] is None
    assert desc["max_seq_len"] == 512 and desc["perf_outputs"] == [t.name for t in C.PERF_OUTPUTS]


def test_streaming_false_renders_non_decoupled_models(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = tensorrt_build
    cfg = cfg.model_copy(update={"triton": cfg.triton.model_copy(update={"streaming": False})})
    render.render(cfg, build, tmp_path / "repo")
    assert not parse(tmp_path / "repo", "tensorrt_llm").model_transaction_policy.decoupled
    assert not parse(tmp_path / "repo", "tensorrt_llm_bls").model_transaction_policy.decoupled
    assert json.loads((tmp_path / "repo" / "client.json").read_text())["streaming"] is False


# ---- golden renders -----------------------------------------------------------------------------------------------


def test_tensorrt_render_golden(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = tensorrt_build
    repo = tmp_path / "repo"
    render.render(cfg, build, repo)
    llm = parse(repo, "tensorrt_llm")
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert llm.backend == "tensorrtllm" and llm.model_transaction_policy.decoupled
    assert params["eagle_choices"] == DraftTree.from_choices(preset("trtllm-default")).to_triton()
    assert params["eagle_choices"].startswith("{0}, {1}, {2}") and params["eagle_choices"].count("{") == 63
    assert params["decoding_mode"] == "eagle" and params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == str((build / "engine").resolve())
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()  # the C++ backend needs no model.py
    for m in MODELS:
        check_golden(f"tensorrt/{m}/config.pbtxt", normalized((repo / m / "config.pbtxt").read_text(), build))
    desc = json.loads((repo / "client.json").read_text())
    assert desc.pop("config_hash") == cfg.config_hash()  # depends on the tmp paths: not golden
    check_golden("tensorrt/client.json", json.dumps(desc, indent=2) + "\n")


def test_pytorch_render_golden(pytorch_build: tuple[Any, Path], target4: Path, tmp_path: Path) -> None:
    import yaml

    cfg, build = pytorch_build
    repo = tmp_path / "repo"
    render.render(cfg, build, repo)
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    options = yaml.safe_load((build / "engine" / render.LLMAPI_OPTIONS_FILE).read_text())
    assert doc["backend"] == "pytorch" and Path(doc["model"]) == target4.resolve()
    assert {k: v for k, v in doc.items() if k not in ("model", "backend", "triton_config")} == options
    assert doc["triton_config"] == {"max_batch_size": 8, "decoupled": True}
    assert parse(repo, "tensorrt_llm").parameters["llm_kind"].string_value == "pytorch"
    for m in MODELS:
        check_golden(f"pytorch/{m}/config.pbtxt", normalized((repo / m / "config.pbtxt").read_text(), build))
    check_golden("pytorch/model.yaml", normalized((repo / "tensorrt_llm" / "1" / "model.yaml").read_text(), build,
                                                  target4))  # fmt: skip


# ---- strictness ---------------------------------------------------------------------------------------------------


def test_missing_tokenizer_is_an_error_naming_the_fix(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, _ = tensorrt_build
    with pytest.raises(render.RenderError, match=r"tokenizer not found at .*run the checkpoint stage first"):
        render.render(cfg, tmp_path / "empty_build", tmp_path / "repo")


def test_render_refuses_a_non_empty_directory(tensorrt_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = tensorrt_build
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "old").write_text("x")
    with pytest.raises(render.RenderError, match="is not empty"):
        render.render(cfg, build, tmp_path / "repo")


def test_duplicate_model_names_are_refused(tensorrt_build: tuple[Any, Path]) -> None:
    cfg, _ = tensorrt_build
    bad = cfg.model_copy(update={"triton": cfg.triton.model_copy(update={"bls_model": "ensemble"})})
    assert render.config_problems(bad) == [
        "triton.bls_model='ensemble' is also triton.ensemble_model; every Triton model needs its own name"
    ]


def test_pytorch_render_needs_the_engine_stage(pytorch_build: tuple[Any, Path], tmp_path: Path) -> None:
    cfg, build = pytorch_build
    fake = tmp_path / "b"
    (fake / "checkpoint").mkdir(parents=True)
    (fake / "checkpoint" / "tokenizer").symlink_to(build / "checkpoint" / "tokenizer")
    with pytest.raises(render.RenderError, match="llm_api_options.yaml not found: run the engine stage"):
        render.render(cfg, fake, tmp_path / "repo")


# ---- model helpers (pure) -----------------------------------------------------------------------------------------


def test_stop_word_list_round_trip_in_trtllm_format() -> None:
    arr = common.word_list([[5, 6], [7]])
    assert arr.tolist() == [[5, 6, 7], [2, 3, -1]]
    assert common.parse_word_list(arr) == [[5, 6], [7]]
    assert common.word_list([]).tolist() == [[0], [-1]] and common.parse_word_list(common.word_list([])) == []


@pytest.mark.parametrize(
    ("t", "k", "p", "greedy", "top_p"),
    [(1.0, 0, 0.0, True, 1.0), (0.0, 5, 0.9, True, 0.9), (0.7, 1, 0.0, True, 1.0), (0.7, 40, 0.0, False, 1.0),
     (0.7, 0, 0.9, False, 0.9)],
)  # fmt: skip
def test_sampling_follows_trtllm_greedy_rule(t: float, k: int, p: float, greedy: bool, top_p: float) -> None:
    s = llm_io.sampling_from(t, k, p, 3)
    assert (s.greedy, s.top_p, s.seed) == (greedy, top_p, 3)


def test_sampling_rejects_bad_values() -> None:
    for t in (-1.0, float("nan"), float("inf")):
        with pytest.raises(common.RequestError, match=rf"temperature={t} must be a finite number >= 0"):
            llm_io.sampling_from(t, 5, 0.0, 0)
    with pytest.raises(common.RequestError, match=r"top_p=nan must be in \[0, 1\]"):
        llm_io.sampling_from(1.0, 0, float("nan"), 0)
    with pytest.raises(common.RequestError, match=r"input_ids\[1\]=320 is out of range: token ids must be in \[0, 320\)"):
        llm_io.check_token_ids([5, 320], 320)
    llm_io.check_token_ids([0, 319], 320)
    with pytest.raises(common.RequestError, match=r"top_p=1.5 must be in \[0, 1\]"):
        llm_io.sampling_from(1.0, 0, 1.5, 0)


class CountingSession:
    """A stand-in for engines.runtime.Session (the batcher's Stepper protocol) without a model: a request is the
    number of tokens to generate, one per step; `gate` blocks steps; `log` records (step, active slots)."""

    def __init__(self, capacity: int, gate: threading.Event | None = None, delay: float = 0.0) -> None:
        self.capacity, self.gate, self.delay = capacity, gate, delay
        self.left: dict[int, int] = {}
        self.made: dict[int, int] = {}
        self.ended: dict[int, str] = {}
        self.log: list[list[int]] = []

    def add(self, request: int) -> int:
        slot = min(set(range(self.capacity)) - set(self.left) - set(self.ended))
        self.left[slot], self.made[slot] = request, 0
        return slot

    def step(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(10)
        time.sleep(self.delay)
        self.log.append(sorted(self.left))
        for slot in list(self.left):
            self.made[slot] += 1
            self.left[slot] -= 1
            if self.left[slot] == 0:
                del self.left[slot]
                self.ended[slot] = "length"

    def cancel(self, slot: int) -> None:
        del self.left[slot]
        self.ended[slot] = "cancelled"

    def pop(self, slot: int) -> tuple[str, int]:
        return self.ended.pop(slot), self.made.pop(slot)

    @property
    def finished(self) -> list[int]:
        return sorted(self.ended)

    @property
    def free(self) -> int:
        return self.capacity - len(self.left) - len(self.ended)

    @property
    def done(self) -> bool:
        return not self.left


def _wait_idle(b: batcher.Batcher) -> None:
    deadline = time.time() + 10
    while b.in_flight and time.time() < deadline:
        time.sleep(0.01)
    assert b.in_flight == 0


def test_batcher_admits_up_to_the_limit_then_refuses_and_recovers() -> None:
    gate = threading.Event()
    finished: list[Any] = []
    session = CountingSession(2, gate)
    b = batcher.Batcher(session, lambda j: j.payload, finished.append, max_queue_size=3)
    jobs = [batcher.Job(payload=2, is_cancelled=lambda: False, streaming=False) for _ in range(6)]
    assert [b.admit(j) for j in jobs[:5]] == [None] * 5
    assert b.admit(jobs[5]) == (
        "server busy: 5 requests in flight, limit max_batch_size 2 + triton.max_queue_size 3; retry later"
    )
    gate.set()
    for j in jobs[:5]:
        assert j.done.wait(10)
    assert [j.result for j in finished] == [("length", 2)] * 5
    assert max(len(active) for active in session.log) == 2  # never more than the session's capacity
    _wait_idle(b)
    assert b.admit(jobs[5]) is None  # room again
    assert jobs[5].done.wait(10)
    b.close()


def test_batcher_new_job_joins_the_running_batch_at_the_next_step() -> None:
    """In-flight batching: a job admitted while a long one runs is stepped together with it from the next step
    on, and finishes long before it; its slot is then free for the next job."""
    session = CountingSession(2, delay=0.002)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2)
    long = batcher.Job(payload=400, is_cancelled=lambda: False, streaming=True)
    short = batcher.Job(payload=3, is_cancelled=lambda: False, streaming=True)
    assert b.admit(long) is None
    while len(session.log) < 5:
        time.sleep(0.001)
    assert b.admit(short) is None
    assert short.done.wait(10) and not long.done.is_set()
    assert short.result == ("length", 3)
    joined = next(k for k, active in enumerate(session.log) if active == [0, 1])
    assert joined >= 5 and session.log[joined + 2] == [0, 1]  # three steps together, then long alone
    assert long.done.wait(10) and long.result == ("length", 400)
    b.close()


def test_batcher_cancelled_job_leaves_the_batch_and_frees_its_slot() -> None:
    session = CountingSession(1, delay=0.001)
    flag = threading.Event()
    finished: list[batcher.Job] = []
    b = batcher.Batcher(session, lambda j: j.payload, finished.append, max_queue_size=2)
    running = batcher.Job(payload=10**5, is_cancelled=flag.is_set, streaming=True)
    waiting = batcher.Job(payload=2, is_cancelled=lambda: False, streaming=True)
    assert b.admit(running) is None and b.admit(waiting) is None
    while len(session.log) < 3:
        time.sleep(0.001)
    flag.set()  # the client cancels: the sequence stops at the next step and the queued job gets the slot
    assert running.done.wait(10) and waiting.done.wait(10)
    assert running.cancelled and running.result[0] == "cancelled" and running.result[1] < 10**5
    assert waiting.result == ("length", 2) and finished == [running, waiting]
    b.close()


def test_batcher_skips_jobs_cancelled_while_queued() -> None:
    session = CountingSession(4)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=4)
    j = batcher.Job(payload=5, is_cancelled=lambda: True, streaming=True)
    assert b.admit(j) is None and j.done.wait(10)
    assert j.cancelled and j.result is None and session.log == []
    b.close()


def test_batcher_engine_error_fails_the_running_jobs_and_serves_the_next() -> None:
    class Failing(CountingSession):
        def step(self) -> None:
            if 666 in self.left.values():
                raise RuntimeError("boom")
            super().step()

    session = Failing(2)
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2)
    bad = batcher.Job(payload=666, is_cancelled=lambda: False, streaming=False)
    assert b.admit(bad) is None and bad.done.wait(10)
    assert (bad.error, bad.error_code, bad.result) == ("engine error: RuntimeError: boom", "INTERNAL", ("cancelled", 0))
    ok = batcher.Job(payload=2, is_cancelled=lambda: False, streaming=False)
    assert b.admit(ok) is None and ok.done.wait(10) and ok.result == ("length", 2)
    b.close()


def test_batcher_deadline_ends_running_and_queued_jobs_and_reports_the_counts() -> None:
    """A job past triton.request_deadline_s ends with UNAVAILABLE, whether it holds a slot or waits for one;
    on_count(in_flight, queued) follows every change."""
    session = CountingSession(1, delay=0.001)
    counts: list[tuple[int, int]] = []
    b = batcher.Batcher(session, lambda j: j.payload, lambda j: None, max_queue_size=2, deadline_s=0.3,
                        on_count=lambda n, q: counts.append((n, q)))  # fmt: skip
    running, queued = (batcher.Job(payload=10**6, is_cancelled=lambda: False, streaming=True) for _ in range(2))
    assert b.admit(running) is None and b.admit(queued) is None
    assert running.done.wait(10) and queued.done.wait(10)
    for j in (running, queued):
        assert j.expired and j.error_code == "UNAVAILABLE" and j.error == (
            "request ended after the server's deadline of 0.3 s (triton.request_deadline_s); raise it for longer "
            "generations")
    assert running.result[0] == "cancelled" and 0 < running.result[1] < 10**6  # it held the slot, then left it
    assert queued.result is None  # never got the slot
    assert (2, 1) in counts and counts[-1] == (0, 0)
    b.close()


# ---- launch argv --------------------------------------------------------------------------------------------------


def _binary(tmp_path: Path) -> launch.ServerBinary:
    return launch.ServerBinary(Path("/opt/tritonserver/bin/tritonserver"), Path("/opt/tritonserver/backends"))


def test_single_server_argv_binds_loopback(tmp_path: Path) -> None:
    argv = launch.launch_argv(_binary(tmp_path), Path("/r"), grpc_port=1, http_port=2, metrics_port=3,
                              host="127.0.0.1", shm_tag="t", admin_key="k3y")  # fmt: skip
    assert argv[0] == "/opt/tritonserver/bin/tritonserver" and "--model-repository=/r" in argv
    assert {"--grpc-address=127.0.0.1", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1"} <= set(argv)
    assert {"--grpc-port=1", "--http-port=2", "--metrics-port=3", "--disable-auto-complete-config"} <= set(argv)
    assert "--backend-config=python,shm-region-prefix-name=eaglet_rank0_" in argv
    assert not any(a.startswith("--load-model") for a in argv)
    group = "logging,model-repository,trace,shared-memory:eagle-admin-key=k3y"  # tritonserver 2.51 --help syntax
    assert {f"--grpc-restricted-protocol={group}", f"--http-restricted-api={group}"} <= set(argv)


def test_world_size_gives_the_mpirun_form(tmp_path: Path) -> None:
    """tensorrtllm_backend scripts/launch_triton_server.py: `mpirun --allow-run-as-root -n 1 <rank0> : -n 1 ...`,
    ranks > 0 load only the LLM model, each rank its own python shm prefix; --allow-run-as-root only as root."""
    kw = dict(grpc_port=1, http_port=2, metrics_port=3, host="127.0.0.1", world_size=2, shm_tag="t", admin_key="k")
    assert launch.launch_argv(_binary(tmp_path), Path("/r"), **kw)[:3] == ["mpirun", "-n", "1"]  # type: ignore[arg-type]
    argv = launch.launch_argv(_binary(tmp_path), Path("/r"), as_root=True, **kw)  # type: ignore[arg-type]
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    sep = argv.index(":")
    rank0, rank1 = argv[4:sep], argv[sep + 3 :]
    assert argv[sep + 1 : sep + 3] == ["-n", "1"] and rank1[0] == rank0[0]
    assert "--backend-config=python,shm-region-prefix-name=eaglet_rank0_" in rank0
    assert "--backend-config=python,shm-region-prefix-name=eaglet_rank1_" in rank1
    assert rank1[-2:] == ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]
    assert not any(a.startswith("--load-model") for a in rank0) and argv.count(":") == 1


def test_launch_cli_prints_the_command(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "triton_repo" / "launch.py"), "--repo", str(tmp_path / "repo"),
         "--world-size", "2", "--grpc-port", "9001", "--print-argv"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert out[: 1 + len(root)] == ["mpirun", *root] and "--grpc-port=9001" in out and out.count(":") == 1
    assert "eagle-admin-key=***" in " ".join(out), "the admin key is never printed"
    assert f"--model-repository={(tmp_path / 'repo').resolve()}" in out


def test_bundled_binary_env_puts_this_interpreters_libpython_first() -> None:
    b = launch.bundled_binary()
    assert b.bundled and b.executable.is_file()
    assert (b.backend_dir / "python" / "triton_python_backend_stub").exists()
    ld = b.env["LD_LIBRARY_PATH"].split(":")
    assert ld[0] == launch._libpython_dir() and ld[-1].endswith("nvidia_pytriton.libs")
    assert b.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_free_port_is_bindable() -> None:
    import socket

    port = launch.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.server
def test_launch_cli_serves_prints_endpoints_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The real bundled tritonserver on an empty repository (starts in seconds) plus a plain file at the root, as
    client.json is: it is ignored, the server becomes ready, SIGTERM stops it cleanly."""
    import signal
    import urllib.request

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "client.json").write_text("{}\n")
    ports = [launch.free_port() for _ in range(3)]
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "triton_repo" / "launch.py"), "--repo", str(repo), "--grpc-port",
         str(ports[0]), "--http-port", str(ports[1]), "--metrics-port", str(ports[2]), "--log", str(tmp_path / "log")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("tritonserver ready"), lines
        assert lines[1].split() == ["grpc", f"127.0.0.1:{ports[0]}"]
        assert lines[3].split() == ["metrics", f"http://127.0.0.1:{ports[2]}/metrics"]
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "tritonserver stopped (exit code 0)" in out
