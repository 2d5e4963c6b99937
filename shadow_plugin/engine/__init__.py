"""The shadow inside a serving engine's process, engine-agnostic: request events followed into
session events, the per-step turnstile, the embedded service (vLLM's shim: shadow_plugin.vllm)."""
