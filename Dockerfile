# syntax=docker/dockerfile:1
# Build the wheel in one stage, install only the wheel in a slim final image.

FROM python:3.12.8-slim-bookworm AS build
WORKDIR /src
RUN pip install --no-cache-dir build==1.2.2
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m build --wheel --outdir /dist

FROM python:3.12.8-slim-bookworm
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="Transactional outbox relays and the OutboxTopic controller" \
      org.opencontainers.image.source="https://github.com/outbox-relay/outbox-relay" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /dist/*.whl /tmp/
COPY constraints.txt /tmp/
# What the image runs (relays with every handler kind and tracing, the controller, psycopg's
# binary build) and no embedded PostgreSQL: pods use OUTBOX_DATABASE_URL. Every
# dependency at the version constraints.txt pins.
RUN pip install --no-cache-dir -c /tmp/constraints.txt \
        "$(ls /tmp/*.whl)[relay,mail,webhook,nats,amqp,redis,k8s,ui,otel,binary]" \
    && rm -f /tmp/*.whl /tmp/constraints.txt \
    && groupadd --system --gid 10001 outbox \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin outbox
USER 10001:10001
WORKDIR /tmp
EXPOSE 9090
ENTRYPOINT ["outbox"]
CMD ["relay"]
