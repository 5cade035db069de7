# TensorRT-LLM's llmapi python model (NVIDIA/TensorRT-LLM v1.2.0: triton_backend/all_models/llmapi/tensorrt_llm/1/
# model.py, TritonPythonModel), copied next to triton_repo/models/llmapi_bridge.py as `upstream_model.py` at serve time:
# the members the bridge uses.
from typing import Any

class TritonPythonModel:
    _llm_engine: Any
    _ongoing_request_count: int
    def initialize(self, args: dict[str, Any]) -> None: ...
    def execute(self, requests: list[Any]) -> Any: ...
    def finalize(self) -> None: ...
