"""Every tensor of the target and of either head layout is shape-checked against its config before any byte is read
(builders/convert/shapes.py): for EVERY tensor, one row short, one row long and (2-D) one column wide are each
refused with the tensor, its file, the expected and the found shape named, and nothing is written; through the CLI
the build exits 2 with the same text. A short tensor used to be read past its end (into its neighbour's bytes)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from builders import build
from builders.convert import convert_eagle, convert_eagle3, convert_llama
from builders.convert.weights import WeightFileError, WeightSource
from core.hfconfig import ModelConfigError
from tests.test_config_cli import write_cfg

LIMITS = {"max_draft_len": 6, "num_eagle_layers": 3, "max_non_leaves_per_layer": 2}


def _variants(t: torch.Tensor) -> list[torch.Tensor]:
    """One row short, one row long and (2-D) one column wide: every way a header can disagree with its config."""
    out = [t[:-1].contiguous(), torch.cat([t, t[:1]], 0)]
    if t.dim() == 2:
        out.append(torch.cat([t, t[:, :1]], 1))
    return out


def _damaged(src: Path, dst: Path, name: str, value: torch.Tensor) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors[name] = value
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _sweep(model: Path, tmp_path: Path, convert: Callable[[Path, Path], None], skip: tuple[str, ...] = ()) -> int:
    tensors = load_file(str(model / "model.safetensors"))
    n = 0
    for name, t in tensors.items():
        if name in skip:
            continue
        for i, bad in enumerate(_variants(t)):
            d = _damaged(model, tmp_path / f"{name}-{i}", name, bad)
            out = tmp_path / f"out-{name}-{i}"
            with pytest.raises(ModelConfigError) as e:
                convert(d, out)
            msg = str(e.value)
            assert f"tensor {name} in {d / 'model.safetensors'} has shape {tuple(bad.shape)}" in msg, msg
            assert f"expected {tuple(t.shape)}" in msg, msg
            assert not out.exists(), f"{name}: something was written"
            shutil.rmtree(d)
            n += 1
    return n


def test_every_target_tensor(tiny_target: Path, tmp_path: Path) -> None:
    n = _sweep(tiny_target, tmp_path, lambda d, out: convert_llama(d, out, dtype="float32"))
    assert n >= 50


def test_every_eagle_head_tensor(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    n = _sweep(eagle_head, tmp_path,
               lambda d, out: convert_eagle(tiny_target, d, out, dtype="float32", tp=2, **LIMITS))
    assert n >= 25


def test_every_eagle3_head_tensor(tiny_target: Path, eagle3_head: Path, tmp_path: Path) -> None:
    # d2t/t2d lengths and lm_head rows are the draft vocabulary: their own message (test_convert_eagle) names it.
    n = _sweep(eagle3_head, tmp_path,
               lambda d, out: convert_eagle3(tiny_target, d, out, dtype="float32", layers_to_capture=None),
               skip=("fc.weight",))
    assert n >= 35


def test_target_tensor_inside_eagle_build(tiny_target: Path, eagle_head: Path, tmp_path: Path) -> None:
    bad = _damaged(tiny_target, tmp_path / "t", "model.layers.1.self_attn.v_proj.weight",
                   load_file(str(tiny_target / "model.safetensors"))["model.layers.1.self_attn.v_proj.weight"][:-1])
    with pytest.raises(ModelConfigError, match=r"tensor model\.layers\.1\.self_attn\.v_proj\.weight in .* has shape "
                                               r"\(31, 64\), expected \(32, 64\)"):
        convert_eagle(bad, eagle_head, tmp_path / "out", dtype="float32", **LIMITS)
    assert not (tmp_path / "out").exists()


def test_reads_never_leave_the_tensor(tiny_target: Path) -> None:
    with WeightSource(tiny_target) as src:
        for args in ((0, 0, 321), (0, -1, 4), (1, 0, 65), (0, 5, 4)):
            with pytest.raises(WeightFileError, match=r"'lm_head.weight' has shape \(320, 64\); .* is outside it"):
                src.read("lm_head.weight", *args)
        with pytest.raises(WeightFileError, match="is outside it"):
            src.byte_range("lm_head.weight", 0, 321)


@pytest.mark.parametrize("name", ["fc.bias", "layers.0.self_attn.q_proj.weight"])
def test_build_cli_refuses_with_exit_2(name: str, tiny_target: Path, eagle_head: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    t = load_file(str(eagle_head / "model.safetensors"))[name]
    bad = _damaged(eagle_head, tmp_path / "head", name, t[:-1].contiguous())
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, str(bad), out)
    assert build.main([str(cfg), "--only", "checkpoint"]) == 2
    err = capsys.readouterr().err
    assert f"tensor {name} in {bad / 'model.safetensors'} has shape {tuple(t[:-1].shape)}, expected " \
           f"{tuple(t.shape)}" in err
    assert "Traceback" not in err and not (out / "checkpoint").exists()
