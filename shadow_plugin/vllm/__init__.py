"""shadow-reader inside a vLLM server, and the only code of the project that imports vllm.

- `connector.ShadowConnector`: a KV connector that only observes. Its scheduler half turns
  vLLM's requests into request events (shadow_plugin.engine.follow) and ships them to its
  worker half in the connector's metadata; its worker half (rank 0) runs the shadow
  (shadow_plugin.engine.embedded.EmbeddedShadow) between the host's steps.
- `endpoint.ShadowEndpoint`: the shadow's question routes on vLLM's own server
  (shadow_plugin.server.routes), reaching the worker through `collective_rpc`.
- `general.register`: loaded in every vLLM process; installs the worker method the endpoint
  calls (`shadow_call`) and registers the connector by name.

One plugin for vLLM 0.26 through 0.33 (the versions pyproject.toml's `vllm` extra admits): vLLM
calls its connector API experimental, so what the plugin needs is probed, never read off a
version string (general.missing_features; connector.host_info).
"""
