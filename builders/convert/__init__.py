"""HF / SafeAILab weights -> TensorRT-LLM checkpoints (streamed, tensor by tensor).

Public API (other packages call these):
  convert_llama(hf_dir, out_dir, *, dtype, tp=1, pp=1)                         LlamaForCausalLM checkpoint
  convert_eagle(hf_dir, head_dir, out_dir, *, dtype, max_draft_len, num_eagle_layers,
                max_non_leaves_per_layer, tp=1)                                 EagleForCausalLM checkpoint
  convert_eagle3(hf_dir, head_dir, out_dir, *, dtype, tp=1, layers_to_capture)  target + normalized out/eagle3/
  write_random_head(hf_dir, out_dir, seed)                                      random SafeAILab EAGLE-1 head
Each also takes an optional `provenance=Provenance(...)`, written as the config's `eagle_deploy` key.
"""

from builders.convert.eagle import convert_eagle
from builders.convert.eagle3 import EAGLE3_DIR, convert_eagle3
from builders.convert.llama import Provenance, convert_llama
from builders.convert.random_head import write_random_head

__all__ = ["EAGLE3_DIR", "Provenance", "convert_eagle", "convert_eagle3", "convert_llama", "write_random_head"]
