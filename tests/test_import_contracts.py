"""The architecture's import rules, checked on every fast run.

1. import-linter's contracts from pyproject.toml (`[tool.importlinter]`): the domain never imports
   the Dagster layer, the domain's layers point down, source adapters do not import each other.
2. Every module of `lakehouse` is in a layer of the `domain-layers` contract, as itself or as part
   of a package listed whole; a package split over layers is itself in none, and its `__init__`
   may import only its own modules.
3. No import cycle at all between the modules of `lakehouse` (imports under TYPE_CHECKING and
   inside functions count). import-linter cannot say that: `acyclic_siblings` compares sibling
   *packages*, and a package may hold modules of several levels (lakehouse.lineage.graph sits low,
   lakehouse.lineage.recovery above the source adapters) without any module cycle. So the module
   graph is built with grimp (import-linter's own graph library) and searched with networkx.

The checks are shown to fail on a small package made for the purpose.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import grimp
import networkx as nx
import pytest
from importlinter import configuration
from importlinter.application import use_cases
from importlinter.application.user_options import UserOptions
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import registry

ROOT = Path(__file__).resolve().parents[1]

configuration.configure()


def broken_contracts(options: UserOptions) -> list[str]:
    """The names of the contracts the code breaks (and any contract that could not be checked)."""
    # what `lint-imports` does first; its own function for it is private and was renamed in 2.17
    for name, contract_type in (("forbidden", ForbiddenContract), ("layers", LayersContract),
                                ("independence", IndependenceContract)):
        registry.register(contract_type, name)
    report = use_cases.create_report(options, cache_dir=None)
    broken = [contract.name for contract, check in report.get_contracts_and_checks() if not check.kept]
    return broken + [f"{name} (invalid: {exc})" for name, exc in report.invalid_contract_options.items()]


#: every package of the repository's code (pyproject's [tool.setuptools.packages.find])
PACKAGES = ("lakehouse", "lakehouse_assets", "resources", "sensors", "schedules")


def import_cycles(*packages: str) -> list[str]:
    """Every import cycle among the packages' modules, one line each: the modules of the cycle
    in order, with the line of each import."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    g = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module:
                g.add_edge(module, imported)
    found = []
    for component in nx.strongly_connected_components(g):
        if len(component) < 2:
            continue
        cycle = nx.find_cycle(g.subgraph(component))
        hops = []
        for importer, imported in cycle:
            lines = sorted({d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)})
            hops.append(f"{importer} (l.{','.join(map(str, lines))})")
        found.append(" -> ".join([*hops, cycle[0][0]]) + f"   [{len(component)} modules in the cycle group]")
    return sorted(found)


def test_the_import_linter_contracts_in_pyproject_hold():
    options = use_cases.read_user_options(str(ROOT / "pyproject.toml"))
    assert options.contracts_options, "pyproject.toml has no [[tool.importlinter.contracts]]"
    broken = broken_contracts(options)
    assert not broken, f"broken import contracts: {broken}. Run `lint-imports` to see the import chains."


def unlayered(package: str, layers: list[str]) -> list[str]:
    """The modules of `package` in no layer: neither they nor a package above them is listed in
    `layers` (import-linter's layer strings, "a : b" or "a | b"), and they are not a package split
    over layers whose `__init__` imports only its own modules."""
    listed = {name.strip().strip("()") for layer in layers for name in layer.replace("|", ":").split(":")}
    graph = grimp.build_graph(package, cache_dir=None)
    missing = []
    for module in sorted(graph.modules - {package}):
        parts = module.split(".")
        if any(".".join(parts[:i]) in listed for i in range(2, len(parts) + 1)):
            continue
        split_package = graph.find_children(module) and all(  # its modules are checked one by one
            imported.startswith(module + ".") for imported in graph.find_modules_directly_imported_by(module))
        if split_package:
            continue
        missing.append(module)
    return missing


def domain_layers() -> list[str]:
    options = use_cases.read_user_options(str(ROOT / "pyproject.toml"))
    (contract,) = [c for c in options.contracts_options if c["id"] == "domain-layers"]
    return contract["layers"]


def test_every_module_of_the_domain_is_in_a_layer():
    missing = unlayered("lakehouse", domain_layers())
    assert not missing, ("modules in no layer of pyproject's domain-layers contract (put each in the "
                         f"lowest layer above everything it imports): {missing}")


def test_no_import_cycles_anywhere_in_the_repository():
    cycles = import_cycles(*PACKAGES)
    assert not cycles, "import cycles (break them: the lower module must not know the higher):\n" + (
        "\n".join(cycles))


# ------------------------------------------------------------------ the checks can fail


@pytest.fixture
def bad_package(tmp_path, monkeypatch):
    """`badpkg`: low imports high (a layer broken), the domain imports the 'dagster layer', and a
    cycle low -> mid -> low through a function-level import."""
    root = tmp_path / "badpkg"
    (root / "dagsterlayer").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "low.py": "def f():\n    from badpkg import mid\n    return mid\n",
        "mid.py": "from badpkg import low\n",
        "high.py": "from badpkg import mid\n",
        "domain.py": "from badpkg.dagsterlayer import assets\n",
        "dagsterlayer/__init__.py": "",
        "dagsterlayer/assets.py": "from badpkg import domain\n",
    }
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "badpkg"


def test_the_contract_check_names_each_broken_contract(bad_package):
    options = UserOptions(
        session_options={"root_packages": [bad_package]},
        contracts_options=[
            {"id": "f", "name": "domain without the dagster layer", "type": "forbidden",
             "source_modules": ["badpkg.domain"], "forbidden_modules": ["badpkg.dagsterlayer"]},
            {"id": "l", "name": "high over mid over low", "type": "layers",
             "layers": ["badpkg.high", "badpkg.mid", "badpkg.low"]},
            {"id": "i", "name": "high and domain independent", "type": "independence",
             "modules": ["badpkg.high", "badpkg.domain"]},
        ],
    )
    assert broken_contracts(options) == ["domain without the dagster layer", "high over mid over low"]


def test_the_layer_check_names_each_module_in_no_layer(bad_package):
    # badpkg.dagsterlayer's __init__ imports nothing: a package split over layers (its modules count)
    assert unlayered(bad_package, ["badpkg.high", "badpkg.mid : badpkg.low"]) == [
        "badpkg.dagsterlayer.assets", "badpkg.domain"]
    assert unlayered(bad_package, ["badpkg.high | badpkg.domain", "badpkg.mid : badpkg.low",
                                   "badpkg.dagsterlayer.assets"]) == []
    assert unlayered(bad_package, ["badpkg.dagsterlayer", "badpkg.mid : badpkg.low"]) == [
        "badpkg.domain", "badpkg.high"]


def test_the_cycle_check_finds_cycles_with_their_lines(bad_package):
    cycles = import_cycles(bad_package)
    assert len(cycles) == 2, cycles
    assert any("badpkg.low (l.2)" in c and "badpkg.mid (l.1)" in c for c in cycles), cycles
    assert any("badpkg.domain" in c and "badpkg.dagsterlayer.assets" in c for c in cycles), cycles
