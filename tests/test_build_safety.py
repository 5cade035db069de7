"""The build writes only what it owns (builders/build_dir.py): foreign stage directories, logs and config files are
never replaced (`--force` included), output_dir may not be the project's sources, a parent of them, a file or a
path the python backend cannot serve from; temp directories of dead builds are removed; a skipped stage re-checks
its outputs (sizes always, hashes with --verify). The checkpoint stage with a random head is the cheap stage used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builders import build
from core.atomic import TEMP_MARKER, atomic_dir
from builders.build_dir import PROJECT_ROOT, output_dir_problems
from triton_repo.launch import unsafe_chars
from tests.test_config_cli import write_cfg

ONLY = ["--only", "checkpoint"]


def run(cfg: Path, *extra: str) -> int:
    return build.main([str(cfg), *ONLY, *extra])


def test_foreign_stage_dir_is_never_replaced_even_with_force(tiny_target: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "precious.txt").write_text("not yours")
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    for extra in ((), ("--force",)):
        assert run(cfg, *extra) == 2
        err = capsys.readouterr().err
        assert f"{out / 'checkpoint'} exists without this build's manifest.json (stage 'checkpoint')" in err
        assert "--force does not change that" in err
    assert (out / "checkpoint" / "precious.txt").read_text() == "not yours"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"], "nothing may be written"


def test_foreign_logs_and_resolved_config_are_refused(tiny_target: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "checkpoint.log").write_text("my own log")
    (out / "logs" / "notes.txt").write_text("mine")
    (out / "config.resolved.yaml").write_text("my: own\n")
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 2
    err = capsys.readouterr().err
    assert f"{out / 'logs' / 'checkpoint.log'} was not written by this build (no logs/.eagle-deploy-logs)" in err
    assert f"{out / 'config.resolved.yaml'} exists and was not written by this build" in err
    assert (out / "config.resolved.yaml").read_text() == "my: own\n" and not (out / "checkpoint").exists()
    assert (out / "logs" / "checkpoint.log").read_text() == "my own log"
    # Other files in logs/ are never touched: no reason to refuse.
    (out / "logs" / "checkpoint.log").unlink()
    (out / "config.resolved.yaml").unlink()
    assert run(cfg) == 0 and (out / "logs" / "notes.txt").read_text() == "mine"
    assert (out / "logs" / ".eagle-deploy-logs").is_file() and (out / "logs" / "checkpoint.log").stat().st_size > 0


def test_log_that_is_a_link_is_refused(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "precious.log"
    elsewhere.write_text("keep")
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 0
    (out / "logs" / "checkpoint.log").unlink()
    (out / "logs" / "checkpoint.log").symlink_to(elsewhere)
    assert run(cfg, "--force") == 2
    assert f"{out / 'logs' / 'checkpoint.log'} exists and is not a log file this build wrote" in capsys.readouterr().err
    assert elsewhere.read_text() == "keep"


@pytest.mark.parametrize("where", ["root", "parent", "sources"])
def test_output_dir_in_or_above_the_project_is_refused(where: str, tiny_target: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    target = {"root": PROJECT_ROOT, "parent": PROJECT_ROOT.parent, "sources": PROJECT_ROOT / "triton_repo" / "b"}[where]
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "unused")
    before = sorted(p.name for p in (PROJECT_ROOT / "triton_repo").iterdir())
    assert run(cfg, "--set", f"output_dir={target}") == 2
    err = capsys.readouterr().err
    if where == "sources":
        assert f"output_dir {target} is inside the project's sources ({PROJECT_ROOT / 'triton_repo'})" in err
    else:
        assert f"output_dir {target} is the project directory {PROJECT_ROOT} or a parent of it" in err
    assert sorted(p.name for p in (PROJECT_ROOT / "triton_repo").iterdir()) == before
    assert output_dir_problems(PROJECT_ROOT / "build" / "x") == []  # build/ of a clone is fine


def test_relative_dotdot_from_a_config_in_configs_is_refused(tiny_target: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    """`output_dir: ..` in a config under configs/ resolves to the clone itself."""
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", Path(".."))
    text = cfg.read_text()
    inside = PROJECT_ROOT / "configs" / f".test-dotdot-{tmp_path.name}.yaml"
    inside.write_text(text)
    try:
        assert build.main([str(inside), *ONLY]) == 2
    finally:
        inside.unlink()
    assert f"output_dir {PROJECT_ROOT} is the project directory" in capsys.readouterr().err


def test_output_dir_that_is_a_file(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", f)
    assert run(cfg) == 2
    assert f"output_dir {f} exists and is not a directory; point output_dir at a directory" in capsys.readouterr().err
    assert f.read_text() == "x"


@pytest.mark.parametrize("name", ["with space", "quote'd", "dollar$x", "semi;colon", "tab\tname", "paren(x)",
                                  "caf\u00e9"])
def test_output_dir_the_python_backend_cannot_serve_is_refused(name: str, tiny_target: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / name
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 2
    err = capsys.readouterr().err
    assert f"output_dir {str(out)!r} contains" in err and "std::invalid_argument stol" in err
    assert not out.exists()
    assert unsafe_chars("/data/builds/llama-3.1_8B+eagle,v2:@=%") == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _killed_inside_atomic_dir(final: Path) -> int:
    """A process that dies (os._exit, as after SIGKILL: no cleanup runs) while writing `final` with atomic_dir."""
    code = ("import os, sys; from pathlib import Path; from core.atomic import atomic_dir\n"
            "with atomic_dir(Path(sys.argv[1])) as t:\n"
            "    (t / 'sub').mkdir(); (t / 'sub' / 'weights.bin').write_bytes(bytes(1024)); os._exit(9)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(final)], cwd=PROJECT_ROOT,
                            env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
    assert proc.wait() == 9
    return proc.pid


def test_temp_dirs_of_dead_builds_are_removed(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 0
    dead = [out / f".checkpoint.tmp-{_killed_inside_atomic_dir(out / 'checkpoint')}",
            out / f".engine.tmp-{_killed_inside_atomic_dir(out / 'engine')}"]
    old = out / f".checkpoint.old-{_dead_pid()}"  # a replaced stage dir: our manifest of that stage
    shutil.copytree(out / "checkpoint", old)
    live = out / f".engine.tmp-{os.getppid()}"  # a running process: maybe a concurrent build
    shutil.copytree(dead[1], live)
    assert all(d.is_dir() for d in dead)
    assert run(cfg) == 0
    text = capsys.readouterr().out
    assert all(not d.exists() and f"removing {d}: left by a build that is no longer running" in text
               for d in (*dead, old))
    assert live.is_dir() and "[checkpoint] unchanged, skipped" in text


def _foreign_dirs(out: Path, pid: int) -> dict[str, Path]:
    """Directories shaped like our temp dirs that this build did not write: other names, our names without our
    marker, links, an `.old-` holding another stage's manifest, the marker as a link."""
    elsewhere = out.parent / "elsewhere"
    (elsewhere / "pic").mkdir(parents=True, exist_ok=True)
    (elsewhere / TEMP_MARKER).write_text("x")
    made = {
        "other name": out / f".photos.tmp-{pid}",
        "other name, marked": out / f".photos.old-{pid}",
        "stage name, unmarked": out / f".checkpoint.tmp-{pid}",
        "old without manifest": out / f".triton_repo.old-{pid}",
        "old of another stage": out / f".engine.old-{pid}",
        "marker is a link": out / f".engine.tmp-{pid}",
    }
    for d in made.values():
        d.mkdir()
        (d / "pic.jpg").write_bytes(b"\xff\xd8 precious")
    (made["other name, marked"] / TEMP_MARKER).write_text("x")
    shutil.copy(out / "checkpoint" / "manifest.json", made["old of another stage"] / "manifest.json")
    (made["marker is a link"] / TEMP_MARKER).symlink_to(elsewhere / TEMP_MARKER)
    link = out / f".checkpoint.tmp-{pid + 1}"
    link.symlink_to(elsewhere)
    made["link to a marked dir"] = link
    return made


def test_dirs_we_did_not_write_are_never_removed(tiny_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 0
    made = _foreign_dirs(out, _dead_pid())
    assert run(cfg, "--force") == 0
    for why, d in made.items():
        assert d.exists(), f"{why}: {d} was removed"
    assert all((d / "pic.jpg").read_bytes() == b"\xff\xd8 precious" for d in made.values() if not d.is_symlink())
    assert (tmp_path / "elsewhere" / "pic").is_dir()


def test_foreign_dir_under_our_own_temp_name_is_refused_not_removed(tiny_target: Path, tmp_path: Path) -> None:
    final = tmp_path / "checkpoint"
    mine = final.with_name(f".checkpoint.tmp-{os.getpid()}")
    (mine / "keep").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="was not written by this build"), atomic_dir(final):
        pass
    assert (mine / "keep").is_dir() and not final.exists()


@pytest.mark.parametrize("kind", ["hard link", "symlink"])
def test_log_and_resolved_config_linked_elsewhere_are_never_written(kind: str, tiny_target: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 0
    for name in ("logs/checkpoint.log", "config.resolved.yaml"):
        outside = tmp_path / f"outside-{name.replace('/', '-')}"
        outside.write_bytes((out / name).read_bytes())  # even a copy of what we wrote (our marker line included)
        (out / name).unlink()
        (out / name).hardlink_to(outside) if kind == "hard link" else (out / name).symlink_to(outside)
        before = outside.read_bytes()
        assert run(cfg, "--force") == 2
        assert f"{out / name} " in capsys.readouterr().err
        assert outside.read_bytes() == before
        (out / name).unlink()
        shutil.copy(outside, out / name)


@pytest.mark.parametrize("text", ["derived:\n  max_draft_len: 3\n", "name: mine\nderived:\n  x: 1\n", ""])
def test_users_resolved_config_is_never_replaced(text: str, tiny_target: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.resolved.yaml").write_text(text)
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 2
    assert f"{out / 'config.resolved.yaml'} exists and was not written by this build" in capsys.readouterr().err
    assert (out / "config.resolved.yaml").read_text() == text and not (out / "checkpoint").exists()


def test_resolved_config_of_an_earlier_build_without_the_marker_is_still_ours(
    tiny_target: Path, tmp_path: Path
) -> None:
    """Builds from before the marker line wrote config.resolved.yaml with its `derived:` section only; next to a
    stage directory carrying our manifest it is still replaced (and gets the marker)."""
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 0
    resolved = out / "config.resolved.yaml"
    resolved.write_text(resolved.read_text().split("\n", 1)[1])  # without the marker line, as older builds wrote it
    assert "derived:" in resolved.read_text() and not resolved.read_text().startswith("# eagle-deploy")
    assert run(cfg) == 0 and resolved.read_text().startswith("# eagle-deploy")


@pytest.mark.parametrize("field", ["output_dir", "target.model", "draft.model", "draft.draft_vocab"])
@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_empty_paths_are_refused(field: str, value: str, tiny_target: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", tmp_path / "out")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert build.main([str(cfg), *ONLY, "--set", f"{field}={json.dumps(value) if value else ''}"]) == 2
    err = capsys.readouterr().err
    assert f"{field}: empty path {value!r}; give a path" in err
    assert "required field is missing" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_damaged_outputs_are_rebuilt_sizes_always_hashes_with_verify(tiny_target: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cfg = write_cfg(tmp_path / "c.yaml", tiny_target, "random", out)
    assert run(cfg) == 0
    ck = out / "checkpoint"
    weights, good = ck / "rank0.safetensors", (ck / "rank0.safetensors").read_bytes()
    capsys.readouterr()

    weights.write_bytes(good[: len(good) // 2])  # truncated
    assert run(cfg) == 0
    text = capsys.readouterr().out
    assert f"outputs changed since the build, rebuilding: {weights} has {len(good) // 2} bytes, the build wrote " \
           f"{len(good)}" in text and "[checkpoint] done" in text
    assert weights.read_bytes() == good

    (ck / "tokenizer" / "tokenizer.json").unlink()
    assert run(cfg) == 0
    assert f"{ck / 'tokenizer' / 'tokenizer.json'} is missing" in capsys.readouterr().out
    assert (ck / "tokenizer" / "tokenizer.json").is_file()

    flipped = bytearray(good)
    flipped[-1] ^= 0xFF  # same size, different contents: only a hash sees it
    weights.write_bytes(bytes(flipped))
    assert run(cfg) == 0 and "[checkpoint] unchanged, skipped" in capsys.readouterr().out
    assert run(cfg, "--verify") == 0
    text = capsys.readouterr().out
    assert f"{weights}: contents changed since the build (sha256 differs)" in text and "[checkpoint] done" in text
    assert weights.read_bytes() == good
    assert run(cfg, "--verify") == 0 and "[checkpoint] unchanged, skipped" in capsys.readouterr().out
