from config.env import env

STRIPE_API_KEY = env("STRIPE_API_KEY", default="sk_test_verity_local")
# None = api.stripe.com; `make run`/tests point this at localstripe on loopback.
STRIPE_API_BASE = env("STRIPE_API_BASE", default="http://127.0.0.1:8420")
# Where the console links a pi_/ch_/re_ reference (support opens the provider's record).
# Test mode by default; production sets https://dashboard.stripe.com. Empty: no links.
STRIPE_DASHBOARD_URL = env("STRIPE_DASHBOARD_URL", default="https://dashboard.stripe.com/test")
STRIPE_ACCOUNT = env("STRIPE_ACCOUNT", default="")  # platform account id if known
# Several secrets allow rotation: an event signed by any of them is accepted.
STRIPE_WEBHOOK_SECRETS = env.list("STRIPE_WEBHOOK_SECRETS", default=["whsec_verity_local"])
STRIPE_WEBHOOK_TOLERANCE = env.int("STRIPE_WEBHOOK_TOLERANCE", default=300)
STRIPE_CONNECT_TIMEOUT = env.float("STRIPE_CONNECT_TIMEOUT", default=3.0)
STRIPE_READ_TIMEOUT = env.float("STRIPE_READ_TIMEOUT", default=20.0)
# Whether the provider dedupes idempotency keys (Stripe does, localstripe does not).
# Replay is only offered where it does.
STRIPE_DEDUPES_KEYS = env.bool("STRIPE_DEDUPES_KEYS", default=False)
# Where it does, a card payment is one round trip (create with confirm=true) and a lost
# answer is re-sent under the same key only while its first send is younger than the
# provider's key window minus a margin (Stripe keeps keys at least 24 h); after that,
# reading alone. The margin absorbs clock skew and the provider pruning a little early:
# a re-send after the provider forgot the key would be a second payment.
STRIPE_IDEMPOTENCY_WINDOW_SECONDS = env.int("STRIPE_IDEMPOTENCY_WINDOW_SECONDS", default=86400)
STRIPE_RESEND_MARGIN_SECONDS = env.int("STRIPE_RESEND_MARGIN_SECONDS", default=3600)
# A read by metadata (a lost answer with no provider id) lists only what the provider made
# between the operation's creation (an object cannot predate the row written before its
# request left) and the latest its recorded sends can have made one, each bound widened by
# this margin for the two clocks. Its "none" is a verdict only while the provider's clock
# (its Date header) agrees with ours within half the margin.
PROVIDER_READ_CLOCK_MARGIN_SECONDS = env.int("PROVIDER_READ_CLOCK_MARGIN_SECONDS", default=60)
# Fault drills: test-mode keys only; refused for live keys at start-up of a drill.
FAULT_DRILLS_ENABLED = env.bool("FAULT_DRILLS_ENABLED", default=True)
# Chaos (soak only): a seeded fraction of provider requests gets a random drill.
FAULT_DRILL_RANDOM_RATE = env.float("FAULT_DRILL_RANDOM_RATE", default=0.0)
FAULT_DRILL_RANDOM_SEED = env.int("FAULT_DRILL_RANDOM_SEED", default=0)
FAULT_DRILL_RANDOM_MODES = env.list(
    "FAULT_DRILL_RANDOM_MODES",
    default=[
        "drop_response_after_send",
        "timeout_before_send",
        "reset_after_write",
        "http_500",
        "http_409",
        "read_unavailable",
    ],
)
# How long the provider may take to apply a confirm it has not yet applied. A PaymentIntent
# still `requires_confirmation` after this is an unapplied write: escalated at once, and the
# console may cancel it at the provider and mark the payment failed
# (docs/console.md#cancel-at-the-provider-and-mark-failed).
PROVIDER_INFLIGHT_WINDOW_SECONDS = env.int("PROVIDER_INFLIGHT_WINDOW_SECONDS", default=60)
