"""Each app's migration chain was squashed once (the squashes keep `replaces`). A fresh
database (the squashes) and an existing one (migrated with the old chain, then with the
squashes and what follows them) must end in one schema: same tables and columns, indexes,
constraints and triggers, with none of the old raw-SQL `bench_*` indexes left."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
APPS = ("payments", "webhooks", "recovery", "support", "audit", "acp")


def _migration_facts(path: Path) -> tuple[bool, set[str]]:
    """(is a squash, the names its dependencies point at) — read from the file's AST."""
    tree = ast.parse(path.read_text())
    replaces, deps = False, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "replaces":
                replaces = True
            elif node.targets[0].id == "dependencies":
                for item in ast.walk(node.value):
                    if isinstance(item, ast.Tuple) and len(item.elts) == 2:
                        deps.add(ast.literal_eval(item.elts[1]))
    return replaces, deps


def _old_chain_packages(tmp: Path) -> dict[str, str]:
    """Copies of each app's migrations without the squashes and what depends on them: the
    chain an existing database was migrated with. Returns MIGRATION_MODULES."""
    files = {app: sorted((ROOT / app / "migrations").glob("0*.py")) for app in APPS}
    facts = {path: _migration_facts(path) for app in APPS for path in files[app]}
    newer = {path.stem for path, (is_squash, _deps) in facts.items() if is_squash}
    assert len(newer) >= 5, newer
    # and every migration that depends on a squash, directly or through another
    while True:
        more = {path.stem for path, (_s, deps) in facts.items() if deps & newer} - newer
        if not more:
            break
        newer |= more
    modules = {}
    for app in APPS:
        package = tmp / "old_chain" / f"{app}_migrations"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        for path in files[app]:
            if path.stem not in newer:
                shutil.copy(path, package / path.name)
        modules[app] = f"old_chain.{app}_migrations"
    (tmp / "old_chain" / "__init__.py").write_text("")
    return modules


def _server() -> dict:
    db = settings.DATABASES["default"]
    assert db["ENGINE"].endswith("postgresql"), "needs the stack's PostgreSQL"
    return {
        "host": db["HOST"],
        "port": db["PORT"],
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
    }


def _admin(sql: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True, **_server()) as conn:
        conn.execute(sql)


def _url(name: str) -> str:
    s = _server()
    auth = s["user"] + (f":{s['password']}" if s["password"] else "")
    return f"postgres://{auth}@{s['host']}:{s['port']}/{name}"


def _manage(
    db: str, *args: str, settings_module: str = "config.settings", pythonpath: str = ""
) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": _url(db),
        "DJANGO_SETTINGS_MODULE": settings_module,
        "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _migrate(db: str, **kwargs) -> None:
    _manage(db, "migrate", "--noinput", "-v", "0", **kwargs)


def _schema(db: str) -> dict[str, set]:
    with psycopg.connect(dbname=db, **_server()) as conn:

        def rows(sql):
            return set(conn.execute(sql).fetchall())

        return {
            "columns": rows(
                "SELECT table_name, column_name, data_type, is_nullable, "
                "column_default, character_maximum_length "
                "FROM information_schema.columns WHERE table_schema = 'public'"
            ),
            "indexes": rows(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
            ),
            "constraints": rows(
                "SELECT c.conrelid::regclass::text, c.conname, "
                "pg_get_constraintdef(c.oid) FROM pg_constraint c "
                "JOIN pg_namespace n ON n.oid = c.connamespace "
                "WHERE n.nspname = 'public'"
            ),
            "triggers": rows(
                "SELECT event_object_table, trigger_name, event_manipulation, "
                "action_statement FROM information_schema.triggers "
                "WHERE trigger_schema = 'public'"
            ),
        }


def test_a_fresh_database_and_one_migrated_with_the_old_chain_end_in_one_schema(tmp_path):
    modules = _old_chain_packages(tmp_path)
    (tmp_path / "old_chain_settings.py").write_text(
        f"from config.settings import *  # noqa: F401,F403\nMIGRATION_MODULES = {modules!r}\n"
    )
    run = uuid.uuid4().hex[:8]
    fresh, existing = f"squash_fresh_{run}", f"squash_existing_{run}"
    _admin(f"CREATE DATABASE {fresh}")
    _admin(f"CREATE DATABASE {existing}")
    try:
        # given: a database migrated with the old chain (what every deployment has today)
        _migrate(existing, settings_module="old_chain_settings", pythonpath=str(tmp_path))
        before = _schema(existing)
        assert any(name.startswith("bench_") for _t, name, _d in before["indexes"])
        # when: it is migrated with today's migrations, and a fresh one too
        _migrate(existing)
        _migrate(fresh)
        # then: the models need no migration the tree does not have, and the existing
        # database's history is consistent with the squashes
        _manage(existing, "makemigrations", "--check", "--dry-run")
        # and: one schema, and the raw-SQL indexes are gone
        old, new = _schema(existing), _schema(fresh)
        for part in new:
            assert old[part] == new[part], (
                f"{part} differ:\nonly in the old chain's: {sorted(old[part] - new[part])}\n"
                f"only in the fresh one's: {sorted(new[part] - old[part])}"
            )
        names = {name for _t, name, _d in new["indexes"]}
        assert not {n for n in names if n.startswith("bench_")}
        assert {
            "op_open_by_outcome_idx",
            "purchase_email_upper_idx",
            "steprun_attention_idx",
            "purchase_ref_prefix_idx",
        } <= names
        assert {t for _tab, t, _e, _a in new["triggers"]} >= {
            "support_auditentry_append_only",
            "support_note_append_only",
            "support_resolution_append_only",
        }
    finally:
        for db in (fresh, existing):
            _admin(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
