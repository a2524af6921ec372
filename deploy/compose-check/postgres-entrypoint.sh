#!/bin/sh
# The stand-in postgres image's entrypoint (see postgres.Containerfile): on first start it creates
# the cluster with POSTGRES_USER as its superuser, authenticated by POSTGRES_PASSWORD over TCP, and
# creates POSTGRES_DB; then it runs the server as the postgres user in the foreground.
set -eu

: "${POSTGRES_PASSWORD:?the postgres stand-in needs POSTGRES_PASSWORD, as the official image does}"
user="${POSTGRES_USER:-postgres}"
database="${POSTGRES_DB:-$user}"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  password_file="$(mktemp)"
  printf '%s' "$POSTGRES_PASSWORD" > "$password_file"
  chown postgres "$password_file"
  as_postgres initdb --username="$user" --pwfile="$password_file" \
    --auth-local=trust --auth-host=scram-sha-256 --pgdata="$PGDATA" >/dev/null
  rm -f "$password_file"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$database" != postgres ]; then
    # Single-user mode: no server listens while the database is created.
    echo "CREATE DATABASE \"$database\";" | as_postgres postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "postgres stand-in: created the cluster, user $user and database $database"
fi

if [ "${1:-}" = postgres ]; then
  shift
  exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -c listen_addresses='*' "$@"
fi
exec "$@"
