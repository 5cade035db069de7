"""The contract ledger: every name this toolkit writes for TensorRT-LLM or Triton, each cited to the upstream code
that reads it (`rows` the row type, `build` / `checkpoint` / `hf_quant` / `llmapi` / `triton` the rows per surface,
`table` gathers them and checks outputs against them), its check of a real build (`check`: `eagle-ledger-check`),
its rendering into docs/contracts.md (`docs`) and the report of the oldest readings (`report`). It sits above the
build: it reads builders.trtllm (the versions) and the stages' outputs; the build reads only its llmapi.option rows
(the names serving.extra_llm_api_options may carry: builders/build.py)."""
