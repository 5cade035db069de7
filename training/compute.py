"""Devices, precision and threads for training (the `compute:` section), resolved once and passed down.

`resolve_compute` turns the config into a `Compute`: the torch device of this process (cuda:LOCAL_RANK under
torchrun), the target's weight dtype, whether the head trains under bf16 autocast, and the CPU thread count. The
target is loaded by `load_target` in that dtype on that device (or spread over all GPUs with device_map="auto").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from training.config import ComputeConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class ComputeError(RuntimeError):
    """The compute settings cannot be honoured on this machine; the message says what to change."""


@dataclass(frozen=True)
class Compute:
    device: torch.device  # where the head trains and (unless device_map) the target runs
    bf16: bool  # True: target weights in bf16, head forward/backward under bf16 autocast
    threads: int  # torch intra-op threads of this process
    device_map: bool  # target spread over all visible GPUs (accelerate device_map="auto")

    @property
    def target_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on this device when bf16 is on; a no-op context otherwise."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def describe(self) -> str:
        prec = "bf16 (target weights bf16, head under autocast)" if self.bf16 else "float32"
        where = "device_map=auto over all GPUs" if self.device_map else str(self.device)
        return f"{where}, {prec}, {self.threads} CPU threads"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: the CPU computes bf16 matmuls natively (oneDNN); without them torch emulates them."""
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
                break
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_compute(cc: ComputeConfig, local_rank: int = 0, local_world: int = 1) -> Compute:
    """The Compute of this process; raises ComputeError naming the field when the machine cannot do what is asked."""
    cuda = torch.cuda.is_available()
    if cc.device == "cuda" and not cuda:
        raise ComputeError("compute.device=cuda but torch sees no CUDA device (CPU-only torch build, or no GPU); "
                           "set compute.device: auto or cpu")
    use_cuda = cc.device == "cuda" or (cc.device == "auto" and cuda)
    if cc.target_device_map == "auto" and not use_cuda:
        raise ComputeError("compute.target_device_map=auto spreads the target over GPUs, but this run is on the CPU; "
                           "set compute.target_device_map: none")
    if cc.target_device_map == "auto" and local_world > 1:
        raise ComputeError("compute.target_device_map=auto uses every GPU in one process; under torchrun each rank "
                           "holds its own target. Build features with `--until features` in one process, then "
                           "train with torchrun and compute.target_device_map: none")
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if cc.precision == "auto":
        bf16 = torch.cuda.is_bf16_supported() if use_cuda else cpu_has_native_bf16()
    else:
        bf16 = cc.precision == "bfloat16"
    threads = cc.threads or max(1, usable_cores() // max(1, local_world))
    return Compute(device=device, bf16=bf16, threads=threads, device_map=cc.target_device_map == "auto")


def apply_compute(c: Compute, tf32: bool) -> None:
    """Process-wide torch settings: thread count, TF32 (CUDA), the current CUDA device."""
    torch.set_num_threads(c.threads)
    if c.device.type == "cuda":
        torch.cuda.set_device(c.device)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def load_target(target: str, c: Compute) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Path]:
    """(model, tokenizer, target_dir): the HF target in c.target_dtype on c.device (or device_map="auto"), eval mode."""
    from transformers import AutoTokenizer

    from core.config_input import ConfigError
    from engines.api import load_causal_lm  # AutoModelForCausalLM, or a multimodal wrapper's text model (Kimi-K2.5)
    from sources.targets import resolve_target

    target_dir = resolve_target(target)
    tok = AutoTokenizer.from_pretrained(target_dir)
    if tok.chat_template is None:
        raise ConfigError([f"target {target_dir}: its tokenizer has no chat template; EAGLE data needs one"])
    if c.device_map:
        model = load_causal_lm(target_dir, dtype=c.target_dtype, device_map="auto")
    else:
        model = load_causal_lm(target_dir, dtype=c.target_dtype).to(c.device)
    return model.eval().requires_grad_(False), tok, target_dir


def input_device(model: PreTrainedModel) -> torch.device:
    """Where the target's input ids go (its embedding's device; the first GPU under device_map="auto")."""
    return model.get_input_embeddings().weight.device


@contextlib.contextmanager
def no_grad_autocast(c: Compute) -> Iterator[None]:
    with torch.no_grad(), c.autocast():
        yield
