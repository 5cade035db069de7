"""The request schema of a served model (name, inputs, dtypes, dims, optional, defaults, outputs), generated from
the serving side, never written by hand:

  * `from_model_config(cfg)`: the model config Triton itself serves (`GET /v2/models/<m>/config`, gRPC
    `ModelConfig`): works for any repository, including ones we did not render (the echo fixture);
  * `from_descriptor(path)`: the `client.json` our build writes next to the rendered repository (it also carries
    each optional input's server-side default and description);
  * `fetch_schema(url, model)`: the first, asked from a running server over gRPC.

The client speaks the ensemble contract of `triton_repo.contract` and the llmapi model's (`Dialect`): the role
names below must be tensors of it
(tests/test_clients_schema.py checks that), and every request is validated against the schema before sending,
so a misspelt or unsupported input fails here with the list of inputs the model takes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

# Contract tensors the client gives a role to (names from triton_repo/contract.py).
PROMPT = "text_input"
MAX_TOKENS = "max_tokens"
STREAM = "stream"
PERF_FLAG = "return_perf_metrics"
TEXT_OUTPUT = "text_output"
ACCEPTANCE_RATE = "acceptance_rate"
ACCEPTED_DRAFT = "total_accepted_draft_tokens"
DRAFT_TOKENS = "total_draft_tokens"
PERF_OUTPUTS = (ACCEPTANCE_RATE, ACCEPTED_DRAFT, DRAFT_TOKENS)


@dataclass(frozen=True)
class Dialect:
    """The input names a model family gives each role, and how its text arrives.

    ENSEMBLE: tensorrtllm_backend's ensemble / BLS (and this project's ensemble): streamed responses carry the new
    text only. LLMAPI: TensorRT-LLM's triton_backend/all_models/llmapi `tensorrt_llm` model (inputs
    `sampling_param_*`, `streaming`): every response carries the text generated so far (model.py _create_response
    sends RequestOutput.outputs[0].text), and its perf outputs travel as strings."""

    max_tokens: str
    stream: str
    perf_flag: str
    exclude_input: str
    cumulative_text: bool
    renames: tuple[tuple[str, str], ...] = ()  # sampling option (the ensemble's input name) -> this family's name

    def input_name(self, option: str) -> str:
        return dict(self.renames).get(option, option)


ENSEMBLE = Dialect(MAX_TOKENS, STREAM, PERF_FLAG, "exclude_input_in_output", cumulative_text=False)
LLMAPI = Dialect("sampling_param_max_tokens", "streaming", "sampling_param_return_perf_metrics",
                 "sampling_param_exclude_input_from_output", cumulative_text=True,
                 renames=tuple((k, f"sampling_param_{k}") for k in ("temperature", "top_k", "top_p", "seed"))
                 + (("stop_words", "sampling_param_stop"),))

# Triton config types -> tritonclient wire datatypes and numpy dtypes.
_WIRE = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_FP64": "FP64",
         "TYPE_INT8": "INT8", "TYPE_INT16": "INT16", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
         "TYPE_UINT8": "UINT8", "TYPE_UINT16": "UINT16", "TYPE_UINT32": "UINT32", "TYPE_UINT64": "UINT64"}
_NUMPY = {"BYTES": np.object_, "BOOL": np.bool_, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
          "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8,
          "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64}


class SchemaError(ValueError):
    """A schema that cannot be built, or a request that does not fit the schema; the message names the fix."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: `datatype` is the wire name (BYTES, INT32, ...); `dims` exclude the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    default: Any = None
    description: str = ""


@dataclass(frozen=True)
class Schema:
    """What a model accepts and returns. `max_batch_size > 0` means every tensor carries a leading batch dim."""

    model: str
    max_batch_size: int
    decoupled: bool
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    source: str
    tokenizer: str | None = None  # tokenizer directory the repository uses (None when the source does not say)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dialect(self) -> Dialect:
        """LLMAPI when the model takes upstream llmapi's `sampling_param_max_tokens`, else ENSEMBLE."""
        return LLMAPI if LLMAPI.max_tokens in self.inputs else ENSEMBLE

    @property
    def has_perf_metrics(self) -> bool:
        return self.dialect.perf_flag in self.inputs and all(n in self.outputs for n in PERF_OUTPUTS)

    def require(self, name: str, role: str) -> TensorSpec:
        spec = self.inputs.get(name)
        if spec is None:
            raise SchemaError(
                f"model {self.model!r} ({self.source}) has no input {name!r} needed for {role}; "
                f"its inputs are {sorted(self.inputs)}"
            )
        return spec

    def encode(self, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Numpy arrays, shaped with the batch dimension, for `values` (input name -> python value or list).

        Every name must be an input of the model and every required input must be present."""
        unknown = sorted(set(values) - set(self.inputs))
        if unknown:
            raise SchemaError(
                f"model {self.model!r} ({self.source}) has no input(s) {unknown}; its inputs are {sorted(self.inputs)}"
            )
        missing = sorted(n for n, s in self.inputs.items() if not s.optional and n not in values)
        if missing:
            raise SchemaError(f"model {self.model!r} requires input(s) {missing} ({self.source})")
        return {name: self._array(self.inputs[name], value) for name, value in values.items()}

    def _array(self, spec: TensorSpec, value: Any) -> np.ndarray:
        items = list(value) if isinstance(value, list | tuple) else [value]
        if spec.datatype == "BYTES":
            items = [v.encode("utf-8") if isinstance(v, str) else v for v in items]
            arr = np.array(items, dtype=np.object_)
        else:
            try:
                arr = np.array(items, dtype=_NUMPY[spec.datatype])
            except (TypeError, ValueError) as e:
                raise SchemaError(f"input {spec.name!r} ({spec.datatype}) cannot hold {value!r}: {e}") from e
        if list(spec.dims).count(-1) > 1:
            raise SchemaError(f"input {spec.name!r} has dims {list(spec.dims)}: pass it as a numpy array")
        try:
            arr = arr.reshape(spec.dims)  # numpy infers the one variable (-1) dimension
        except ValueError as e:
            raise SchemaError(f"input {spec.name!r} has dims {list(spec.dims)} but got {arr.size} value(s)") from e
        return arr[np.newaxis, ...] if self.max_batch_size > 0 else arr


def _wire(type_name: str, where: str) -> str:
    if type_name not in _WIRE:
        raise SchemaError(f"{where}: unsupported data type {type_name!r} (known: {sorted(_WIRE)})")
    return _WIRE[type_name]


def _specs(entries: list[dict[str, Any]], where: str) -> dict[str, TensorSpec]:
    specs: dict[str, TensorSpec] = {}
    for e in entries:
        name = e["name"]
        specs[name] = TensorSpec(
            name=name,
            datatype=_wire(e["data_type"], f"{where} tensor {name}"),
            dims=tuple(int(d) for d in e["dims"]),  # JSON model configs carry int64 dims as strings
            optional=bool(e.get("optional", False)),  # proto3 JSON omits false booleans: absent means False
        )
    return specs


def from_model_config(cfg: Mapping[str, Any], source: str = "server model config", repo: Path | None = None) -> Schema:
    """Schema from a Triton model config in its JSON form (as `get_model_config(..., as_json=True)["config"]`);
    `repo`: the repository it was read from on disk (its relative paths are relative to it)."""
    for key in ("name", "input", "output"):
        if key not in cfg:
            raise SchemaError(f"{source}: model config has no {key!r} (keys: {sorted(cfg)})")
    name = str(cfg["name"])
    return Schema(
        model=name,
        max_batch_size=int(cfg.get("max_batch_size", 0)),  # proto3 JSON omits 0
        decoupled=bool(cfg.get("model_transaction_policy", {}).get("decoupled", False)),
        inputs=_specs(cfg["input"], f"{source} {name}"),
        outputs=_specs(cfg["output"], f"{source} {name}"),
        source=source,
        tokenizer=_tokenizer_path(_param(cfg, "tokenizer_dir"), repo),
    )


# The entry model a build names by default (builders/config.py TritonConfig: ensemble_model, llm_model): what a
# client calls when neither --model nor --repo says.
DEFAULT_ENTRY_MODELS = ("ensemble", "tensorrt_llm")
# The server's repository index is an admin endpoint (triton_repo/exposure.py): the header that opens it over gRPC
# and the environment variable eagle-launch reads the key from.
ADMIN_GRPC_HEADER = "triton-grpc-protocol-eagle-admin-key"
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"


def loaded_models(client: Any, timeout_s: float) -> list[str] | None:
    """The READY models of the server's repository index, or None when the index is closed to this client (it
    answers requests carrying $TRITON_ADMIN_KEY only)."""
    import os

    from tritonclient.utils import InferenceServerException

    key = os.environ.get(ADMIN_KEY_ENV)
    headers = {ADMIN_GRPC_HEADER: key} if key else None
    try:
        index = client.get_model_repository_index(headers=headers, as_json=True, client_timeout=timeout_s)
    except InferenceServerException:
        return None
    return sorted(m["name"] for m in index.get("models", []) if m.get("state") == "READY")


def _absent(url: str, model: str | None, client: Any, timeout_s: float) -> SchemaError:
    """The error for a model that is not served, naming the ones that are."""
    asked = f"model {model!r} is not loaded" if model else f"none of {list(DEFAULT_ENTRY_MODELS)} is loaded"
    models = loaded_models(client, timeout_s)
    if models is not None:
        where = f"loaded: {', '.join(models) or 'no model'}"
    else:
        ready = [m for m in DEFAULT_ENTRY_MODELS if _ready(client, m, timeout_s)]
        where = (f"the server's repository index is an admin endpoint (set {ADMIN_KEY_ENV} to its key to list every "
                 f"model); of the default entry models, ready: {', '.join(ready) or 'none'}")
    return SchemaError(f"{asked} at {url} ({where}); pass --model NAME, or --repo BUILD/triton_repo to read the model "
                       "name and tokenizer from the build's client.json")


def _ready(client: Any, model: str, timeout_s: float) -> bool:
    from tritonclient.utils import InferenceServerException

    try:
        return bool(client.is_model_ready(model, client_timeout=timeout_s))
    except InferenceServerException:
        return False


def fetch_schema(url: str, model: str | None, timeout_s: float = 10.0) -> Schema:
    """Ask a running server for `model`'s config over gRPC (and its ensemble steps' configs for the tokenizer).
    `model` None: the first of DEFAULT_ENTRY_MODELS that is ready. A model that is not served is an error naming
    the loaded ones."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)

    def get(name: str) -> Mapping[str, Any] | None:
        try:
            return client.get_model_config(name, as_json=True, client_timeout=timeout_s)["config"]
        except InferenceServerException:
            return None

    try:
        try:
            client.is_server_live(client_timeout=timeout_s)
        except InferenceServerException as e:
            raise SchemaError(f"cannot reach a Triton server at {url}: {e.message()}; is it running "
                              "(eagle-launch), and is --url its gRPC port?") from e
        name = model or next((m for m in DEFAULT_ENTRY_MODELS if _ready(client, m, timeout_s)), None)
        cfg = None if name is None else get(name)
        if name is None or cfg is None:
            raise _absent(url, model, client, timeout_s)
        tokenizer = find_tokenizer(cfg, get)
    finally:
        client.close()
    return replace(from_model_config(cfg, source=f"model config served at {url}"), tokenizer=tokenizer)


ConfigGetter = Callable[[str], Mapping[str, Any] | None]


def _param(cfg: Mapping[str, Any], key: str) -> str | None:
    params = cfg.get("parameters", {})  # proto3 JSON omits an empty map
    value = params[key].get("string_value") if key in params else None
    return value or None


def _tokenizer_path(value: str | None, repo: Path | None) -> str | None:
    """A `tokenizer_dir` the client can open: absolute as given, relative resolved against the repository on disk.
    A relative one read from a server names a directory next to the server's repository, which a client cannot
    locate: None (the commands then ask for --tokenizer)."""
    if value is None or Path(value).is_absolute():
        return value
    return None if repo is None else str((repo / value).resolve())


def find_tokenizer(cfg: Mapping[str, Any], get_config: ConfigGetter, repo: Path | None = None) -> str | None:
    """The `tokenizer_dir` parameter of the model, else of the first ensemble step that has one (the upstream
    preprocessing/postprocessing models carry it). `get_config(name)` returns a model's JSON config or None;
    `repo`: the repository on disk the configs come from (None: a server)."""
    own = _param(cfg, "tokenizer_dir")
    if own:
        return _tokenizer_path(own, repo)
    for step in cfg.get("ensemble_scheduling", {}).get("step", []):  # absent for non-ensemble models
        sub = get_config(step["model_name"])
        found = _param(sub, "tokenizer_dir") if sub is not None else None
        if found:
            return _tokenizer_path(found, repo)
    return None


def pbtxt_config(path: Path) -> dict[str, Any]:
    """A config.pbtxt parsed into the same JSON form the server returns."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    msg = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def repo_config_getter(repo: Path) -> ConfigGetter:
    def get(name: str) -> Mapping[str, Any] | None:
        f = repo / name / "config.pbtxt"
        return pbtxt_config(f) if f.is_file() else None

    return get


def from_repository(repo: Path, model: str | None = None) -> Schema:
    """Schema from a model repository on disk, or a build directory holding one (`triton_repo/`): its `client.json`
    when present (the build's contract: model name and tokenizer), else `<model>/config.pbtxt` (model None:
    `ensemble`). A `model` that differs from the one client.json names is an error."""
    if not (repo / CLIENT_FILE).is_file() and (repo / "triton_repo" / CLIENT_FILE).is_file():
        repo = repo / "triton_repo"  # a build directory
    if (repo / CLIENT_FILE).is_file():
        schema = from_descriptor(repo / CLIENT_FILE)
        if model is not None and model != schema.model:
            raise SchemaError(f"--model {model}: the build at {repo} serves {schema.model!r} (its {CLIENT_FILE}); "
                              "drop --model or pass that name")
        return schema
    get = repo_config_getter(repo)
    name = model or DEFAULT_ENTRY_MODELS[0]
    cfg = get(name)
    if cfg is None:
        raise SchemaError(f"{repo} has neither {CLIENT_FILE} nor {name}/config.pbtxt; pass the rendered repository "
                          "(BUILD/triton_repo) or the build directory")
    schema = from_model_config(cfg, source=f"{repo / name / 'config.pbtxt'}", repo=repo)
    return replace(schema, tokenizer=find_tokenizer(cfg, get, repo))


CLIENT_FILE = "client.json"  # builders/triton/render.py writes it into the repository root


def from_descriptor(path: Path) -> Schema:
    """Schema from a rendered repository's `client.json` (builders.triton.render.client_descriptor): a path to the
    file or to the repository. The tokenizer comes from the repository's ensemble steps next to it."""
    path = path / CLIENT_FILE if path.is_dir() else path
    if not path.is_file():
        raise SchemaError(f"no client descriptor at {path}; render the repository (build's triton stage) first")
    try:
        desc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SchemaError(f"{path}: not valid JSON ({e}); re-render the repository") from e
    missing = [k for k in ("model", "streaming", "max_batch_size", "inputs", "outputs") if k not in desc]
    if missing:
        raise SchemaError(f"{path}: descriptor lacks {missing}; re-render the repository with this version")
    wire = set(_WIRE.values())

    def specs(entries: list[dict[str, Any]]) -> dict[str, TensorSpec]:
        out: dict[str, TensorSpec] = {}
        for e in entries:
            if e["datatype"] not in wire:
                raise SchemaError(f"{path}: tensor {e['name']} has unknown datatype {e['datatype']!r}")
            out[e["name"]] = TensorSpec(e["name"], e["datatype"], tuple(e["dims"]), e["optional"], e["default"],
                                        e["description"])
        return out

    repo = path.parent
    get = repo_config_getter(repo)
    ensemble = get(desc["model"])
    tokenizer = (_tokenizer_path(desc["tokenizer"], repo) if desc.get("tokenizer")  # relative to the repository
                 else None if ensemble is None else find_tokenizer(ensemble, get, repo))
    return Schema(
        model=desc["model"],
        max_batch_size=int(desc["max_batch_size"]),
        decoupled=bool(desc["streaming"]),
        inputs=specs(desc["inputs"]),
        outputs=specs(desc["outputs"]),
        source=str(path),
        tokenizer=tokenizer,
        extra={k: v for k, v in desc.items() if k not in ("inputs", "outputs")},
    )
