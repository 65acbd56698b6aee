#!/usr/bin/env bash
# Starts munged with the cluster's key, then the one Slurm daemon this container runs:
#   entrypoint.sh slurmctld | slurmd
set -euo pipefail
# The key is the cluster's shared secret: mounted at run time, never baked into the image.
key=/run/compileq-slurm/munge.key
[ -s "$key" ] || { echo "mount the cluster's munge key at $key" >&2; exit 1; }
install -o munge -g munge -m 0400 "$key" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- munged
case "${1:-}" in
slurmctld) exec slurmctld -D ;;
slurmd) exec slurmd -D ;;
*) exec "$@" ;;
esac
