"""Start-up refusals (issue 25 #8, issue 15): settings that would be unsafe in production
stop the process at import, with a message naming the variable to set. Development is
DEBUG on (`make run`, compose); the test stack sets its own key and mail backend."""
from django.core.exceptions import ImproperlyConfigured

from .base import DEBUG, SECRET_KEY
from .provider import STRIPE_API_BASE, STRIPE_API_KEY
from .queue import EMAIL_BACKEND

DEFAULT_SECRET_KEY = "dev-insecure-secret-key-change-me"
CONSOLE_EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"


def refusals(*, debug: bool, secret_key: str, stripe_api_key: str,
             stripe_api_base: str | None, email_backend: str) -> list[str]:
    found = []
    if not debug and (not secret_key or secret_key == DEFAULT_SECRET_KEY):
        found.append("SECRET_KEY is the development default and DEBUG is off: set SECRET_KEY "
                     "to a long random value")
    if stripe_api_key.startswith(("sk_live", "rk_live")) and stripe_api_base \
            and not stripe_api_base.startswith("https://"):
        found.append(f"a live STRIPE_API_KEY would be sent to {stripe_api_base!r} without "
                     "TLS: set STRIPE_API_BASE empty (api.stripe.com) or to an https:// URL")
    if not debug and email_backend == CONSOLE_EMAIL_BACKEND:
        found.append("EMAIL_BACKEND is the console backend and DEBUG is off: customers would "
                     "never receive their e-mails (and the worker's output would hold their "
                     "addresses and status links); set EMAIL_BACKEND (and EMAIL_HOST…)")
    return found


_refused = refusals(debug=DEBUG, secret_key=SECRET_KEY, stripe_api_key=STRIPE_API_KEY,
                    stripe_api_base=STRIPE_API_BASE, email_backend=EMAIL_BACKEND)
if _refused:
    raise ImproperlyConfigured("Verity refuses to start: " + "; ".join(_refused))
