"""Production code uses only public APIs of its dependencies (issue 38): no private module or name of
Dagster, PyIceberg, PySpark, PyArrow, SQLAlchemy or the standard library, and no replacing a
dependency's attributes. What has no public API lives in one shim module per dependency under
`lakehouse/compat/` (exempt here, each with a version test of its own).

Every production module is parsed with `ast` (nothing is executed) and these are reported, with file
and line:

(a) an import of a dependency's private module or name: `import dagster._core.x`,
    `from dagster._cli.job import _create_run`, `from pyspark.sql.types import _parse_datatype_string`,
    and a private module path as a string (`importlib.import_module("dagster._grpc.impl")`, preload
    lists);
(b) a private attribute reached from something imported from a dependency: `threading._shutdown()`,
    `sys._getframe(1)`, `dg.AssetsDefinition._from_node`, `SparkContext._active_spark_context`,
    `pa.lib._pandas_api` (`os._exit` is allowed: the library reference documents it);
(c) assigning (or `setattr`, `del`) an attribute of something imported from a dependency:
    `DagsterApiServer._mp_ctx = ...`, `RepositorySnap.from_def = ...`;
(d) what a static scan cannot type: a denylist of known private names of our dependencies, on any
    object (`txn._apply`, `spark._jsparkSession`, `frame._jdf`, `server._get_repo_for_origin`), and,
    in a class deriving from a dependency's class, `super()._x` and overriding a private member the
    base class has (`_convert_orm_to_iceberg`, `_connect`, `_init_session`).

The scanner is itself tested on small sources with each forbidden pattern, so it cannot pass silently.
"""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("lakehouse", "lakehouse_assets", "resources", "sensors", "schedules")
#: the one place private APIs may be used, one module per dependency, each version-tested
EXEMPT = ("lakehouse/compat/",)
#: our own top-level packages: their underscore names are ours to use
OWN = frozenset(PRODUCTION)
#: underscore names that are documented public API
PUBLIC_UNDERSCORE = {
    "_exit",  # os._exit: "Exit the process with status n, without calling cleanup handlers" (library reference)
    "_asdict", "_replace", "_fields", "_field_defaults", "_make",  # collections.namedtuple's documented API
    "_NATIVE_",  # DataHub's AssertionStdOperator symbol (acryl-datahub schema_classes), a public enum value
}
#: private names of our dependencies, flagged on any object (an AST cannot know an object's type)
DENYLIST = frozenset({
    # PyIceberg
    "_apply", "_stage", "_commit", "_clean_all_uncommitted", "_cleanup_uncommitted", "_convert_orm_to_iceberg",
    "_load_file_io", "_set_ref_snapshot", "_snapshot_producers", "_updates", "_requirements", "_do_commit",
    "_iceberg_type_filter", "_register_snapshot_producer",
    # PySpark / Py4J
    "_jvm", "_jsc", "_jsparkSession", "_jdf", "_jc", "_jconf", "_jwrite", "_jreader", "_jsqlContext", "_sc",
    "_gateway", "_active_spark_context", "_parse_datatype_string", "_to_java_column", "_to_seq",
    # dagster-pyspark
    "_init_session", "_spark_session",
    # Dagster
    "_repository_data", "_from_node", "_mp_ctx", "_get_repo_for_origin", "_get_serialized_external_repository_data",
    "_create_run", "_connect", "_initdb", "_instance", "_get_repository_data",
    # PyArrow
    "_pandas_api",
    # standard library
    "_shutdown", "_run_exitfuncs", "_getframe", "_current_frames", "_xoptions",
})

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.\w+)+$")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
        and name not in PUBLIC_UNDERSCORE


def _root_module(name: str) -> str:
    return name.split(".", 1)[0]


def _dependency(module: str | None, level: int = 0) -> bool:
    return level == 0 and bool(module) and _root_module(module) not in OWN and module != "__future__"


def _chain(node: ast.AST) -> tuple[str | None, list[str]]:
    """`a.b._c` -> ("a", ["b", "_c"]); the root is None when the chain starts at a call, a subscript..."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    attrs.reverse()
    return (node.id if isinstance(node, ast.Name) else None), attrs


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, resolve_bases: bool):
        self.path = path
        self.resolve_bases = resolve_bases
        self.found: list[str] = []
        self.imported: dict[str, str] = {}  # local name -> the dependency's dotted path it names
        self.class_bases: list[list[str]] = []  # the dependency bases of each enclosing class

    def report(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.path}:{node.lineno}: {what}")

    # (a) imports; what every name is bound to, for (b) and (c)
    def collect_imports(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if not _dependency(alias.name):
                        continue
                    if any(_private(p) for p in alias.name.split(".")):
                        self.report(node, f"import of the private module {alias.name}")
                    if alias.asname:
                        self.imported[alias.asname] = alias.name
                    else:
                        self.imported[_root_module(alias.name)] = _root_module(alias.name)
            elif isinstance(node, ast.ImportFrom) and _dependency(node.module, node.level):
                if any(_private(p) for p in node.module.split(".")):
                    self.report(node, f"import from the private module {node.module}")
                for alias in node.names:
                    if _private(alias.name):
                        self.report(node, f"import of the private name {node.module}.{alias.name}")
                    self.imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, str) and _DOTTED.match(value) and _dependency(value) \
                and any(_private(p) for p in value.split(".")[1:]):
            self.report(node, f"a private module path of a dependency as a string: {value!r}")

    # (b) and (d): attribute reads
    def visit_Attribute(self, node: ast.Attribute) -> None:
        root, attrs = _chain(node)
        if root in self.imported and any(_private(a) for a in attrs):
            self.report(node, f"private attribute of {self.imported[root]}: {root}.{'.'.join(attrs)}")
        elif node.attr in DENYLIST and not self._own_member(node):
            self.report(node, f"private name of a dependency: .{node.attr}")
        self.generic_visit(node)

    def _own_member(self, node: ast.Attribute) -> bool:
        """`self._x` / `cls._x` in a class of ours that derives from no dependency's class."""
        return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") \
            and bool(self.class_bases) and not self.class_bases[-1]

    # (c) replacing a dependency's attributes
    def _check_target(self, target: ast.AST) -> None:
        if isinstance(target, ast.Attribute):
            root, attrs = _chain(target)
            if root in self.imported:
                self.report(target, f"replaces an attribute of {self.imported[root]}: {root}.{'.'.join(attrs)}")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            root, _ = _chain(node.args[0])
            if root in self.imported:
                self.report(node, f"{func.id} on {self.imported[root]}")
        self.generic_visit(node)

    # (d) subclasses of a dependency's class
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = []
        for base in node.bases:
            root, attrs = _chain(base)
            if root in self.imported:
                bases.append(".".join([self.imported[root], *attrs]))
        if bases:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and _private(sub.attr) and isinstance(sub.value, ast.Call) \
                        and isinstance(sub.value.func, ast.Name) and sub.value.func.id == "super":
                    self.report(sub, f"super().{sub.attr} in {node.name}, a subclass of {', '.join(bases)}")
            if self.resolve_bases:
                self._overrides(node, bases)
        self.class_bases.append(bases)
        self.generic_visit(node)
        self.class_bases.pop()

    def _overrides(self, node: ast.ClassDef, bases: list[str]) -> None:
        classes = [c for c in map(_resolve, bases) if c is not None]
        for item in node.body:
            names = []
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [item.name]
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            for name in names:
                if _private(name) and any(hasattr(c, name) for c in classes):
                    self.report(item, f"{node.name}.{name} overrides a private member of {', '.join(bases)}")


def _resolve(dotted: str):
    """The class `dotted` names ("pkg.mod.Class"), or None when it cannot be imported."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj if isinstance(obj, type) else None
    return None


def scan_source(source: str, path: str = "<source>", *, resolve_bases: bool = True) -> list[str]:
    """What the guard reports for one module's source."""
    tree = ast.parse(source, filename=path)
    scanner = _Scanner(path, resolve_bases)
    scanner.collect_imports(tree)
    scanner.visit(tree)
    return scanner.found


def production_modules() -> list[Path]:
    files = []
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(EXEMPT):
                files.append(path)
    return files


def test_production_code_uses_no_private_api_of_its_dependencies():
    found = []
    for path in production_modules():
        found += scan_source(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not found, ("private APIs of dependencies in production code (use the public API, or the "
                       "dependency's shim under lakehouse/compat/):\n  " + "\n  ".join(found))


def test_the_production_modules_are_found():
    rels = {p.relative_to(ROOT).as_posix() for p in production_modules()}
    assert {"lakehouse/table/publish.py", "lakehouse/cli/app.py", "lakehouse_assets/definitions.py"} <= rels
    assert not any(r.startswith("lakehouse/compat/") for r in rels)


# --------------------------------------------------------------------------- the scanner itself

FORBIDDEN = {
    "import of a private module": "import dagster._core.storage.sql as dagster_sql",
    "from a private module": "from dagster._core.errors import DagsterError",
    "private name imported": "from pyspark.sql.types import _parse_datatype_string",
    "private name of a private module": "from dagster._cli.job import _create_run",
    "private module in a string": "import importlib\nimportlib.import_module('dagster._grpc.impl')",
    "stdlib private function": "import threading\nthreading._shutdown()",
    "stdlib private function, aliased": "import sys as system\nframe = system._getframe(1)",
    "private attribute of an imported class": "from pyspark import SparkContext\nSparkContext._active_spark_context",
    "private attribute deep in a chain": "import pyarrow as pa\npa.lib._pandas_api.have_pandas",
    "private classmethod": "import dagster as dg\ndg.AssetsDefinition._from_node(x)",
    "replacing a private attribute": "from dagster._grpc.server import DagsterApiServer\nDagsterApiServer._mp_ctx = 1",
    "replacing a public method": "from dagster import Definitions\nDefinitions.get_job_def = lambda self, n: None",
    "setattr on a dependency": "import dagster\nsetattr(dagster.Definitions, 'x', 1)",
    "assigning into a stdlib module": "import atexit\natexit.register = print",
    "denylisted name on an object": "def f(txn):\n    txn._apply((), ())",
    "denylisted Py4J access": "def f(spark):\n    return spark.sparkContext._jvm",
    "denylisted call result": "def f(p):\n    return p.spark()._jsparkSession",
    "denylisted name on self in a subclass of a dependency": textwrap.dedent("""
        from pyiceberg.table import Transaction
        class T(Transaction):
            def go(self):
                return self._apply((), ())
        """),
    "super() private call in a subclass": textwrap.dedent("""
        from pyiceberg.catalog.sql import SqlCatalog
        class C(SqlCatalog):
            def load(self, orm):
                return super()._private_thing(orm)
        """),
    "overriding a private member of the base": textwrap.dedent("""
        from pyiceberg.table import Transaction
        class T(Transaction):
            def _stage(self, updates, requirements=()):
                return self
        """),
}

ALLOWED = {
    "os._exit": "import os\nos._exit(0)",
    "our own private names": "from lakehouse.table.iceberg import _walk_parents\nfrom lakehouse import spark as s\ns._SESSION",
    "relative import": "from ._helpers import _x",
    "own helpers in a subclass of a dependency": textwrap.dedent("""
        from pyiceberg.catalog.sql import SqlCatalog
        class C(SqlCatalog):
            def _remember(self, key):
                return super().load_table(key)
        """),
    "dunder attributes": "import dagster\nprint(dagster.__version__, dagster.__name__)",
    "namedtuple API": "import collections\nP = collections.namedtuple('P', 'a')\nP._make([1])",
    "assigning to own objects": "class A:\n    pass\na = A()\na.x = 1",
    "an own method named like a dependency's private one": "class R:\n    def run(self):\n        return self._stage(1)",
    "a docstring naming a private module": '"""see pyarrow.lib._pandas_api for why"""',
}


@pytest.mark.parametrize("case", sorted(FORBIDDEN))
def test_the_scanner_reports_each_forbidden_pattern(case):
    found = scan_source(FORBIDDEN[case], "example.py")
    assert found, f"{case}: not reported"
    assert all(f.startswith("example.py:") for f in found)


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_the_scanner_allows_public_and_own_names(case):
    assert scan_source(ALLOWED[case], "example.py") == []


def test_a_report_names_the_file_and_the_line():
    found = scan_source("import threading\n\n\nthreading._shutdown()\n", "lakehouse/x.py")
    assert found == ["lakehouse/x.py:4: private attribute of threading: threading._shutdown"]
