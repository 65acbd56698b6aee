# Sourced by the scripts here: where the cluster's Redis lives, and the shared secret.
# Keep the secret out of the script; read it from a file only you can read, for example
#   openssl rand -hex 32 > ~/.compileq-secret && chmod 600 ~/.compileq-secret
export COMPILEQ_BROKER_URL=${COMPILEQ_BROKER_URL:-redis://compileq-broker.example.internal:6379/0}
export COMPILEQ_REDIS_URL=${COMPILEQ_REDIS_URL:-redis://compileq-cache.example.internal:6379/0}
export COMPILEQ_SECRET=${COMPILEQ_SECRET:-$(cat ~/.compileq-secret)}
: "${COMPILEQ_SECRET:?set COMPILEQ_SECRET (openssl rand -hex 32); clients and workers must share it}"
