"""One doctor run: read target and head, run every static check, then the measured ones."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from doctor import static
from doctor.config_check import read_json_config
from doctor.findings import Finding, Report, UnusableInput
from doctor.head import read_head
from core.hfconfig import ModelConfigError, llama_spec


def diagnose(target_dir: Path, head_dir: Path, *, engine: str, draft_type: str | None, max_seq_len: int | None,
             measure: bool, prompts: list[str] | None = None, max_new_tokens: int = 48, depth: int = 3,
             work: Path | None = None) -> Report:
    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        return _diagnose(target_dir, head_dir, engine=engine, draft_type=draft_type, max_seq_len=max_seq_len,
                         measure=measure, prompts=prompts, max_new_tokens=max_new_tokens, depth=depth,
                         work=Path(work) if work is not None else Path(tmp))


def _diagnose(target_dir: Path, head_dir: Path, *, engine: str, draft_type: str | None, max_seq_len: int | None,
              measure: bool, prompts: list[str] | None, max_new_tokens: int, depth: int, work: Path) -> Report:
    t0 = time.perf_counter()
    target_dir = resolve(target_dir)
    read_json_config(target_dir, "--target")  # a bounded regular file, its counts in range, before any work
    try:
        target = llama_spec(target_dir, require_arch=False)
    except (ModelConfigError, TypeError) as e:
        raise UnusableInput(f"--target: {e}") from None
    head = read_head(head_dir)
    if draft_type is not None and draft_type != head.draft_type:
        raise UnusableInput(f"--draft-type {draft_type} but {head_dir} is an {head.draft_type} head "
                            f"({', '.join(head.markers)}); drop --draft-type or give the right head")
    rep = Report(str(target_dir), str(head_dir), head.draft_type, head.layout, engine)
    checked = head
    if head.layout == "speculators":  # the shape checks read a flat layout: convert a copy
        from doctor.export import import_speculators

        checked = read_head(import_speculators(head.dir, work / "imported_head"))
        checked.layout = "speculators"
    rep.add(
        [Finding("format", "info", f"{head.draft_type} head in the {head.layout} layout", {"markers": head.markers})]
    )
    rep.add(static.random_head_check(checked))
    rep.add(static.shape_checks(checked, target, checked.dir))
    rep.add(static.layer_shape_checks(checked))
    rep.add(static.bias_checks(checked))
    rep.add(static.value_checks(checked))
    rep.add(static.layer_id_agreement(checked))
    rep.add(static.head_template_checks(checked, target_dir))
    rep.add(static.d2t_checks(checked, target))
    rep.add(static.layer_checks(checked, target))
    rep.add(static.rope_checks(checked, target))
    rep.add(static.position_checks(checked, target, max_seq_len))
    rep.add(static.tokenizer_checks(checked, target_dir, target))
    rep.add(static.embedding_checks(checked, target_dir, target))
    loader, table = static.loader_checks(head, target, engine)
    rep.add(loader)
    rep.compatibility = table
    if measure:
        from doctor.measure import measure_head

        measure_head(rep, checked, target_dir, target, prompts=prompts, max_new_tokens=max_new_tokens,
                     depth=depth, work=work / "measured")
    rep.seconds = round(time.perf_counter() - t0, 2)
    return rep


def resolve(target: Path) -> Path:
    """An HF directory as it is; a `.gguf` file or `pip:<distribution>` through sources.targets (extracted
    once, cached), as the build's target.model accepts them."""
    if Path(target).is_dir():
        return Path(target)
    from sources.targets import ModelSourceError, resolve_target

    try:
        return resolve_target(str(target))
    except ModelSourceError as e:
        raise UnusableInput(f"--target {target}: {e}") from None
