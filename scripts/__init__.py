"""The user-facing programs that run a served or built deployment end to end: the demo (`eagle-demo`), the
concurrency sweep, the reliability and hardening runs, the genai-perf check and the GPU benchmark recipe. Each is
an installed command ([project.scripts] in pyproject.toml) and also runs as `python scripts/NAME.py`."""
