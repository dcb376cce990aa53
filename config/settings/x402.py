"""The x402 rail (docs/x402.md). Off unless X402_ENABLED: `make run`
turns it on when Node and the local chain are installed, tests.stack --x402 always."""

from config.env import env

X402_ENABLED = env.bool("X402_ENABLED", default=False)
# Set by `make run` when it starts the throwaway chain itself (the banner waits for it).
X402_LOCAL_CHAIN = env.bool("X402_LOCAL_CHAIN", default=False)
X402_FACILITATOR_URL = env("X402_FACILITATOR_URL", default="http://127.0.0.1:8402")
# Read-only chain access for reconciliation (receipts, authorizationState, logs).
X402_RPC_URL = env("X402_RPC_URL", default="http://127.0.0.1:8545")
X402_NETWORK = env("X402_NETWORK", default="eip155:31337")
X402_ASSET = env("X402_ASSET", default="")  # the USDC (FiatTokenV2_2) contract address
X402_PAY_TO = env("X402_PAY_TO", default="")  # Verity's receiving address
X402_TOKEN_NAME = env("X402_TOKEN_NAME", default="USD Coin")  # EIP-712 domain
X402_TOKEN_VERSION = env("X402_TOKEN_VERSION", default="2")
X402_DECIMALS = env.int("X402_DECIMALS", default=6)
X402_CURRENCY = env("X402_CURRENCY", default="usd")  # the quote currency the asset carries
X402_MAX_TIMEOUT_SECONDS = env.int("X402_MAX_TIMEOUT_SECONDS", default=300)
# An authorization that expires sooner than this is refused before settle (422).
X402_MIN_VALIDITY_SECONDS = env.int("X402_MIN_VALIDITY_SECONDS", default=30)
# A transfer counts as succeeded once its block has this many confirmations.
X402_CONFIRMATIONS = env.int("X402_CONFIRMATIONS", default=1)
# A succeeded payment is read again until its block is final: the RPC's `finalized` tag
# where it has one, else this many blocks deep (0: the network's confirmations floor,
# config/settings/security.py). A transfer gone by then is a discrepancy (docs/x402.md).
X402_FINALITY_BLOCKS = env.int("X402_FINALITY_BLOCKS", default=0)
X402_FINALITY_SWEEP_BATCH = env.int("X402_FINALITY_SWEEP_BATCH", default=200)
X402_FACILITATOR_TIMEOUT = env.float("X402_FACILITATOR_TIMEOUT", default=30.0)
# A hosted facilitator's credential (docs/x402.md#hosted-facilitators), one of two kinds,
# never both (config/settings/security.py refuses it). Secrets: environment only.
# - a static bearer token, for a facilitator that documents one: sent as
#   `Authorization: Bearer ...` on /supported and /settle;
X402_FACILITATOR_AUTH_TOKEN = env("X402_FACILITATOR_AUTH_TOKEN", default="")
# - a CDP API key (Coinbase's hosted facilitator): its id and secret (an EC P-256 key in
#   PEM, or a base64 Ed25519 key); Verity mints a JWT per request bound to its method, host
#   and path, valid 120 s (payments/providers/x402/auth.py).
X402_FACILITATOR_API_KEY_ID = env("X402_FACILITATOR_API_KEY_ID", default="")
X402_FACILITATOR_API_KEY_SECRET = env("X402_FACILITATOR_API_KEY_SECRET", default="")
# Where the console links a transaction hash ({tx} is replaced); empty: no link.
X402_EXPLORER_TX_URL = env("X402_EXPLORER_TX_URL", default="")
# How far back (blocks) the AuthorizationUsed log search looks; 0 = from genesis.
X402_LOG_LOOKBACK_BLOCKS = env.int("X402_LOG_LOOKBACK_BLOCKS", default=0)
# Refunds on this rail are a token transfer back from this signer: a SEPARATE refund
# account holding a small float that finance tops up (docs/runbooks/x402-refund-float.md),
# never the receiving account: the key sits in every web, worker and beat
# process, so what it can lose is bounded by the float, and the receiving account's key is
# in no setting at all (config/settings/security.py refuses a refund key whose address is
# X402_PAY_TO). Secret: from the environment only; empty = x402 refunds are refused (409).
X402_REFUND_PRIVATE_KEY = env("X402_REFUND_PRIVATE_KEY", default="")
# The refund account's balance (in whole tokens, e.g. USDC) below which finance must top it
# up: the console shows it low and the VerityX402RefundFloatLow alert fires.
X402_REFUND_LOW_BALANCE = env.float("X402_REFUND_LOW_BALANCE", default=100.0)
# How long the sender waits for the transfer's receipt before it is `awaiting_provider`.
X402_REFUND_RECEIPT_TIMEOUT = env.float("X402_REFUND_RECEIPT_TIMEOUT", default=5.0)
# x402 settle attempts per API client: each costs chain reads and the
# facilitator's gas. Past the limit: 429 with Retry-After, nothing stored. A replay of an
# authorization already stored (polling after 202) is not an attempt and never counts.
X402_SETTLE_RATE = env("X402_SETTLE_RATE", default="30/min")
