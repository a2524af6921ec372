# syntax=docker/dockerfile:1.7
#
# One image with every oncepay binary; docker-compose.yml picks the binary per service.
# The build needs no database: sqlx reads the committed offline query data (.sqlx/).
# `cargo xtask compose-check` builds the runtime stage around binaries it has already built, by giving
# the name `build` a context of its own (`--build-context build=DIR`, with the binaries in DIR/out/).

FROM rust:1.95-bookworm AS build
WORKDIR /src
ENV SQLX_OFFLINE=true CARGO_TERM_COLOR=never
COPY . .
# Cache mounts keep the registry and compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
        --package oncepay-api --package oncepay-worker --package oncepay-reconciler \
        --package oncepay-simulator --package oncepay-client \
 && mkdir -p /out \
 && cp target/release/oncepay-api target/release/oncepay-worker target/release/oncepay-reconciler \
       target/release/oncepay-simulator target/release/oncepay /out/

FROM debian:bookworm-slim AS runtime
# ca-certificates for HTTPS to a real provider; curl for the health checks in docker-compose.yml.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home oncepay
COPY --from=build /out/ /usr/local/bin/
USER oncepay
ENV ONCEPAY_TELEMETRY__LOG_FORMAT=json \
    ONCEPAY_HTTP__HOST=0.0.0.0
