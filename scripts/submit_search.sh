#!/usr/bin/env bash
# Submit `mpplan search CONFIG` to a Ray cluster as a Ray job; its log lines show in `ray job logs`.
#
#   RAY_ADDRESS=http://head:8265 scripts/submit_search.sh configs/search.yaml [--out /shared/runs/x] [--resume]
#
# Run it from the folder to ship (usually the repository root): `--working-dir .` uploads it, and
# CONFIG and relative paths in it are read there.  The job's working folder is temporary on the
# cluster, so give `--out` a folder every node can reach (shared storage) to keep the results, and
# install mpplan on the cluster's nodes (the job runs the `mpplan` command).  Extra arguments go to
# `mpplan search` as they are.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: $0 CONFIG [mpplan search options...]" >&2
    exit 2
fi
config="$1"
shift
if [[ ! -f "$config" ]]; then
    echo "$0: $config: file not found (run from the folder that holds it)" >&2
    exit 2
fi

exec ray job submit --working-dir . -- mpplan search "$config" --address auto "$@"
