"""The Dynamo deployment a build writes (builders/dynamo/stage.py) and the serve-time side reads:

    <build>/dynamo/deployment.json    served model name, KV block size, namespace, the engine YAMLs' names
    <build>/dynamo/model/             the model card directory `register_model` reads: the target's Hugging Face
                                      config.json and the tokenizer's files
    <build>/dynamo/engine/            the TensorRT-LLM worker's LLM API YAMLs (--extra-engine-args): agg.yaml,
                                      prefill.yaml, decode.yaml
    <build>/dynamo/launch.sh          the commands for dynamo.frontend and dynamo.trtllm on a GPU machine
    <build>/dynamo/deploy-agg.yaml    DynamoGraphDeployments for the Dynamo Kubernetes operator: aggregated, and
    <build>/dynamo/deploy-disagg.yaml prefill + decode
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DYNAMO_DIR = "dynamo"
DEPLOYMENT = "deployment.json"
MODEL_DIR = "model"
ENGINE_DIR = "engine"
LAUNCH = "launch.sh"
GRAPHS = {"agg": "deploy-agg.yaml", "disagg": "deploy-disagg.yaml"}
NAMESPACE = "eagle"  # the Dynamo namespace the workers register in (one per deployment)
DYNAMO_VERSION = "1.6.1"  # the ai-dynamo release the files are written for and tested with


class DeploymentMissing(RuntimeError):
    """The build has no Dynamo deployment (or an unreadable one); the message says how to write it."""


@dataclass(frozen=True)
class Card:
    """What a worker registers: the model card directory and the names the frontend serves."""

    model_dir: Path
    served_model_name: str
    kv_block_size: int
    namespace: str


def dynamo_dir(build_dir: Path) -> Path:
    return Path(build_dir) / DYNAMO_DIR


def read_card(build_dir: Path) -> Card:
    f = dynamo_dir(build_dir) / DEPLOYMENT
    try:
        doc = json.loads(f.read_text())
    except FileNotFoundError:
        raise DeploymentMissing(
            f"{f} not found: this build has no Dynamo deployment; builds with trtllm_version '1.4' write one "
            "(rerun `python builders/build.py CONFIG`)") from None
    except ValueError as e:
        raise DeploymentMissing(f"{f} is not valid JSON ({e}); rerun the build with --force") from None
    return Card(model_dir=dynamo_dir(build_dir) / MODEL_DIR, served_model_name=str(doc["served_model_name"]),
                kv_block_size=int(doc["kv_block_size"]), namespace=str(doc["namespace"]))
