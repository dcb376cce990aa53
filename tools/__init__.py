"""Development servers and tooling: never imported by Verity's runtime packages, and left
out of the production image (the Dockerfile's `production` stage).

- `localstripe_server` — the Stripe sandbox (`make run`, `tests.stack`, compose's sandbox);
- `x402_chain`, `x402_facilitator` — the x402 rail's throwaway chain and facilitator;
- `progress` — the progress line of long commands (soak, bench, fuzz, drills);
- `drill` — every fault drill against the configured test-mode provider (`make drill`).

Run them as `python -m tools.<name>` from the checkout. `tools/chain/` holds the npm
packages the chain runs (anvil, Circle's USDC build artifacts); `tools/x402_fetch/` the x402
project's npm client (`@x402/fetch`), which tests/x402/test_npm_client_buys.py runs against
Verity unmodified.
"""
