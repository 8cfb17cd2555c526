"""One settings model (issue 38 item 4), fast (no Spark, no server).

* no production module but lakehouse/settings.py reads the environment, and none writes it (each
  exception is listed with its reason); the scanner is tested on snippets first;
* every LAKEHOUSE_* name production code mentions is a field of `PlatformSettings` (or a variable the
  platform sets for a heal command);
* README.md's table is the one the model generates;
* secrets never reach repr(), str() or model_dump_json();
* the Spark conf the Dagster UI shows on the `pyspark` resource is the conf a run's session is built from.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dagster as dg
import pytest

from lakehouse import settings as model
from lakehouse.settings import PlatformSettings, current, load_settings

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("lakehouse", "lakehouse_assets", "resources", "sensors", "schedules")

#: modules that may still touch os.environ, and why (none of them reads a LAKEHOUSE_* variable)
READS_ALLOWED = {
    "lakehouse/control/healing.py": "passes the process's environment on to a heal command it runs",
}
#: modules that write the environment: none (the Dagster instance opens by path, lakehouse.orchestration.instance)
WRITES_ALLOWED: set[str] = set()


def environ_uses(source: str) -> tuple[list[str], list[str]]:
    """(reads, writes) of the environment in `source`: `os.environ` / `environ` / `os.getenv` /
    `os.putenv` / `os.unsetenv`, each as 'line: text'. A write is an assignment or deletion of an
    item, or a call of setdefault/update/pop/clear/putenv/unsetenv."""
    tree = ast.parse(source)
    lines = source.splitlines()
    environ_names = {"environ"} if any(isinstance(n, ast.ImportFrom) and n.module == "os"
                                       and any(a.name == "environ" for a in n.names)
                                       for n in ast.walk(tree)) else set()

    def is_environ(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
                and node.value.id == "os":
            return True
        return isinstance(node, ast.Name) and node.id in environ_names

    reads, writes = [], []
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if not hasattr(node, "lineno"):
            continue
        where = f"{node.lineno}: {lines[node.lineno - 1].strip()}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("getenv", "putenv", "unsetenv", "getenvb"):
            (reads if node.attr.startswith("getenv") else writes).append(where)
        elif is_environ(node):
            parent = parents.get(node)
            if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del)):
                writes.append(where)
            elif isinstance(parent, ast.Attribute) and parent.attr in ("setdefault", "update", "pop", "popitem",
                                                                        "clear"):
                writes.append(where)
            else:
                reads.append(where)
    by_line = lambda found: sorted(found, key=lambda w: int(w.split(":", 1)[0]))  # noqa: E731
    return by_line(reads), by_line(writes)


def test_the_scanner_finds_reads_and_writes():
    assert environ_uses("import os\nx = os.environ.get('LAKEHOUSE_X')\ny = os.getenv('A')\n")[0] == [
        "2: x = os.environ.get('LAKEHOUSE_X')", "3: y = os.getenv('A')"]
    assert environ_uses("from os import environ\nv = environ['A']\n") == (["2: v = environ['A']"], [])
    assert environ_uses("import os\nenv = {**os.environ}\n")[0] == ["2: env = {**os.environ}"]
    _, writes = environ_uses("import os\nos.environ['A'] = '1'\nos.environ.setdefault('B', '2')\n"
                             "os.putenv('C', '3')\ndel os.environ['A']\nos.environ.update(D='4')\n")
    assert len(writes) == 5
    assert environ_uses("import os\nos.path.join('a', 'b')\nenviron = {}\nenviron['x'] = 1\n") == ([], [])


def _production_files():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text()


def test_only_the_settings_module_reads_the_environment_and_nothing_writes_it():
    reads, writes = [], []
    for rel, text in _production_files():
        if rel == "lakehouse/settings.py":
            continue
        r, w = environ_uses(text)
        reads += [f"{rel}:{x}" for x in r if rel not in READS_ALLOWED]
        writes += [f"{rel}:{x}" for x in w if rel not in WRITES_ALLOWED]
        if rel in READS_ALLOWED:  # an allowed module reads no LAKEHOUSE_* variable
            reads += [f"{rel}:{x}" for x in r if "LAKEHOUSE_" in x or "_ENV" in x]
    assert reads == [], "read settings through lakehouse.settings (a field of PlatformSettings)"
    assert writes == [], "the platform never writes the environment"


def test_every_lakehouse_variable_in_production_code_is_a_field():
    fields = {model.env_name(name) for name in PlatformSettings.model_fields}
    known = fields | set(model.HEAL_COMMAND_ENV) | {model.SPARK_CONF_PREFIX, "LAKEHOUSE_HEAL_"}
    seen: dict[str, str] = {}
    for rel, text in _production_files():
        for name in re.findall(r"(?<![A-Z0-9_])LAKEHOUSE_[A-Z0-9_]+", text):  # not seed 000's ENABLE_LAKEHOUSE_LOAD
            seen.setdefault(name, rel)
    unknown = {name: rel for name, rel in seen.items()
               if name not in known and not name.startswith(model.SPARK_CONF_PREFIX)}
    assert unknown == {}, "add each variable to lakehouse.settings.PlatformSettings"
    assert len(fields) == len(PlatformSettings.model_fields)  # no two fields share a variable
    assert {"LAKEHOUSE_HOME", "LAKEHOUSE_CATALOG_PASSWORD", "LAKEHOUSE_API_TOKEN", "LAKEHOUSE_FAULTS",
            "DATAHUB_GMS_TOKEN", "LAKEHOUSE_SPARK_WARMUP"} <= fields


def test_the_readme_table_is_generated_from_the_model():
    readme = (REPO / "README.md").read_text()
    start, end = model.README_MARKERS
    assert start in readme and end in readme
    assert readme == model.replace_table(readme), "run: lakehouse settings reference --write README.md"
    for name in PlatformSettings.model_fields:
        assert f"`{model.env_name(name)}`" in readme


SECRETS = {"LAKEHOUSE_CATALOG_PASSWORD": "cat-pw-6f1e", "LAKEHOUSE_API_TOKEN": "api-tok-93ab",
           "DATAHUB_GMS_TOKEN": "dh-tok-27cd"}


def test_secrets_never_reach_repr_str_or_json(monkeypatch, tmp_path):
    for var, value in SECRETS.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.setenv("LAKEHOUSE_CONTROL_DB_URL", "postgresql://lake:ctl-pw-55aa@db:5432/control")
    s = load_settings()
    secret_fields = [n for n, f in PlatformSettings.model_fields.items() if "SecretStr" in str(f.annotation)]
    assert set(secret_fields) == {"catalog_password", "api_token", "datahub_gms_token", "lh_load_token"}
    shown = repr(s) + str(s) + s.model_dump_json() + repr(s.model_dump())
    for value in (*SECRETS.values(), "ctl-pw-55aa"):
        assert value not in shown
    assert s.catalog_credentials() == (None, "cat-pw-6f1e")  # used where needed, on purpose
    assert s.api_token.get_secret_value() == "api-tok-93ab"


def test_variables_keep_their_names_and_the_defaults_follow_home(monkeypatch, tmp_path):
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_LANDING_DIR",
                "LAKEHOUSE_STAGING_DIR", "LAKEHOUSE_SPARK_WARMUP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.setenv("LAKEHOUSE_SPARK_DRIVER_MEMORY", "3g")
    monkeypatch.setenv("LAKEHOUSE_SPARK_CONF__spark.executor.cores", "3")
    monkeypatch.setenv("LAKEHOUSE_DATAHUB", "off")
    monkeypatch.setenv("LAKEHOUSE_SPARK_UI", "")  # empty: the default
    s = load_settings()
    assert (s.home, s.control_db_url, s.warehouse) == (tmp_path, f"sqlite:///{tmp_path / 'control.db'}",
                                                       f"file://{tmp_path / 'warehouse'}")
    assert (s.landing_dir, s.staging_dir) == (tmp_path / "landing", tmp_path / "staging")
    assert (s.spark_driver_memory, s.spark_conf["spark.executor.cores"], s.datahub, s.spark_ui, s.spark_warmup) == (
        "3g", "3", False, False, True)
    with pytest.raises(ValueError, match="unknown setting"):
        load_settings({"control_db": "sqlite://"})


def test_a_section_is_read_again_only_when_its_variables_change(monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_FAULTS", raising=False)
    first = current(model.FaultHooks)
    assert current(model.FaultHooks) is first and not first.any
    monkeypatch.setenv("LAKEHOUSE_FAULTS", "oom:rows_above=5")
    assert current(model.FaultHooks).faults == "oom:rows_above=5"


def test_the_spark_conf_the_ui_shows_is_the_conf_the_run_uses(monkeypatch, tmp_path):
    """The `pyspark` resource's `spark_config` (what the UI shows, without credentials) is what the
    session is built from, a run's config change included; the credentials come from the settings."""
    from lakehouse.runtime import spark as sparkmod
    from resources.lakehouse import LakehouseResource
    from resources.spark import spark_resource

    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.setenv("LAKEHOUSE_CATALOG_USER", "lake")
    monkeypatch.setenv("LAKEHOUSE_CATALOG_PASSWORD", "cat-pw-6f1e")
    sparkmod.configure_session(None)  # no run's conf left over in this process
    lakehouse = LakehouseResource()
    settings = lakehouse.settings()
    shown = spark_resource(lakehouse).spark_config
    assert "cat-pw-6f1e" not in repr(shown) and not any("jdbc.user" in k for k in shown)
    assert sparkmod.session_conf(settings) == sparkmod.spark_conf(settings)  # no run: the settings' conf
    edited = {**shown, "spark.sql.shuffle.partitions": "3"}  # a run's config changes one setting
    res = spark_resource(lakehouse).model_copy(update={"spark_config": edited})
    context = dg.build_init_resource_context()
    res.setup_for_execution(context)
    try:
        used = sparkmod.session_conf(settings)
        cat = f"spark.sql.catalog.{settings.catalog_name}"
        assert used == {**edited, f"{cat}.jdbc.user": "lake", f"{cat}.jdbc.password": "cat-pw-6f1e"}
    finally:
        res.teardown_after_execution(context)
    assert sparkmod.session_conf(settings) == sparkmod.spark_conf(settings)
