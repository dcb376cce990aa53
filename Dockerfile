FROM python:3.11-slim AS deps
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
# Production dependencies only (hashed lock, no test or development tools). The compose
# stack's localstripe sandbox builds the `devtools` target with REQUIREMENTS=requirements-dev.lock.
ARG REQUIREMENTS=requirements.lock
COPY requirements.lock requirements-dev.lock ./
RUN pip install --no-cache-dir --require-hashes -r ${REQUIREMENTS}

# The development sandbox (compose's localstripe): the checkout with tools/.
FROM deps AS devtools
COPY . .

# The source without the development servers and tooling (tools/), the tests and the
# benchmarks: copied from here, so no layer of the production image holds them.
FROM deps AS source
COPY . /src
RUN rm -rf /src/tools /src/tests /src/bench

# Production (the default target: the last stage).
FROM deps AS production
COPY --from=source /src /app
RUN useradd --system verity && mkdir -p var && chown verity var
USER verity
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--timeout", "30"]
