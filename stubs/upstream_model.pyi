# TensorRT-LLM's llmapi python model (NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da
# triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, TritonPythonModel: _llm_engine set by _init_engine /
# _run_llm_engine, _ongoing_request_count by _run_llm_engine), copied next to triton_repo/models/llmapi_bridge.py as
# `upstream_model.py` at serve time: the members the bridge uses.
from typing import Any

class TritonPythonModel:
    _llm_engine: Any
    _ongoing_request_count: int
    def initialize(self, args: dict[str, Any]) -> None: ...
    def execute(self, requests: list[Any]) -> Any: ...
    def finalize(self) -> None: ...
