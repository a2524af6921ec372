#!/usr/bin/env bash
# Runs Schemathesis against a running oncepay-api: every check, from the api's own /openapi.json.
#
#   ONCEPAY_API_KEY=opk_... api/tests/schemathesis/run.sh http://127.0.0.1:8080 [schemathesis run options]
#
# e.g. `--max-examples 1000` for a longer run, `--seed N` to repeat one. Installs the pinned
# Schemathesis (requirements.txt) into a virtualenv under the target directory the first time, and
# again whenever requirements.txt changes; never system-wide. PYTHON names the interpreter
# (default: python3). Exits non-zero on any failure Schemathesis finds.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
base_url="${1:?usage: ONCEPAY_API_KEY=... $0 <api base url> [schemathesis run options]}"
shift
: "${ONCEPAY_API_KEY:?set ONCEPAY_API_KEY to an API key of a tenant of that api}"

work="${CARGO_TARGET_DIR:-$root/target}/schemathesis"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
venv="$work/venv"
stamp="$venv/requirements.sha256"
wanted="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/schemathesis" || "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
    echo "schemathesis: installing the pinned requirements into $venv" >&2
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --require-virtualenv \
        -r "$here/requirements.txt"
    echo "$wanted" > "$stamp"
fi

# Schemathesis keeps its example database and reports in the working directory: keep them in target.
mkdir -p "$work/run"
cd "$work/run"
exec "$venv/bin/schemathesis" --config-file "$here/schemathesis.toml" run "$base_url/openapi.json" \
    --no-color "$@"
