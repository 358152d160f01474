"""The package's import rules (docs/architecture.md, "Import rules"), checked on the source.

Every import counts, at module level or inside a function, except those under
``if TYPE_CHECKING:`` (annotations only)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((SRC / "korch").rglob("*.py")):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _type_checking_ids(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def _imports(mod: str) -> set[str]:
    """Every module ``mod`` imports (korch's resolved to its modules; others by top name)."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    skip = _type_checking_ids(tree)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("korch"):
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name != mod:
                    out.add(name)
            else:
                out.add(name.split(".")[0])
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for m in MODULES:
        if m not in index:
            visit(m)
    return out


def test_the_checker_sees_imports():
    assert "korch.ir.graph" in GRAPH["korch.ir.interp"]
    assert "korch.kernels.registry" in GRAPH["korch.executable.build"]  # a function-level import counts too
    assert "onnxruntime" in GRAPH["korch.kernels.ort.backend"]


def test_no_import_cycles():
    assert _cycles() == []


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m.startswith("korch.ir")))
def test_ir_imports_only_the_ir(mod):
    """ir/ is the bottom of the stack: no backend, no other stage, no onnxruntime or TVM."""
    korch = {m for m in GRAPH[mod] if m.startswith("korch")}
    assert korch <= {m for m in MODULES if m.startswith("korch.ir")} | {"korch.errors"}
    assert not GRAPH[mod] & {"onnxruntime", "tvm", "torch", "triton", "openvino"}


def test_only_bench_imports_bench():
    users = sorted(
        m for m in MODULES if not m.startswith("korch.bench") and any(d.startswith("korch.bench") for d in GRAPH[m])
    )
    assert users == []


def test_only_backends_and_the_runtime_import_tvm():
    users = {m for m in MODULES if "tvm" in GRAPH[m]}
    # (bench builds TVM's own untuned model as a peer)
    allowed = ("korch.kernels.tvm", "korch.profile", "korch.tiling.calibrate", "korch.bench")
    assert all(m.startswith(allowed) for m in users), users


def test_modules_are_short():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
