"""A status is compared with its enum member, never with a string literal.

The vocabularies in `payments/enums.py` are `TextChoices` (str enums), so `op.outcome ==
Outcome.SUCCEEDED` behaves exactly as `op.outcome == "succeeded"`; but only the member can be
found with "find usages", renamed, or checked against the enum. This scan fails when runtime
code compares a field named like a vocabulary (outcome, status, kind, grade, ...) with a
literal that is one of that vocabulary's values: `x.outcome == "unknown"`,
`x.status in ("paid", ...)`, `filter(outcome="failed")`, `outcome__in=("unknown", ...)`.
Provider vocabulary (a Stripe PaymentIntent's `status`) is not one of Verity's values and
so is not flagged.
"""

import ast
from pathlib import Path

from payments import enums

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("payments", "recovery", "webhooks", "support", "agents", "acp", "audit")

# The field name a comparison reads -> the enums whose values it holds.
FIELDS = {
    "outcome": (enums.Outcome,),
    "status": (enums.PurchaseStatus, enums.DisputeStatus),
    "kind": (enums.OperationKind,),
    "result": (enums.Classification,),
    "classification": (enums.Classification,),
    "grade": (enums.Grade,),
    "verification": (enums.Verification,),
    "stage": (enums.Stage,),
    "state": (enums.HoldState,),
    "rail": (enums.Rail,),
    "origin": (enums.Origin,),
    "reason": (enums.Reason,),
    "purpose": (enums.CallPurpose,),
    "step": (enums.CallStep,),
}


def _values(field: str) -> set[str]:
    return {str(m.value) for enum in FIELDS[field] for m in enum if m.value}


def _field(node) -> str | None:
    """The vocabulary field an expression reads (`op.outcome`, `outcome`, `op.purchase.status`)."""
    name = (
        node.attr
        if isinstance(node, ast.Attribute)
        else (node.id if isinstance(node, ast.Name) else None)
    )
    if name is None:
        return None
    name = name.lstrip("_")
    for field in FIELDS:
        if name == field or name.endswith("_" + field):
            return field
    return None


def _literals(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


# ORM lookups, where a keyword argument is a comparison (`filter(outcome="failed")`).
LOOKUPS = {"filter", "exclude", "get", "Q", "When"}


def _called(func) -> str | None:
    return (
        func.attr
        if isinstance(func, ast.Attribute)
        else (func.id if isinstance(func, ast.Name) else None)
    )


def _kwarg_field(name: str) -> str | None:
    base = name.split("__")
    # `outcome`, `outcome__in`, `operation__outcome__in`, `purchase__status`
    for part in reversed(base):
        if part in FIELDS:
            return part
    return None


def literal_comparisons(source: str, filename: str = "<src>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for a, b in zip(sides, sides[1:], strict=False):
                for expr, lit in ((a, b), (b, a)):
                    field = _field(expr)
                    if field and set(_literals(lit)) & _values(field):
                        found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and _called(node.func) in LOOKUPS:
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                field = _kwarg_field(kw.arg)
                if field and set(_literals(kw.value)) & _values(field):
                    found.append(f"{filename}:{node.lineno}: {kw.arg}={ast.unparse(kw.value)}")
    return found


def runtime_files():
    for package in RUNTIME:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_the_scan_sees_each_form_of_a_literal_comparison():
    src = (
        'a = op.outcome == "succeeded"\nb = p.status in ("paid", "completed")\n'
        'c = Q(outcome__in=("unknown",))\nd = Op.objects.filter(kind="refund")\n'
        'g = dispatch(step="confirm")\n'
        'e = intent.status == "requires_capture"\nf = op.outcome == Outcome.SUCCEEDED\n'
    )
    found = literal_comparisons(src)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4"], found


def test_runtime_code_compares_statuses_with_enum_members():
    found = []
    for path in runtime_files():
        found += literal_comparisons(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, (
        "compare with the enum member from payments/enums.py, not a string "
        "literal:\n" + "\n".join(found)
    )
