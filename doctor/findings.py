"""What the doctor reports: findings (check, severity, message, evidence, fix), the measured figures, exit codes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
EXIT_OK, EXIT_FOUND, EXIT_UNUSABLE = 0, 1, 2


class UnusableInput(ValueError):
    """The target or head cannot be read at all (exit 2); the message says what to give instead."""


@dataclass
class Finding:
    check: str  # e.g. "d2t", "captured_layers", "rope", "tokenizer", "loader:eagle-repo"
    severity: Severity  # error / warning: something is wrong (exit 1); info: an observation
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None

    def line(self) -> str:
        fix = f"\n      fix: {self.fix}" if self.fix else ""
        return f"  [{self.severity}] {self.check}: {self.message}{fix}"


@dataclass
class Report:
    target: str
    head: str
    draft_type: str = ""
    layout: str = ""
    engine: str = ""
    findings: list[Finding] = field(default_factory=list)
    compatibility: dict[str, str] = field(default_factory=dict)  # engine -> "loads as is" / what goes wrong
    measured: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, findings: list[Finding]) -> None:
        self.findings.extend(findings)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != "info"]

    @property
    def exit_code(self) -> int:
        return EXIT_FOUND if self.problems else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")
        tmp.replace(path)

    def text(self) -> str:
        out = [
            f"head {self.head}: {self.draft_type} head, layout {self.layout}; target {self.target}; "
            f"engine {self.engine}"
        ]
        out.append("where it loads as it is:")
        out += [f"  {eng:<12} {what}" for eng, what in self.compatibility.items()]
        out.append("findings:" if self.findings else "findings: none")
        order = {"error": 0, "warning": 1, "info": 2}
        out += [f.line() for f in sorted(self.findings, key=lambda f: order[f.severity])]
        m = self.measured
        if m.get("baseline"):
            b = m["baseline"]
            out.append(f"measured: tau {b['tau']:.3f}, acceptance per draft position {b['p_by_position']} "
                       f"({b['prompts']} prompts, {b['steps']} steps)")
            h = m.get("healthy_reference")
            if h:
                out.append(f"  a healthy head for comparison ({h['head']}, {h['size']}): tau {h['tau']:.3f}, "
                           f"acceptance per draft position {h['p_by_position']}")
        for e in m.get("experiments", []):
            if "error" in e:
                out.append(f"  experiment {e['name']}: failed ({e['error']})")
                continue
            out.append(f"  experiment {e['name']}: tau {e['tau']:.3f}, p1 {e['p_by_position'][0]:.3f}  ({e['what']})")
        verdict = "no problems found" if not self.problems else f"{len(self.problems)} problem(s) found"
        out.append(f"{verdict} in {self.seconds:.1f} s")
        return "\n".join(out)
