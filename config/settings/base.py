from config.env import BASE_DIR, VAR_DIR, env

SECRET_KEY = env("SECRET_KEY", default="dev-insecure-secret-key-change-me")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Public base URL used in status links and e-mails.
PUBLIC_BASE_URL = env("PUBLIC_BASE_URL", default="http://127.0.0.1:8000")
# Where "pay again" sends a customer; {purchase_id} is substituted.
STOREFRONT_CHECKOUT_URL = env(
    "STOREFRONT_CHECKOUT_URL", default="http://127.0.0.1:8000/demo-checkout/{purchase_id}"
)
SUPPORT_CONTACT = env("SUPPORT_CONTACT", default="support@verity.example")
# The shop's name as buyers know it, shown on the customer status page.
SHOP_NAME = env("SHOP_NAME", default="Verity demo shop")
# A stale or missing CSRF token gets Verity's own page (nothing changed; reload).
CSRF_FAILURE_VIEW = "support.web.csrf_failure"

INSTALLED_APPS = [
    "support.apps.VerityAdminConfig",  # django.contrib.admin behind the lockout
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served by Verity itself (no CDN)
    "payments",
    "webhooks",
    "recovery",
    "support",
    "audit",
    "agents",
    "acp",
    "events",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # /static/ (API docs assets) under gunicorn
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The API's two hot reads answered here, before the middleware below, which an API-key
    # request never uses (payments.api.fast_path); every answer keeps the checks and
    # headers of the middleware above.
    "payments.api.fast_path.FastPathMiddleware",
    # The provider's webhook, likewise (config.early_webhook): a cookie-less signed POST.
    "config.early_webhook.EarlyWebhookMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "config.sessions.SessionLifetimeMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Innermost, so it sees a view's database error first: 503 + Retry-After, not 500.
    "config.db_unavailable.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Serve straight from the apps' static folders: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns when it is missing
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/console/login/"
LOGIN_REDIRECT_URL = "/console/"

SESSION_COOKIE_HTTPONLY = True
# Secure (HTTPS-only) outside development (DEBUG on); loopback test stacks set it off.
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
# Console sessions (ASVS V3.3): at most 12 h after login, 30 min idle (config.sessions).
SESSION_MAX_AGE_SECONDS = env.int("SESSION_MAX_AGE_SECONDS", default=12 * 3600)
SESSION_IDLE_SECONDS = env.int("SESSION_IDLE_SECONDS", default=30 * 60)
SESSION_COOKIE_AGE = SESSION_MAX_AGE_SECONDS
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Behind N reverse proxies that each append to X-Forwarded-For, the client address is the
# N-th entry from the right (support.web.client_ip). 0 = use REMOTE_ADDR only.
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# Production behind TLS: set these (docs/security.md, docs/configuration.md).
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https")
    if env.bool("TRUST_X_FORWARDED_PROTO", default=False)
    else None
)
# Request size limits: nothing Verity accepts is larger than this.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=256 * 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "kv": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    # Status tokens are customers' credentials: redacted from every line.
    "filters": {"status_tokens": {"()": "config.log_redaction.StatusTokenFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "kv",
            "filters": ["status_tokens"],
        }
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    # The SDK logs request lines at debug; keep it quiet so nothing sensitive leaks.
    "loggers": {"stripe": {"level": "WARNING"}},
}

# /metrics (recovery.views): a bearer token, or scrapers from these networks.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=["127.0.0.0/8", "::1/128"])
# Database figures are computed at most once per this many seconds per process.
METRICS_CACHE_SECONDS = env.float("METRICS_CACHE_SECONDS", default=5.0)
# /readyz: the broker check's timeout and how long its answer is reused (config.health).
READYZ_BROKER_TIMEOUT = env.float("READYZ_BROKER_TIMEOUT", default=0.5)
READYZ_CACHE_SECONDS = env.float("READYZ_CACHE_SECONDS", default=5.0)
