"""The vLLM backend: the playground's methods served by vLLM (one OpenAI-compatible server per
method, started here or attached with ``--vllm-url``); see docs/vllm.md."""
