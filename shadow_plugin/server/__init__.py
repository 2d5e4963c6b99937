"""The service: the facade over the reader under the one lock (facade.Shadow), its config and
settings, metrics, history and narration, and its HTTP face (FastAPI routes and the dashboard,
`shadow-reader serve`). The shadow inside a serving engine (shadow_plugin.engine) runs the same
service without HTTP."""
