"""The kernel chosen per bf16 weight shape by measurement at load (engines/kernel_choice.py, engines/linear.py):
the choice follows the timings (given through the timer seam), is cached per shape and machine, is what the linear
then multiplies with, is reported, and a bf16 engine decodes the same tokens from load to load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core.trees import DraftTree
from engines import kernel_choice, skinny
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.kernel_choice import ALWAYS, KERNEL, NATIVE, ROWS, kernel_rows
from engines.linear import Linear, describe_layouts, layout_for, linears, native_16bit, prepare_linears
from tests.conftest import convert_eagle_ckpt

pytestmark = pytest.mark.usefixtures("one_thread")

measured_here = pytest.mark.skipif(
    layout_for(torch.device("cpu"), torch.bfloat16) != "bf16 measured",
    reason="bf16 is chosen by measurement only where oneDNN multiplies bf16 natively and the AVX2 kernel builds",
)


class Timings:
    """A timer for `choose`: the kernel costs `kernel_ms(rows)`, oneDNN `native_ms(rows)`; records its calls."""

    def __init__(self, kernel_up_to: int) -> None:
        self.kernel_up_to, self.calls = kernel_up_to, []  # type: tuple[int, list[tuple[str, int, int, int]]]

    def __call__(self, name: str, n: int, k: int, rows: int) -> float:
        self.calls.append((name, n, k, rows))
        if name == KERNEL:
            return 1e-3 if rows <= self.kernel_up_to else 3e-3
        return 2e-3


def refuse(name: str, n: int, k: int, rows: int) -> float:
    raise AssertionError(f"measured {name} {n}x{k} at {rows} rows; the cached choice should have been used")


@pytest.fixture
def fresh_choices(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty choice cache (in memory and on disk); the kernel library itself is built where it was."""
    lib = skinny._load()[0]
    monkeypatch.setenv("EAGLE_DEPLOY_KERNELS", str(tmp_path / "kernels"))
    kernel_choice.forget()
    if lib is not None:  # keep using the already built kernel (its cache dir moved with the env var)
        monkeypatch.setattr(skinny, "_load", lambda: (lib, None))
    yield tmp_path / "kernels"
    kernel_choice.forget()


def test_kernel_rows_is_where_the_kernel_stops_winning() -> None:
    native = [2.0] * len(ROWS)
    assert kernel_rows([1.0] * len(ROWS), native) == ALWAYS
    assert kernel_rows([3.0] * len(ROWS), native) == 0
    assert kernel_rows([1.0, 1.5, 2.0, 2.5, 1.0, 1.0], native) == 4  # ties go to the kernel; a later win does not count


def test_choice_follows_the_timings_and_is_cached_per_shape_and_machine(fresh_choices: Path) -> None:
    t = Timings(kernel_up_to=4)
    c = kernel_choice.choose(96, 64, timer=t)
    assert c.kernel_rows == 4 and not c.cached
    assert sorted(t.calls) == sorted((name, 96, 64, r) for name in (KERNEL, NATIVE) for r in ROWS)
    assert c.ms[KERNEL][:3] == [1.0, 1.0, 1.0] and c.ms[NATIVE][0] == 2.0
    assert c.describe() == ("96x64: AVX2 kernel up to 4 rows, oneDNN bf16 above (1 row: AVX2 kernel 1.000 ms, "
                            "oneDNN bf16 2.000 ms)")
    assert kernel_choice.choose(96, 64, timer=refuse) is c  # in memory
    first_file = kernel_choice.cache_file()
    saved = json.loads(first_file.read_text())
    assert first_file.parent == fresh_choices
    assert saved["shapes"]["bfloat16 96x64"]["kernel_rows"] == 4 and saved["machine"] == kernel_choice.machine()
    kernel_choice.forget()  # a later load on the same machine: read from the file, not measured
    again = kernel_choice.choose(96, 64, timer=refuse)
    assert again.kernel_rows == 4 and again.cached and again.describe().endswith(", cached)")
    other = kernel_choice.choose(64, 96, timer=Timings(kernel_up_to=0))  # another shape is measured on its own
    assert other.kernel_rows == 0 and other.describe().startswith("64x96: oneDNN bf16 at every row count")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another machine setting: another cache file, measured again
    try:
        kernel_choice.forget()
        assert kernel_choice.cache_file() != first_file and not kernel_choice.cache_file().exists()
        assert kernel_choice.choose(96, 64, timer=Timings(kernel_up_to=ALWAYS)).kernel_rows == ALWAYS
    finally:
        torch.set_num_threads(threads)


@measured_here
def test_a_measured_linear_multiplies_with_the_kernel_up_to_its_rows_and_onednn_above(fresh_choices: Path) -> None:
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(96, 64, generator=g).bfloat16(), torch.randn(96, generator=g).bfloat16()
    lin = Linear(w.clone(), b.clone())
    assert prepare_linears(lin, timer=Timings(kernel_up_to=4)) == 1 and prepare_linears(lin, timer=refuse) == 0
    assert lin.choice is not None and lin.choice.kernel_rows == 4 and lin.panels is not None
    assert torch.equal(lin.weight, w) and lin.weight_t is None
    for rows in (1, 3, 4):
        x = torch.randn(rows, 64, generator=g).bfloat16()
        kernel = skinny.matmul(x.float(), skinny.pack(w), 96, b.float()).bfloat16()
        assert torch.equal(lin(x), kernel)
    for rows in (5, 8, 33):
        x = torch.randn(1, rows, 64, generator=g).bfloat16()
        assert torch.equal(lin(x), F.linear(x, w, b))
    never = Linear(torch.randn(32, 64, generator=g).bfloat16())
    prepare_linears(never, timer=Timings(kernel_up_to=0))
    assert never.choice is not None and never.panels is None  # no panels kept for a kernel that is never used
    x = torch.randn(1, 64, generator=g).bfloat16()
    assert torch.equal(never(x), F.linear(x, never.weight))
    lines = describe_layouts([lin, never])
    where = kernel_choice.cache_file()
    assert lines == [f"bf16, chosen at load by measurement ({where}): 32x64: oneDNN bf16 at every row count (1 row: "
                     "AVX2 kernel 3.000 ms, oneDNN bf16 2.000 ms)",
                     f"bf16, chosen at load by measurement ({where}): 96x64: AVX2 kernel up to 4 rows, oneDNN bf16 "
                     "above (1 row: AVX2 kernel 1.000 ms, oneDNN bf16 2.000 ms)"]


def test_other_layouts_are_reported_without_measuring() -> None:
    fp32 = Linear(torch.randn(32, 16))
    prepare_linears(fp32, timer=refuse)
    multi = "the AVX2 kernel on float32 panels" if skinny.unavailable() is None else "oneDNN on its packed weight"
    if skinny.unavailable() is not None and not torch.backends.mkldnn.is_available():
        multi = "ATen"
    assert describe_layouts(fp32) == [f"float32 kernels: MKL on W^T for one row, {multi} for more"]
    if not native_16bit(torch.float16):
        return
    fp16 = Linear(torch.randn(32, 16).half())
    prepare_linears(fp16, timer=refuse)
    assert describe_layouts(fp16) == ["float16 on cpu: the weight as stored (F.linear)"]


@measured_here
def test_a_bf16_engine_reports_its_choice_and_decodes_alike_from_load_to_load(
        fresh_choices: Path, tiny_dir: Path, tiny_target: Path, eagle_head: Path) -> None:
    """The first load measures (the real timer), later loads read the machine's choices, and greedy EAGLE outputs
    are the same tokens every time; with either kernel forced by the timings, outputs are equally repeatable."""
    ckpt = convert_eagle_ckpt(tiny_target, eagle_head, tiny_dir / "ckpt_eagle_bf16", dtype="bfloat16")
    tree = DraftTree.from_choices([[0], [1], [0, 0]])
    req = GenerationRequest(prompt_ids=[5, 9, 17, 3], max_new_tokens=24, sampling=SamplingParams(),
                            stop_token_ids=[])

    def decode() -> tuple[list[int], tuple[str, ...]]:
        e = ReferenceEngine.from_checkpoint(ckpt, tree=tree, dtype="bfloat16", device="cpu")
        [r] = e.generate([req])
        return r.output_ids, e.kernels

    first, kernels = decode()
    assert kernels and all(line.startswith("bf16, chosen at load by measurement (") for line in kernels)
    assert not any(line.endswith(", cached)") for line in kernels)
    kernel_choice.forget()
    again, cached = decode()
    assert again == first and all(line.endswith(", cached)") for line in cached)
    e = ReferenceEngine.from_checkpoint(ckpt, tree=tree, dtype="bfloat16", device="cpu")
    shapes = {tuple(lin.weight.shape) for lin in linears(e._rt.target, e._rt.drafter)}
    for up_to, says in ((ALWAYS, "AVX2 kernel at every row count"), (0, "oneDNN bf16 at every row count")):
        kernel_choice.forget()
        kernel_choice.cache_file().unlink()
        for n, k in shapes:  # this machine's choices, as if measured so
            kernel_choice.choose(n, k, timer=Timings(kernel_up_to=up_to))
        out, lines = decode()
        kernel_choice.forget()
        again, cached = decode()
        assert again == out and cached == tuple(line.removesuffix(")") + ", cached)" for line in lines)
        assert len(lines) == len(shapes) and all(says in line for line in lines)
