"""scripts/import-graph on a tiny made-up package: the figures issue 28 is measured by."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from scriptmodule import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import-graph"


@pytest.fixture(scope="module")
def graph_tool():
    return load_script(SCRIPT, "import_graph")


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


def test_a_backend_folder_at_any_depth_is_one_folder_and_aliases_are_not_a_second(graph_tool, tmp_path):
    pkg = _write(tmp_path / "pkg", {
        "__init__.py": "",
        "backends/__init__.py": "",
        "backends/kube/__init__.py": "",
        "backends/kube/spawner.py": "",
        "backends/kube/dev/__init__.py": "",
        "backends/kube/dev/cluster.py": "from ..spawner import x\n",
        "backends/slurm/spawner.py": "",
        "spawners/__init__.py": '"""Moved to :mod:`pkg.backends`; kept for old paths."""\n',
        "spawners/kube.py": '"""Moved to :mod:`pkg.backends.kube.spawner`."""\nfrom pkg.backends.kube import *\n',
        "slurm_tools.py": "",  # a backend's file outside its folder still counts
    })
    files = sorted(pkg.rglob("*.py"))
    assert graph_tool.backend_folders(files, pkg) == {"slurm": ["pkg/", "pkg/backends/slurm/"]}
    assert graph_tool.aliases(files, pkg) == {"pkg/spawners/": ["__init__.py", "kube.py"]}
    out = subprocess.run([sys.executable, str(SCRIPT), str(pkg)], capture_output=True, text=True, check=True).stdout
    assert "backends in more than one folder: 1\n  slurm: pkg/, pkg/backends/slurm/\n" in out
    assert "alias modules (old import paths, 'moved to ...'): 2\n  pkg/spawners/: __init__.py, kube.py" in out


def test_svg_draws_every_unit_in_its_rank_band_and_the_upward_arrows_in_red(fake, tmp_path):
    picture = tmp_path / "out" / "graph.svg"
    run = subprocess.run([sys.executable, str(SCRIPT), str(fake), "--svg", str(picture)],
                         capture_output=True, text=True, check=True)
    assert f"picture: {picture}" in run.stdout
    svg = ElementTree.parse(picture).getroot()  # well-formed XML
    ns = {"s": "http://www.w3.org/2000/svg"}
    units = {g.get("data-unit"): g for g in svg.iterfind(".//s:g[@class='unit']", ns)}
    assert set(units) == {"pkg.a", "pkg.b", "pkg.c", "pkg.hub", "pkg.kube", "pkg.spawners", "pkg"}
    assert units["pkg.hub"].find("s:text", ns).text == "hub"
    bands = {g.get("data-rank"): g for g in svg.iterfind(".//s:g[@class='rank']", ns)}
    assert set(bands) == {"core", "backends", "hub"}  # no unit of rank "jobs": no band

    def top(unit: str) -> float:
        return float(units[unit].find("s:rect", ns).get("y"))
    assert top("pkg.hub") < top("pkg.kube") < top("pkg.c") < top("pkg.a")  # hub on top, core below
    edges = {(p.get("data-from"), p.get("data-to")): p.get("class") for p in svg.iterfind(".//s:path", ns)
             if p.get("data-from")}
    assert edges[("pkg.kube", "pkg.hub")] == "edge up"  # the arrow pointing up
    assert edges[("pkg.a", "pkg.b")] == edges[("pkg.b", "pkg.a")] == "edge circle"
    assert edges[("pkg.hub", "pkg.c")] == "edge down"
    assert len(edges) == 6


def test_svg_needs_a_file_name(fake):
    run = subprocess.run([sys.executable, str(SCRIPT), str(fake), "--svg"], capture_output=True, text=True)
    assert run.returncode == 2 and "--svg needs a file name" in run.stderr


def test_refuses_a_folder_that_is_no_package(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2
    assert "is not a Python package" in run.stderr


def test_gpuspawner_has_no_file_import_circle_and_its_hub_state_and_replay_import_nothing_above(graph_tool):
    package = SCRIPT.parent.parent / "gpuspawner"
    graph, _ = graph_tool.read_package(package)
    assert [c for c in graph_tool.circles(graph) if len(c) > 1] == []
    up = graph_tool.upward(graph, "gpuspawner")
    assert [(a, b) for a, b in up if a == "gpuspawner.state" or a.startswith("gpuspawner.replay")] == []
