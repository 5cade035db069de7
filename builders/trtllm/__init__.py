"""What this toolkit knows about TensorRT-LLM: the supported versions and what each allows (`registry`), the one
function holding TensorRT-LLM's limits (`rules`), and the contract ledger of every name we write for TensorRT-LLM or
Triton, each cited to the upstream code that reads it (`ledger`)."""
