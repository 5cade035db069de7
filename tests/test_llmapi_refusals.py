"""The llmapi layout's request boundary (triton_repo/models/llmapi_refusals.py): sampling inputs TensorRT-LLM's
one-model speculative path cannot honour (tensorrt_llm/_torch/speculative/spec_sampler_base.py
SpecSampler.validate_request; utils.py get_spec_decoder) are refused with INVALID_ARGUMENT naming the input and the
switch, and served where the build turned the switch on (tree.enable_penalty -> speculative_config.enable_penalty).
Unit cases for the rule, then the real Triton server: upstream's model (a stand-in, no GPU here) under the
metrics bridge, built by the real CLI with and without the switch."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from builders.build import main as build_main
from builders.config import load_config
from testkit import tiny_models as tm
from testkit.triton_servers import STOP_TIMEOUT_S, server_on
from triton_repo.models import llmapi_refusals as R


class _Tensor:
    def __init__(self, value: Any) -> None:
        self.value = np.asarray([value])

    def as_numpy(self) -> Any:
        return self.value


class _PbUtils:
    @staticmethod
    def get_input_tensor_by_name(request: dict[str, Any], name: str) -> _Tensor | None:
        return None if name not in request else _Tensor(request[name])


CHAIN: dict[str, Any] = {"decoding_type": "Eagle3", "max_draft_len": 3}
DYNAMIC = dict(CHAIN, use_dynamic_tree=True, dynamic_tree_max_topK=2, max_total_draft_tokens=6)


@pytest.mark.parametrize(("request_", "spec", "expect"), [
    ({"sampling_param_temperature": 0.7, "sampling_param_top_p": 0.9}, CHAIN, None),
    ({"sampling_param_frequency_penalty": 0.0, "sampling_param_presence_penalty": 0.0}, CHAIN, None),
    ({"sampling_param_frequency_penalty": 0.5}, CHAIN, "sampling_param_frequency_penalty=0.5: TensorRT-LLM's "
     "one-model speculative path applies penalties only when the deployment turns them on: rebuild with "
     "tree.enable_penalty"),
    ({"sampling_param_presence_penalty": 1.5}, dict(CHAIN, enable_penalty=True), None),
    ({"sampling_param_presence_penalty": 1.5}, dict(DYNAMIC, enable_penalty=True),
     "sampling_param_presence_penalty=1.5: TensorRT-LLM does not apply penalties under tree speculation"),
    ({"sampling_param_frequency_penalty": -1.0}, dict(CHAIN, eagle_choices=[[0], [1]], enable_penalty=True),
     "under tree speculation"),
    ({"return_cumulative_logprob": True}, dict(CHAIN, enable_penalty=True),
     "return_cumulative_logprob: speculative decoding computes no log probabilities"),
    ({"return_cumulative_logprob": False}, CHAIN, None),
])
def test_the_one_model_rule(request_: dict[str, Any], spec: dict[str, Any], expect: str | None) -> None:
    got = R.refuse_speculative_sampling(_PbUtils, request_, spec)
    assert (got is None) if expect is None else (got is not None and expect in got), got


def _build(root: Path, name: str, target: Path, head: Path, tree: str) -> Path:
    cfg = root / f"{name}.yaml"
    cfg.write_text(f"name: {name}\ntrtllm_version: '1.4'\noutput_dir: {root / name}\n"
                   f"target: {{model: {target}, dtype: float16}}\ndraft: {{type: eagle3, model: {head}}}\n"
                   f"tree: {tree}\n"
                   "engine: {backend: pytorch, max_batch_size: 4, max_input_len: 48, max_seq_len: 128}\n")
    assert build_main([str(cfg)]) == 0
    from tests.deploy_files import serve

    repo = root / name / "triton_repo"
    serve.install_upstream_llmapi_model(load_config(cfg), repo)
    return repo


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import os

    from tests.deploy_files import serve

    root = tmp_path_factory.mktemp("llmapi_refusals")
    target = tm.make_target(root / "target", layers=4)
    head = tm.make_eagle3_head(root / "eagle3", target)
    cfg_h = json.loads((head / "config.json").read_text())
    cfg_h["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (head / "config.json").write_text(json.dumps(cfg_h))
    old = os.environ.get(serve.UPSTREAM_LLMAPI_ENV)
    os.environ[serve.UPSTREAM_LLMAPI_ENV] = str(Path(__file__).parent / "fixtures" / "llmapi_upstream_standin")
    try:
        return {"off": _build(root, "switch-off", target, head, "{choices: chain-3}"),
                "on": _build(root, "switch-on", target, head, "{choices: chain-3, enable_penalty: true}")}
    finally:
        if old is None:
            os.environ.pop(serve.UPSTREAM_LLMAPI_ENV)
        else:
            os.environ[serve.UPSTREAM_LLMAPI_ENV] = old


def _generate(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://{url}/v2/models/tensorrt_llm/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("switch", ["off", "on"])
def test_upstreams_model_under_the_bridge_refuses_or_serves_penalties(repos: dict[str, Path], switch: str,
                                                                      tmp_path: Path) -> None:
    """engine.backend pytorch, llmapi layout: the switch is written to model.yaml only when set; without it a
    penalized request is answered 400 naming the input and the switch before upstream's model sees it, with it
    the request reaches upstream's model; cumulative logprobs are refused either way; plain requests pass."""
    repo = repos[switch]
    spec = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]
    assert spec.get("enable_penalty") is (True if switch == "on" else None)
    srv = server_on(repo, tmp_path / "tritonserver.log").start(timeout_s=240)
    try:
        assert _generate(srv.http_url, {"text_input": "one two"}) == (200, {
            "model_name": "tensorrt_llm", "model_version": "1", "text_output": "ok"})
        code, body = _generate(srv.http_url, {"text_input": "one two", "sampling_param_frequency_penalty": 0.5})
        if switch == "on":
            assert (code, body["text_output"]) == (200, "ok")
        else:
            assert code == 400 and "sampling_param_frequency_penalty=0.5: TensorRT-LLM's one-model speculative " \
                "path applies penalties only when the deployment turns them on: rebuild with tree.enable_penalty" \
                in body["error"], body
        code, body = _generate(srv.http_url, {"text_input": "x", "return_cumulative_logprob": True})
        assert code == 400 and "return_cumulative_logprob: speculative decoding computes no log" in body["error"]
    finally:
        srv.stop(timeout_s=STOP_TIMEOUT_S)


def test_both_builds_pass_the_ledger_check(repos: dict[str, Path]) -> None:
    """speculative_config.enable_penalty is a cited row, required when tree.enable_penalty is set."""
    from ledger import check as ledger_check

    for repo in repos.values():
        assert ledger_check.main([str(repo.parent.parent / f"{repo.parent.name}.yaml")]) == 0


@pytest.mark.parametrize(("over", "message"), [
    ({"trtllm_version": "1.2"}, "tree.enable_penalty (speculative_config.enable_penalty) is not supported by "
     "TensorRT-LLM 1.2.0 (trtllm_version '1.2'); set trtllm_version: '1.4'"),
    ({"trtllm_version": "1.1"}, "is not supported by TensorRT-LLM 1.1.0"),
    ({"engine": "reference"}, "tree.enable_penalty=true with engine.backend=reference: it turns on TensorRT-LLM's "
     "occurrence penalties on the PyTorch backend's one-model speculative path; the reference engine applies no "
     "penalties"),
    ({"tree": "{dynamic: {top_k: 2, depth: 3, total_draft_tokens: 6}, enable_penalty: true}"},
     "tree.enable_penalty=true with a tree: TensorRT-LLM refuses penalized requests under tree speculation"),
])
def test_the_switch_is_refused_where_it_could_serve_nothing(tmp_path: Path, over: dict[str, str],
                                                            message: str) -> None:
    from builders.config import ConfigError

    target = tm.make_target(tmp_path / "target", layers=4)
    head = tm.make_eagle3_head(tmp_path / "eagle3", target)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"name: c\ntrtllm_version: '{over.get('trtllm_version', '1.4')}'\noutput_dir: {tmp_path / 'o'}\n"
                   f"target: {{model: {target}, dtype: float16}}\n"
                   f"draft: {{type: eagle3, model: {head}, eagle3: {{layers_to_capture: [1, 2, 3]}}}}\n"
                   f"tree: {over.get('tree', '{choices: chain-3, enable_penalty: true}')}\n"
                   f"engine: {{backend: {over.get('engine', 'pytorch')}, max_batch_size: 4, max_input_len: 48, "
                   "max_seq_len: 128}\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert message in str(err.value), str(err.value)
