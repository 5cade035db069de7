"""The Dynamo deployment's files (builders/dynamo/files.py) against the contract ledger (ledger/dynamo.py),
without Dynamo: the worker YAMLs keep the build's LLM API options and add the cache transceiver, the commands and the
DynamoGraphDeployments use only cited flags and keys. tests/test_dynamo.py runs the real Dynamo."""

from __future__ import annotations

import pytest

from builders.dynamo import files
from ledger import table as ledger

OPTIONS = {"tensor_parallel_size": 1, "max_batch_size": 8, "max_seq_len": 4096, "max_input_len": 3000,
           "kv_cache_config": {"enable_block_reuse": False},
           "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/h"}}


@pytest.mark.parametrize(("max_input_len", "buffer"), [(1, 32), (32, 32), (33, 64), (3000, 3008), (8192, 8192)])
def test_transceiver_buffer_holds_the_longest_input_in_whole_blocks(max_input_len: int, buffer: int) -> None:
    assert files.transceiver_buffer(max_input_len) == buffer
    yamls = files.engine_yamls(OPTIONS, max_input_len)
    for role in ("prefill", "decode"):
        assert yamls[role]["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": buffer}
        assert yamls[role]["disable_overlap_scheduler"] is True


def test_worker_yamls_keep_the_build_options() -> None:
    yamls = files.engine_yamls(OPTIONS, 3000)
    assert yamls["agg"] == OPTIONS
    for role in ("prefill", "decode"):
        extra = ledger.flat_keys(yamls[role]) - ledger.flat_keys(OPTIONS)
        assert ledger.check("dynamo.engine_yaml", "1.4", extra, ledger.flags_of(disaggregated=True)) == []
        assert {k: v for k, v in yamls[role].items() if k in OPTIONS} == OPTIONS


@pytest.mark.parametrize("kind", ["Medusa", "NGram", "MTP"])
def test_non_eagle_speculation_is_refused(kind: str) -> None:
    with pytest.raises(files.DynamoRefusal, match=f"decoding_type='{kind}': the Dynamo deployment is written for "
                                                  "EAGLE heads only"):
        files.engine_yamls(dict(OPTIONS, speculative_config={"decoding_type": kind}), 100)


def test_commands_use_cited_flags() -> None:
    flags: set[str] = set()
    for role in files.ROLES:
        argv = files.worker_argv(role, "/m", "name", f"engine/{role}.yaml")
        assert argv[:3] == ["python3", "-m", "dynamo.trtllm"]
        assert ("--disaggregation-mode" in argv) == (role != "agg")
        flags |= ledger.argv_flags(argv)
    assert ledger.check("dynamo.trtllm.flag", "1.4", flags) == []
    assert ledger.check("dynamo.frontend.flag", "1.4", ledger.argv_flags(files.frontend_argv())) == []
    with pytest.raises(ValueError, match="role 'both' is not one of"):
        files.worker_argv("both", "/m", "name", "x.yaml")


@pytest.mark.parametrize("disaggregated", [False, True])
def test_graph_keys_are_cited(disaggregated: bool) -> None:
    doc = files.graph("demo", "/m", "demo", "/workspace/engine", disaggregated=disaggregated, gpus_per_worker=2)
    services = doc["spec"]["services"]
    assert sorted(services) == (["Frontend", "TRTLLMDecodeWorker", "TRTLLMPrefillWorker"] if disaggregated
                                else ["Frontend", "TRTLLMWorker"])
    names = {k for k in ledger.flat_keys(doc) if not k.startswith("spec.services.")}
    for svc in services.values():
        names |= ledger.flat_keys(svc)
    assert ledger.check("dynamo.graph", "1.4", names) == []
    for name, svc in services.items():
        if name != "Frontend":
            assert svc["resources"]["limits"]["gpu"] == "2"
            args = svc["extraPodSpec"]["mainContainer"]["args"]
            assert args[args.index("--extra-engine-args") + 1].startswith("/workspace/engine/")
