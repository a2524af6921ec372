#!/bin/sh
# The stand-in rabbitmq image's entrypoint (see rabbitmq.Containerfile): runs the server as the
# rabbitmq user in the foreground, owning its data directory, as the official image does.
set -eu

if [ "${1:-}" = rabbitmq-server ] && [ "$(id -u)" = 0 ]; then
  chown -R rabbitmq:rabbitmq /var/lib/rabbitmq
  exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "$@"
fi
exec "$@"
