FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
# Production dependencies only (hashed lock, no test or development tools). The compose
# stack's localstripe sandbox builds with REQUIREMENTS=requirements-dev.lock.
ARG REQUIREMENTS=requirements.lock
COPY requirements.lock requirements-dev.lock ./
RUN pip install --no-cache-dir --require-hashes -r ${REQUIREMENTS}
COPY . .
RUN useradd --system verity && mkdir -p var && chown verity var
USER verity
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--timeout", "30"]
