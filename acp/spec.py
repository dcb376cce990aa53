"""The patched ACP checkout OpenAPI (acp/spec/, patches listed at its top) and request
validation against its schemas: bodies are the spec's shapes, and since its objects are
`additionalProperties: false`, an unknown field is refused by name, never dropped."""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator

from payments.errors import ErrorCode

SPEC_PATH = Path(__file__).resolve().parent / "spec" / "openapi.agentic_checkout.yaml"
API_VERSION = "2026-04-17"
SUPPORTED_VERSIONS = (API_VERSION,)


@lru_cache(maxsize=1)
def spec() -> dict:
    return yaml.safe_load(SPEC_PATH.read_text())


@cache
def _validator(schema_name: str) -> Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": spec()["components"]}
    return Draft202012Validator(root)


def _path(error) -> str:
    out = "$"
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def request_errors(schema_name: str, body) -> list[tuple[str, str, str]]:
    """[(code, param, message)], the most specific first; [] when the body is valid."""
    errors = sorted(
        _validator(schema_name).iter_errors(body),
        key=lambda e: (-len(list(e.absolute_path)), e.message),
    )
    out: list[tuple[str, str, str]] = []
    for error in errors[:10]:
        if error.validator == "additionalProperties":
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            for name in extra:
                out.append(
                    (
                        ErrorCode.UNKNOWN_FIELD,
                        f"{_path(error)}.{name}",
                        f"Unknown field {name!r}: nothing was done; send only the "
                        "fields the spec defines.",
                    )
                )
        elif error.validator == "required":
            out.append((ErrorCode.MISSING, _path(error), error.message))
        else:
            # Never the value itself in the answer (it may be a token or card data).
            out.append(
                (
                    ErrorCode.INVALID,
                    _path(error),
                    f"{_path(error)} does not match the spec "
                    f"({error.validator}: {str(error.validator_value)[:80]}).",
                )
            )
    # An unknown field is named before anything else (as the REST API's strict requests).
    out.sort(key=lambda e: e[0] != ErrorCode.UNKNOWN_FIELD)
    return out
