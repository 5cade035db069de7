"""What this toolkit knows about TensorRT-LLM beyond its version table (core/trtllm_versions.py): the one function
holding TensorRT-LLM's limits (`rules`), the architecture table (`architectures`) and the citation type (`citation`).
The contract ledger that cites every name we write lives in ledger/."""
