"""The HTTP service: `shadow-reader serve` (FastAPI + uvicorn)."""
