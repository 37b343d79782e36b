"""scripts/import-graph on a tiny made-up package: the figures issue 28 is measured by."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import-graph"


@pytest.fixture(scope="module")
def graph_tool():
    loader = importlib.machinery.SourceFileLoader("import_graph", str(SCRIPT))
    spec = importlib.util.spec_from_loader("import_graph", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    """pkg: core a <-> b (one under TYPE_CHECKING), c on b, hub/ on c, kube/ reaching up into hub/,
    spawners/kube.py and a 501-line file."""
    return _write(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "from .a import A\nimport os\n",
        "c.py": "from . import b\n" + "x = 1\n" * 500,
        "hub/__init__.py": "",
        "hub/pages.py": "from ..c import x\nfrom pkg.hub import helpers\n",
        "hub/helpers.py": "",
        "kube/__init__.py": "",
        "kube/api.py": "def f():\n    from pkg.hub.pages import y\n",
        "spawners/__init__.py": "",
        "spawners/kube.py": "from ..kube import api\n",
    })


def test_reads_absolute_relative_lazy_and_type_checking_imports(graph_tool, fake):
    graph, files = graph_tool.read_package(fake)
    assert len(files) == 11
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.a"}  # "import os" is outside the package
    assert graph["pkg.c"] == {"pkg.b"}  # "from . import b" names the module b
    assert graph["pkg.hub.pages"] == {"pkg.c", "pkg.hub.helpers"}  # not the package pkg.hub itself
    assert graph["pkg.kube.api"] == {"pkg.hub.pages"}  # an import inside a function counts


def test_units_layers_circles_and_upward_edges(graph_tool, fake):
    graph, _ = graph_tool.read_package(fake)
    units = graph_tool.collapse(graph, lambda m: graph_tool.unit_of(m, "pkg"))
    assert units["pkg.hub"] == {"pkg.c"}
    assert units["pkg.spawners"] == {"pkg.kube"}
    assert [c for c in graph_tool.circles(units) if len(c) > 1] == [["pkg.a", "pkg.b"]]
    # spawners -> kube -> hub -> c -> (a <-> b): five layers once the circle is one node
    assert graph_tool.layers(units) == 5
    assert graph_tool.upward(units, "pkg") == [("pkg.kube", "pkg.hub")]


def test_report_names_long_files_and_spread_backends(fake):
    out = subprocess.run([sys.executable, str(SCRIPT), str(fake)], capture_output=True, text=True, check=True).stdout
    assert "units: 7 nodes, 5 layers, 6 import edges, 1 pointing up, 1 import circles" in out
    assert "circle: pkg.a <-> pkg.b" in out
    assert "up: pkg.kube -> pkg.hub" in out
    assert "files over 500 lines: 1\n    501 pkg/c.py" in out
    assert "backends in more than one folder: 1\n  kube: pkg/kube/, pkg/spawners/" in out


def test_refuses_a_folder_that_is_no_package(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2
    assert "is not a Python package" in run.stderr
