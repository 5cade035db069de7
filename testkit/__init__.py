"""What the tests and the benchmarks share: tiny random models and the mimic pair (`tiny_models`), real Triton
servers on tiny builds and their measurement helpers (`triton_servers`, `triton_build`, `triton_requests`), and the
trivial echo model (`echo_repo`). No product module imports it (pyproject.toml's import-linter contracts)."""
