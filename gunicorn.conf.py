# Loaded by gunicorn from the working directory (make run, compose, the Dockerfile):
# status tokens are redacted from its access and error logs (config/log_redaction.py).
logger_class = "config.log_redaction.RedactingGunicornLogger"
