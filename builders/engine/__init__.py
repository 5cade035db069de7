"""Engine stage: trtllm-build argv (engine flow), LLM API YAML (PyTorch flow), reference.json (reference engine)."""
