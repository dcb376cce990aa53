"""Build Verity's patched copy of ACP spec/2026-04-17 openapi.agentic_checkout.yaml.

Usage: python tests/acp/patch_spec.py <upstream openapi.agentic_checkout.yaml> <out>
(then copy <out> to acp/spec/ and tests/acp/). Each patch is listed at the top of <out>.
"""

import copy
import sys
import textwrap

import yaml

# The official document, unpatched, as fetched (commit c2afc86), beside this script:
# tests/acp/test_unpatched_spec.py validates Verity's answers against it.
UPSTREAM = "openapi.agentic_checkout.upstream.yaml"

# Where an answer cannot validate against the UNPATCHED document, because the document
# contradicts itself or the RFC it implements (rfcs/rfc.agentic_checkout.md at the same
# commit). Every other answer validates unpatched; tests/acp/test_unpatched_spec.py checks
# both halves (these answers fail unpatched, for this reason, and pass patched).
CONTRADICTIONS = {
    "completed_session_order": (
        "A completed session's `order`. RFC §4.1 lists `order` in the authoritative session "
        "state, §4.3 says retrieve returns that full state and §4.4 says complete MUST "
        "answer it; the schema's CheckoutSessionBase is `additionalProperties: false` "
        "without `order`, so CheckoutSession refuses it, and CheckoutSessionWithOrder "
        "(allOf Base + required `order`) admits no object at all. No shape satisfies both: "
        "Verity follows the RFC (patch 2)."
    ),
    "complete_in_progress_202": (
        "complete's 202 (`complete_in_progress`, Retry-After) when the provider's answer is "
        "lost. The document's only success is 200 CheckoutSessionWithOrder (an order "
        "Verity cannot promise), and its errors invite a new payment; the schema's own "
        "status enum has `complete_in_progress`, which no documented complete answer "
        "can carry (patch 4)."
    ),
    "retrieve_and_cancel_errors": (
        "A retrieve answered 400/401/403/429 (missing API-Version, bad key) or a cancel "
        "answered 401/404/413: RFC §3 requires API-Version and Bearer on every request, "
        "but retrieve documents only 200/404 and cancel only 200/400/405/409/422 (no "
        "`4XX`), so the answers the RFC requires are undocumented there (patch 7)."
    ),
}


def main() -> None:

    src = yaml.safe_load(open(sys.argv[1]))
    d = copy.deepcopy(src)
    S = d["components"]["schemas"]
    PATCHES = []

    # 1
    S["Item"]["properties"]["quantity"] = {
        "type": "integer",
        "minimum": 1,
        "description": "Number of units (RFC §5 Item)",
    }
    PATCHES.append(
        "Item: add `quantity` (integer >= 1). The RFC's data model (§5) gives Item "
        "`id` + `quantity`, but the schema has no quantity (additionalProperties: "
        "false), so a create/update request could not say how many."
    )
    # 2
    S["CheckoutSessionBase"]["properties"]["order"] = {"$ref": "#/components/schemas/Order"}
    PATCHES.append(
        "CheckoutSessionBase: add optional `order`. CheckoutSessionWithOrder is "
        "allOf[Base (additionalProperties: false), {required: [order]}], which no "
        "object satisfies: Base refuses the `order` the second part requires."
    )
    # 3
    pd = S["PaymentData"]
    pd["properties"]["provider"] = {
        "type": "string",
        "enum": ["stripe"],
        "description": "PSP of the delegated token (RFC example form)",
    }
    pd["properties"]["token"] = {
        "type": "string",
        "description": "Delegated payment token (spt_...)",
    }
    pd["anyOf"].append({"required": ["provider", "token"]})
    PATCHES.append(
        "PaymentData: accept `{provider: stripe, token: spt_...}` (the form the "
        "complete operation's own examples send and the issue names) beside "
        "`handler_id` + `instrument`; the schema refused its own examples."
    )
    # 4
    complete = d["paths"]["/checkout_sessions/{checkout_session_id}/complete"]["post"]
    complete["responses"]["202"] = {
        "description": "Payment outcome not known yet (status complete_in_progress): do not pay "
        "again; retrieve the session after Retry-After seconds.",
        "headers": {
            "Retry-After": {"required": True, "schema": {"type": "integer"}},
            "Idempotency-Key": {"schema": {"type": "string"}},
        },
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CheckoutSession"}}
        },
    }
    PATCHES.append(
        "complete: add a 202 answer (CheckoutSession, status `complete_in_progress`, "
        "Retry-After) for a payment whose outcome is unknown; the spec only has 200 "
        "(WithOrder: an order Verity cannot promise yet) and errors (which invite a "
        "new payment)."
    )
    # 5
    create = d["paths"]["/checkout_sessions"]["post"]
    ex = create["requestBody"]["content"]["application/json"]["examples"]
    for e in ex.values():
        v = e["value"]
        if "items" in v:
            v["line_items"] = v.pop("items")
        v.setdefault("currency", "usd")
        v.setdefault("capabilities", {})
    PATCHES.append(
        "createCheckoutSession examples: `items` renamed `line_items`, and the "
        "required `currency` and `capabilities` added (the examples did not validate)."
    )
    # 6
    ph = S["PaymentHandler"]
    ph["properties"]["display_order"] = ph.pop("display_order")
    ex = ph.pop("example", None)
    PATCHES.append(
        "PaymentHandler: `display_order` moved under `properties` (it sat beside "
        "them, so a handler carrying it was refused); its example (missing required "
        "fields) dropped."
    )
    # 8
    err4xx = {
        "description": "Client error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    d["paths"]["/checkout_sessions/{checkout_session_id}/cancel"]["post"]["responses"]["4XX"] = (
        err4xx
    )
    d["paths"]["/checkout_sessions/{checkout_session_id}"]["get"]["responses"]["4XX"] = err4xx
    PATCHES.append(
        "cancel and retrieve: add `4XX` Error answers (the other operations have them): "
        "a wrong key (401), a missing API-Version (400, RFC §3) or an unknown session "
        "(404 on cancel) had no documented answer."
    )

    # 9
    def link(op):
        return {"operationId": op, "parameters": {"checkout_session_id": "$response.body#/id"}}

    links = {
        "GetSession": link("getCheckoutSession"),
        "UpdateSession": link("updateCheckoutSession"),
        "CompleteSession": link("completeCheckoutSession"),
        "CancelSession": link("cancelCheckoutSession"),
    }
    create_ok = d["paths"]["/checkout_sessions"]["post"]["responses"]["201"]
    create_ok["links"] = links
    update_ok = d["paths"]["/checkout_sessions/{checkout_session_id}"]["post"]["responses"]["200"]
    update_ok["links"] = {k: v for k, v in links.items() if k != "UpdateSession"}
    PATCHES.append(
        "links (an addition, for stateful testing): create -> retrieve/update/complete/"
        "cancel and update -> retrieve/complete/cancel, by the session's `id`."
    )
    # 7
    d["servers"] = [{"url": "/acp"}]
    PATCHES.append("servers: `/acp` (Verity mounts the five operations under /acp/).")

    header = [
        "# Agentic Commerce Protocol, checkout API: a PATCHED copy of",
        "# agentic-commerce-protocol/agentic-commerce-protocol spec/2026-04-17/openapi/",
        "# openapi.agentic_checkout.yaml (commit c2afc86). Verity validates requests against it",
        "# (acp/spec.py) and tests run schemathesis against it. Patches:",
    ]
    for i, p in enumerate(PATCHES, 1):
        lines = textwrap.wrap(p, 84)
        header.append(f"#  {i}. {lines[0]}")
        header += [f"#     {line}" for line in lines[1:]]
    out = (
        "\n".join(header) + "\n" + yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=100)
    )
    open(sys.argv[2], "w").write(out)


if __name__ == "__main__":
    main()
