"""`shadow-reader` command line: replay (more commands join as they are built)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch

HF_NAME = "models--Qwen--Qwen3.5-0.8B"


def find_local_model() -> str | None:
    """A real Qwen3.5-0.8B in the Hugging Face cache ($HF_HOME or ~/.cache/huggingface), if any."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    for snap in sorted((home / "hub" / HF_NAME / "snapshots").glob("*")):
        if (snap / "config.json").is_file():
            return str(snap)
    return None


def default_model(device: str) -> str:
    """A local real 0.8B, else random:qwen3.5-0.8b on CUDA and random:tiny on the CPU."""
    return find_local_model() or ("random:qwen3.5-0.8b" if device == "cuda" else "random:tiny")


def _replay(args) -> int:
    from .chat import Renderer
    from .exact import ExactnessError
    from .model import load_model
    from .reader import Reader
    from .replay import replay_file
    from .router import load_question
    from .tokenizer import load_tokenizer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = args.model or default_model(device)
    model = load_model(spec, device=device)
    model_dir = None if spec.startswith("random:") else spec
    tokenizer = load_tokenizer(model_dir)
    renderer = Renderer.from_model_dir(args.template_dir, template=args.template)
    reader = Reader(model, grid=args.grid, tokenizer=tokenizer)
    print(f"model {model.info.name} ({'random' if model.info.is_random else 'real'} weights, "
          f"fingerprint {model.info.fingerprint[:12]}), device {device}, grid {args.grid}, "
          f"kernels {model.kernels.name}", file=sys.stderr)
    exact_failed = None
    try:
        totals = replay_file(reader, args.session, renderer, tokenizer,
                             load_question(args.question), args.check_exact,
                             enable_thinking=False if args.no_thinking else None)
    except ExactnessError as e:
        exact_failed = str(e)
        raise
    print(json.dumps(totals.as_dict()))
    return 0 if totals.exact is not False and exact_failed is None else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="shadow-reader", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="replay a recorded session turn by turn through the reader")
    rp.add_argument("session", help="a session JSON file ({'messages': [...], 'tools': [...]})")
    rp.add_argument("--model", help="a HF model directory or random:NAME (default: a local "
                    "Qwen3.5-0.8B, else random:qwen3.5-0.8b on CUDA, random:tiny on the CPU)")
    rp.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    rp.add_argument("--grid", type=int, default=512, help="chunk length G (multiple of 64)")
    rp.add_argument("--question", help="a question JSON file (default: the 9-class router)")
    rp.add_argument("--check-exact", action="store_true",
                    help="compare the final committed state with a fresh prefill")
    rp.add_argument("--template", default="qwen3.5-27b",
                    help="the host's chat template (default: qwen3.5-27b, thinking on)")
    rp.add_argument("--template-dir", help="a model directory whose chat template the host uses")
    rp.add_argument("--no-thinking", action="store_true", help="the host runs with thinking off")
    rp.set_defaults(func=_replay)
    return ap


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"shadow-reader: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
